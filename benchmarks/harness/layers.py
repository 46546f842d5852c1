"""Whole layers as a user trains them (issue 19): one training step of a minGRU-family layer
(MinGRU, SignedMinGRU, RotationMinGRU, GivensMinGRU) of width d, forward and backward into the
input and every weight from a fixed random grad output.

* ``kernel``: ``scankit.<mixer>(d, d)`` on the Triton kernels (the commit under test);
* ``plain_eager`` / ``plain_compile``: the same layer in plain torch as users write it, eager
  and under ``torch.compile`` (inductor): ``PlainMinGRU`` (lucidrains' minGRU-pytorch:
  log-space gates, Heinsen's cumsum / logcumsumexp scan), ``PlainSignedMinGRU`` (signed
  coefficients have no log-space form: a Hillis-Steele doubling scan, log2 T steps) and
  ``PlainRotationMinGRU`` / ``PlainGivensMinGRU`` (the k x k blocks' affine maps doubled the
  same way, batched matmuls);
* ``cudnn_gru``: ``torch.nn.GRU(d, d)`` (cuDNN), what users reach for first.

bf16 runs the step under ``torch.autocast`` (weights and input stay fp32), as mixed-precision
training does."""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import grid


def _log_g(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x >= 0, torch.log(F.relu(x) + 0.5), -F.softplus(-x))


