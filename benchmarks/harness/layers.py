"""Whole layers as a user trains them (issue 19): one training step of a MinGRU or SignedMinGRU
layer of width d, forward and backward into the input and every weight from a fixed random grad
output.

* ``kernel``: ``scankit.MinGRU(d, d)`` / ``scankit.SignedMinGRU(d, d)`` on the Triton kernels
  (the commit under test);
* ``plain_eager`` / ``plain_compile``: the same layer in plain torch as users write it, eager
  and under ``torch.compile`` (inductor): ``PlainMinGRU`` (lucidrains' minGRU-pytorch:
  log-space gates, Heinsen's cumsum / logcumsumexp scan) and ``PlainSignedMinGRU`` (signed
  coefficients have no log-space form: a Hillis-Steele doubling scan, log2 T steps);
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


class _GRU(nn.Module):
    """torch.nn.GRU(d, h), batch first, its states as the output."""

    def __init__(self, d: int, h: int):
        super().__init__()
        self.gru = nn.GRU(d, h, batch_first=True)

    def forward(self, x):
        return self.gru(x)[0]


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
        return (PlainMinGRU if mixer == "MinGRU" else PlainSignedMinGRU)(d, d)
    raise ValueError(f"impl must be one of {', '.join(grid.LAYER_IMPLS)}; got {impl!r}")


def train_step(impl: str, B: int, T: int, d: int, dtype: str, device: str = "cuda", mixer: str = "MinGRU"):
    """A callable: one forward + backward of ``impl``'s ``mixer`` layer on (B, T, d) inputs, grads
    of the input and every weight from a fixed random grad output; bf16 under autocast."""
    if dtype not in grid.LAYER_DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(grid.LAYER_DTYPES)}; got {dtype!r}")
    module = layer(impl, d, mixer).to(device)
    if impl == "plain_compile":
        # compiled afresh for this one shape, as a user with fixed shapes gets it: dynamo would
        # otherwise take the earlier cells' graphs as a reason to go dynamic (a slower graph),
        # and past its recompile limit run eager under this name
        torch.compiler.reset()
    fwd = torch.compile(module) if impl == "plain_compile" else module
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