class PlainMinGRU(nn.Module):
    """``scankit.MinGRU(d, h)`` in plain torch, no scankit: h_t = a_t h_{t-1} + b_t with
    log a = -softplus(k), log b = -softplus(-k) + log g(pre_h), h_0 = 0.5, scanned in log
    space by Heinsen's form (what torch.compile of a minGRU layer sees)."""

    def __init__(self, d: int, h: int):
        super().__init__()
        self.to_gate_hidden = nn.Linear(d, 2 * h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k, pre_h = self.to_gate_hidden(x).chunk(2, dim=-1)
        log_a = -F.softplus(k)
        log_b = -F.softplus(-k) + _log_g(pre_h)
        log_values = torch.cat([torch.full_like(log_b[:, :1], math.log(0.5)), log_b], dim=1)
        a_star = F.pad(torch.cumsum(log_a, dim=1), (0, 0, 1, 0))
        return torch.exp(a_star + torch.logcumsumexp(log_values - a_star, dim=1))[:, 1:]


class PlainSignedMinGRU(nn.Module):
    """``scankit.SignedMinGRU(d, h)`` in plain torch, no scankit: h_t = a_t h_{t-1} + b_t with
    a = tanh(s), b = sigmoid(zk) v from one projection [s | zk | v], h_0 = 0, by Hillis-Steele
    doubling (signed a: no log-space cumsum form)."""

    def __init__(self, d: int, h: int):
        super().__init__()
        self.proj = nn.Linear(d, 3 * h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s, zk, v = self.proj(x).chunk(3, dim=-1)
        a, b = torch.tanh(s), torch.sigmoid(zk) * v
        offset = 1
        while offset < a.shape[1]:  # (a, b) composed with the pair offset steps before
            a, b = (torch.cat([a[:, :offset], a[:, offset:] * a[:, :-offset]], dim=1),
                    torch.cat([b[:, :offset], a[:, offset:] * b[:, :-offset] + b[:, offset:]], dim=1))
            offset *= 2
        return b


class _PlainBlockMinGRU(nn.Module):
    """``scankit.RotationMinGRU(d, h)`` / ``GivensMinGRU(d, h)`` (their parameters, no decay) in
    plain torch: the k x k transitions built from the projection (``givens_matrix`` is plain torch
    too), then h_t = M_t h_{t-1} + b_t scanned by Hillis-Steele doubling of the affine maps
    (M, b), log2 T batched matmuls, from the learned h_0."""

    def __init__(self, d: int, h: int, k: int, n_params: int):
        super().__init__()
        self.k, self.n, self.hidden_size, self.n_params = k, h // k, h, n_params
        self.proj = nn.Linear(d, n_params + 2 * h)
        self.h0 = nn.Parameter(torch.zeros(h))

    def transitions(self, params: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T = x.shape[:2]
        params, zk, pre_h = self.proj(x).split([self.n_params, self.hidden_size, self.hidden_size], dim=-1)
        M = self.transitions(params)  # (B, T, n, k, k)
        b = (torch.sigmoid(zk) * pre_h).reshape(B, T, self.n, self.k, 1).to(M.dtype)
        offset = 1
        while offset < T:  # (M, b) composed with the map offset steps before: M_t M_s, M_t b_s + b_t
            M, b = (torch.cat([M[:, :offset], M[:, offset:] @ M[:, :-offset]], dim=1),
                    torch.cat([b[:, :offset], M[:, offset:] @ b[:, :-offset] + b[:, offset:]], dim=1))
            offset *= 2
        h0 = self.h0.to(M.dtype).reshape(1, 1, self.n, self.k, 1)
        return (M @ h0 + b).reshape(B, T, self.hidden_size)


class PlainRotationMinGRU(_PlainBlockMinGRU):
    """2 x 2 blocks [[cos t, -sin t s], [sin t, cos t s]], s = tanh(u), from [t | u | zk | v]."""

    def __init__(self, d: int, h: int):
        super().__init__(d, h, 2, h)

    def transitions(self, params):
        from scankit.mixers import givens_matrix  # plain torch

        theta, u = params.chunk(2, dim=-1)
        M = givens_matrix(theta[..., None, None], 2)
        return M * torch.stack([torch.ones_like(u), torch.tanh(u)], dim=-1)[..., None, :]


class PlainGivensMinGRU(_PlainBlockMinGRU):
    """8 x 8 special-orthogonal blocks, 3 rounds of brick-wall Givens rotations."""

    def __init__(self, d: int, h: int, k: int = 8, rounds: int = 3):
        self.rounds = rounds
        super().__init__(d, h, k, (h // k) * rounds * k // 2)

    def transitions(self, params):
        from scankit.mixers import givens_matrix  # plain torch

        return givens_matrix(params.reshape(*params.shape[:-1], self.n, self.rounds, self.k // 2), self.k)


class _GRU(nn.Module):
    """torch.nn.GRU(d, h), batch first, its states as the output."""

    def __init__(self, d: int, h: int):
        super().__init__()
        self.gru = nn.GRU(d, h, batch_first=True)

    def forward(self, x):
        return self.gru(x)[0]


PLAIN = {"MinGRU": PlainMinGRU, "SignedMinGRU": PlainSignedMinGRU, "RotationMinGRU": PlainRotationMinGRU,
         "GivensMinGRU": PlainGivensMinGRU}


def layer(impl: str, d: int, mixer: str = "MinGRU") -> nn.Module:
    """The ``mixer`` layer (grid.LAYER_MIXERS) of ``impl`` (grid.LAYER_IMPLS) at width d, seeded
    weights (``cudnn_gru`` is one GRU whatever the mixer)."""
    if mixer not in grid.LAYER_MIXERS:
        raise ValueError(f"mixer must be one of {', '.join(grid.LAYER_MIXERS)}; got {mixer!r}")
    torch.manual_seed(0)
    if impl == "kernel":
        import scankit

        return getattr(scankit, mixer)(d, d)
    if impl == "cudnn_gru":
        return _GRU(d, d)
    if impl in ("plain_eager", "plain_compile"):
        return PLAIN[mixer](d, d)
    raise ValueError(f"impl must be one of {', '.join(grid.LAYER_IMPLS)}; got {impl!r}")


def train_step(impl: str, B: int, T: int, d: int, dtype: str, device: str = "cuda", mixer: str = "MinGRU"):
    """A callable: one forward + backward of ``impl``'s ``mixer`` layer on (B, T, d) inputs, grads
    of the input and every weight from a fixed random grad output; bf16 under autocast."""
    return _step(layer(impl, d, mixer), impl == "plain_compile", B, T, d, dtype, device)


def stack(d: int) -> nn.Module:
    """``scankit.MinGRUStack(d)`` with one block of each of grid.STACK_MIXERS, seeded weights."""
    import scankit

    torch.manual_seed(0)
    return scankit.MinGRUStack(d, depth=len(grid.STACK_MIXERS), mixer=list(grid.STACK_MIXERS))


def stack_step(impl: str, B: int, T: int, d: int, dtype: str, device: str = "cuda"):
    """``train_step`` of the whole stack on the kernels, eagerly or compiled (grid.STACK_IMPLS)."""
    if impl not in grid.STACK_IMPLS:
        raise ValueError(f"impl must be one of {', '.join(grid.STACK_IMPLS)}; got {impl!r}")
    return _step(stack(d), impl == "kernel_compile", B, T, d, dtype, device)


def _step(module: nn.Module, compiled: bool, B: int, T: int, d: int, dtype: str, device: str):
    if dtype not in grid.LAYER_DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(grid.LAYER_DTYPES)}; got {dtype!r}")
    module = module.to(device)
    if compiled:
        # compiled afresh for this one shape, as a user with fixed shapes gets it: dynamo would
        # otherwise take the earlier cells' graphs as a reason to go dynamic (a slower graph),
        # and past its recompile limit run eager under this name
        torch.compiler.reset()
    fwd = torch.compile(module) if compiled else module
    x = torch.randn(B, T, d, device=device, requires_grad=True)
    leaves = [x, *module.parameters()]
    autocast = dict(device_type=torch.device(device).type, dtype=torch.bfloat16, enabled=dtype == "bf16")
    with torch.autocast(**autocast):  # with grad, as timed (torch.compile compiles the training graph here)
        cot = torch.randn_like(fwd(x).detach())  # contiguous, in the output's dtype

    def run():
        with torch.autocast(**autocast):
            y = fwd(x)
        return torch.autograd.grad(y, leaves, cot)

    return run
