"""The minGRU mixer family, built on the scan ops.

Every mixer maps ``x (B,T,in) -> h (B,T,H)`` with ``forward(x, h_0=None, delta_t=None)``
and advances one token with ``step(x_t (B,in), h=None, delta_t=None) -> h (B,H)``; ``None``
means the mixer's own initial state. With ``decay=True`` the transition is multiplied by
``gamma_t = exp(-lambda * delta_t)`` (learned ``lambda >= 0``; ``delta_t`` defaults to 1).

The scan runs in the dtype of the mixer's projection: under ``torch.autocast`` that is the
autocast dtype (the kernels read it and accumulate in fp32), so h comes out in it, as
``nn.GRU``'s output does; every term and h_0 is cast to it before the scan.
"""
from __future__ import annotations

import functools
import math
import types

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import dispatch, ops, reference

SCAN_OPS = ("parallel_scan_log", "linear_scan", "matrix_scan", "matrix_affine_scan")


def _cast(dtype: torch.dtype, *tensors):
    """Each tensor (or None) in ``dtype``: the scan's inputs in the projection's dtype, whatever
    dtype autocast's op lists gave the terms built from it (exp and softplus run in fp32)."""
    return tuple(None if t is None else t.to(dtype) for t in tensors)


def _scans(group):
    """The scan ops: ``scankit.ops``, or with a process group those of ``scankit.distributed``
    on it (time sharded over the group's ranks)."""
    if group is None:
        return ops
    from . import distributed
    return types.SimpleNamespace(**{name: functools.partial(getattr(distributed, name), group=group)
                                    for name in SCAN_OPS})


log_g = reference.log_g  # log of minGRU's activation g


def givens_matrix(angles: torch.Tensor, k: int) -> torch.Tensor:
    """Product ``G_{R-1} ... G_0`` of brick-wall plane rotations, as (..., k, k).

    ``angles`` is (..., R, k//2); round r rotates planes (i, (i+1) % k) for
    i = r % 2, r % 2 + 2, ... (so every row is touched once per round).
    """
    if k < 2 or k % 2:
        raise ValueError(f"block size k must be even and >= 2; got {k}")
    if angles.shape[-1] != k // 2:
        raise ValueError(f"angles must end in (R, k//2) = (R, {k // 2}); got {tuple(angles.shape)}")
    M = torch.eye(k, dtype=angles.dtype, device=angles.device).expand(*angles.shape[:-2], k, k)
    for r in range(angles.shape[-2]):
        i, j = rotation_planes(r, k)
        c, s = torch.cos(angles[..., r, :, None]), torch.sin(angles[..., r, :, None])
        Mi, Mj = M[..., i, :], M[..., j, :]
        rows = torch.cat([c * Mi - s * Mj, s * Mi + c * Mj], dim=-2)
        M = rows[..., torch.argsort(torch.cat([i, j])), :]
    return M


def rotation_planes(r: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The (i, j) row pairs rotated in round r of a k-wide brick wall."""
    i = torch.arange(r % 2, k, 2) % k
    return i, (i + 1) % k


class _Decay(nn.Module):
    """Learned time-aware decay: log gamma = -softplus(raw) * delta_t, per channel."""

    def __init__(self, channels: int):
        super().__init__()
        self.raw = nn.Parameter(torch.full((channels,), -2.0))

    def log_gamma(self, delta_t, B: int, T: int, ref: torch.Tensor) -> torch.Tensor:
        lam = F.softplus(self.raw).to(ref.dtype)
        if delta_t is None:
            return (-lam).expand(B, T, -1)
        if not isinstance(delta_t, torch.Tensor) or delta_t.numel() != B * T:
            shape = tuple(delta_t.shape) if isinstance(delta_t, torch.Tensor) else type(delta_t).__name__
            raise ValueError(f"delta_t must have shape (B, T) = ({B}, {T}); got {shape}")
        return -lam * delta_t.reshape(B, T, 1).to(device=ref.device, dtype=ref.dtype)


class _Mixer(nn.Module):
    """Shared argument checks, decay and step plumbing."""

    def __init__(self, input_size: int, hidden_size: int, decay: bool, decay_channels: int):
        super().__init__()
        if input_size < 1 or hidden_size < 1:
            raise ValueError(f"input_size and hidden_size must be >= 1; got {input_size}, {hidden_size}")
        self.input_size, self.hidden_size = input_size, hidden_size
        self.decay = _Decay(decay_channels) if decay else None

    def _check_x(self, x: torch.Tensor) -> None:
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != self.input_size or x.shape[1] < 1:
            got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"x must have shape (B, T >= 1, input_size={self.input_size}); got {got}")

    def _log_gamma(self, delta_t, x: torch.Tensor):
        if self.decay is None:
            if delta_t is not None:
                raise ValueError("delta_t was given but this mixer was built with decay=False")
            return None
        return self.decay.log_gamma(delta_t, x.shape[0], x.shape[1], x)

    @staticmethod
    def _sequences(x: torch.Tensor, cu_seqlens) -> int:
        """How many initial states the call takes: the batch, or the packed sequences."""
        if cu_seqlens is None:
            return x.shape[0]
        if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
            got = tuple(cu_seqlens.shape) if isinstance(cu_seqlens, torch.Tensor) else type(cu_seqlens).__name__
            raise ValueError(f"cu_seqlens must be a 1-D tensor of N+1 offsets, N >= 1; got {got}")
        return cu_seqlens.numel() - 1

    def _state(self, h, B: int, ref: torch.Tensor) -> torch.Tensor:
        if h is None:
            return self.initial_state(B, ref)
        if not isinstance(h, torch.Tensor) or tuple(h.shape) != (B, self.hidden_size):
            got = tuple(h.shape) if isinstance(h, torch.Tensor) else type(h).__name__
            raise ValueError(f"h_0 must have shape (B, hidden_size) = ({B}, {self.hidden_size}); got {got}")
        return h.to(ref.dtype)

    def step(self, x_t: torch.Tensor, h=None, delta_t=None) -> torch.Tensor:
        """One token: x_t (B, in), h (B, H) or None -> next h (B, H)."""
        if not isinstance(x_t, torch.Tensor) or x_t.dim() != 2:
            got = tuple(x_t.shape) if isinstance(x_t, torch.Tensor) else type(x_t).__name__
            raise ValueError(f"x_t must have shape (B, input_size={self.input_size}); got {got}")
        x = x_t.unsqueeze(1)
        self._check_x(x)
        if isinstance(delta_t, (int, float)):  # filled on the device: a host tensor copied there would wait for the GPU
            dt = x.new_full((x.shape[0], 1), float(delta_t))
        else:
            dt = None if delta_t is None else torch.as_tensor(delta_t, device=x.device).reshape(-1, 1).expand(x.shape[0], 1)
        return self._step(x, self._state(h, x.shape[0], x), dt)


class MinGRU(_Mixer):
    """minGRU with positive states, scanned in log space (``parallel_scan_log``).

    ``h_0`` must be positive. That is checked on CPU tensors; on a GPU the check would stop
    the host for the device at every call, so it runs only with ``SCANKIT_CHECK_VALUES=1``
    (otherwise a non-positive h_0 gives NaN states, log of it)."""

    def __init__(self, input_size: int, hidden_size: int, decay: bool = False, bias: bool = True):
        super().__init__(input_size, hidden_size, decay, hidden_size)
        self.to_gate_hidden = nn.Linear(input_size, 2 * hidden_size, bias=bias)

    def initial_state(self, B: int, ref: torch.Tensor) -> torch.Tensor:
        return torch.full((B, self.hidden_size), 0.5, dtype=ref.dtype, device=ref.device)

    def _log_terms(self, gate_hidden, x, delta_t):
        log_a, log_b = reference.mingru_log_terms(gate_hidden)
        log_gamma = self._log_gamma(delta_t, x)
        if log_gamma is not None:
            log_a = log_a + log_gamma
        return _cast(gate_hidden.dtype, log_a, log_b)

    def forward(self, x, h_0=None, delta_t=None, cu_seqlens=None, group=None, return_final_state=False):
        """Without decay, packing or a process group: ``ops.mingru_scan`` of the projection, the gate
        math inside the scan kernel; otherwise the log terms, then ``parallel_scan_log``."""
        self._check_x(x)
        h0 = self._state(h_0, self._sequences(x, cu_seqlens), x)
        if h_0 is not None and dispatch.checks_values(h0) and bool((h0 <= 0).any()):
            raise ValueError("MinGRU states are positive: h_0 must be > 0 everywhere")
        gate_hidden = self.to_gate_hidden(x)
        h0 = h0.to(gate_hidden.dtype)
        if self.decay is None and cu_seqlens is None and group is None:
            self._log_gamma(delta_t, x)  # raises on a delta_t without decay
            return ops.mingru_scan(gate_hidden, h0=h0, return_final_state=return_final_state)
        log_a, log_b = self._log_terms(gate_hidden, x, delta_t)
        log_h0, = _cast(gate_hidden.dtype, h0.log())  # autocast runs log in fp32
        return _scans(group).parallel_scan_log(log_a, log_b, log_h0=log_h0, cu_seqlens=cu_seqlens,
                                               return_final_state=return_final_state)

    def _step(self, x, h, delta_t):
        log_a, log_b = self._log_terms(self.to_gate_hidden(x), x, delta_t)
        return (log_a.exp() * h.unsqueeze(1) + log_b.exp()).squeeze(1).to(log_a.dtype)  # forward's dtype


class SignedMinGRU(_Mixer):
    """minGRU with signed transitions ``a = tanh(.)`` (``linear_scan``); h_0 = 0 by default."""

    def __init__(self, input_size: int, hidden_size: int, coupled: bool = False, decay: bool = False, bias: bool = True):
        super().__init__(input_size, hidden_size, decay, hidden_size)
        self.coupled = coupled
        self.proj = nn.Linear(input_size, 3 * hidden_size, bias=bias)

    def initial_state(self, B: int, ref: torch.Tensor) -> torch.Tensor:
        return torch.zeros(B, self.hidden_size, dtype=ref.dtype, device=ref.device)

    def _terms(self, proj, x, delta_t):
        a, b = reference.signed_mingru_terms(proj, self.coupled)
        log_gamma = self._log_gamma(delta_t, x)
        if log_gamma is not None:
            a = a * log_gamma.exp()
        return _cast(proj.dtype, a, b)

    def forward(self, x, h_0=None, delta_t=None, cu_seqlens=None, group=None, return_final_state=False):
        """Without decay, packing or a process group: ``ops.signed_mingru_scan`` of the projection,
        the gate math inside the scan kernel; otherwise the terms, then ``linear_scan``."""
        self._check_x(x)
        proj = self.proj(x)
        h0, = _cast(proj.dtype, None if h_0 is None else self._state(h_0, self._sequences(x, cu_seqlens), x))
        if self.decay is None and cu_seqlens is None and group is None:
            self._log_gamma(delta_t, x)  # raises on a delta_t without decay
            return ops.signed_mingru_scan(proj, h0=h0, coupled=self.coupled, return_final_state=return_final_state)
        a, b = self._terms(proj, x, delta_t)
        return _scans(group).linear_scan(a, b, h0=h0, return_prefix=False, cu_seqlens=cu_seqlens,
                                         return_final_state=return_final_state)

    def _step(self, x, h, delta_t):
        a, b = self._terms(self.proj(x), x, delta_t)
        return (a * h.unsqueeze(1) + b).squeeze(1).to(b.dtype)  # forward's dtype


class _BlockMixer(_Mixer):
    """Mixers whose state is n blocks of k channels with a k x k transition per block."""

    def __init__(self, input_size, hidden_size, k, n_params, decay, bias):
        if hidden_size % k:
            raise ValueError(f"hidden_size must be a multiple of the block size {k}; got {hidden_size}")
        self.k, self.n = k, hidden_size // k
        super().__init__(input_size, hidden_size, decay, hidden_size // k)
        self.proj = nn.Linear(input_size, n_params + 2 * hidden_size, bias=bias)
        self.h0 = nn.Parameter(torch.zeros(hidden_size))
        self.n_params = n_params

    def initial_state(self, B: int, ref: torch.Tensor) -> torch.Tensor:
        return self.h0.to(ref.dtype).expand(B, -1)

    def _terms(self, x, delta_t):
        """angles (B,T,n,R,k/2), scale (B,T,n) or None, decay gamma (B,T,n) or None, b (B,T,n,k),
        all in the projection's dtype."""
        B, T = x.shape[:2]
        proj = self.proj(x)
        params, zk, pre_h = proj.split([self.n_params, self.hidden_size, self.hidden_size], dim=-1)
        angles, scale = self._angles(params)
        log_gamma = self._log_gamma(delta_t, x)
        gamma = None if log_gamma is None else log_gamma.exp()
        return _cast(proj.dtype, angles, scale, gamma, (torch.sigmoid(zk) * pre_h).reshape(B, T, self.n, self.k))

    def _transitions(self, angles, scale, gamma):
        """The k x k blocks ``gamma G_{R-1}..G_0 diag(1, scale)`` the generic path scans (in the
        angles' dtype)."""
        M = givens_matrix(angles, self.k)
        if scale is not None:
            M = M * torch.stack([torch.ones_like(scale), scale], dim=-1)[..., None, :]
        if gamma is not None:
            M = M * gamma[..., None, None]
        return M.to(angles.dtype)

    def forward(self, x, h_0=None, delta_t=None, cu_seqlens=None, group=None, return_final_state=False):
        """Fused rotation kernel where it runs (``auto`` on CUDA, ``triton``), else the
        generic path: matrices built, then ``matrix_scan`` / ``matrix_affine_scan`` (also for
        packed sequences and sharded time: the fused kernel has no carry reset or prefix form yet)."""
        self._check_x(x)
        ops._check_flag("return_final_state", return_final_state)
        B, T = x.shape[:2]
        N = self._sequences(x, cu_seqlens)
        angles, scale, gamma, b = self._terms(x, delta_t)
        h0 = self._state(h_0, N, x).reshape(N, self.n, self.k).to(b.dtype)
        if cu_seqlens is not None or group is not None:
            out = self._scan(self._transitions(angles, scale, gamma), b, h0, cu_seqlens=cu_seqlens, group=group,
                             return_final_state=return_final_state)
            h, final = out if return_final_state else (out, None)
        else:
            h = dispatch.run(
                type(self).__name__, x.device,
                lambda: self._scan(self._transitions(angles, scale, gamma), b, h0),
                lambda kernels: kernels.rotation_scan(angles, b, scale=scale, gamma=gamma, h0=h0),
            )
            final = h[:, -1].clone() if return_final_state else None
        h = h.reshape(B, T, self.hidden_size)
        return (h, final.reshape(-1, self.hidden_size)) if return_final_state else h

    def _step(self, x, h, delta_t):
        angles, scale, gamma, b = self._terms(x, delta_t)
        M = self._transitions(angles, scale, gamma)
        h = h.reshape(x.shape[0], 1, self.n, self.k, 1)
        return ((M @ h.to(M.dtype)).squeeze(-1) + b).reshape(x.shape[0], self.hidden_size).to(b.dtype)


class RotationMinGRU(_BlockMixer):
    """2 x 2 blocks ``[[cos t, -sin t d], [sin t, cos t d]]`` with d = tanh(.) (``matrix_scan``).

    ``snap=(K1, K2, ...)`` snaps block i's angle to multiples of 2 pi / K_{i mod len}
    with a straight-through gradient.
    """

    def __init__(self, input_size: int, hidden_size: int, snap=None, decay: bool = False, bias: bool = True):
        if hidden_size % 2:
            raise ValueError(f"RotationMinGRU needs an even hidden_size; got {hidden_size}")
        super().__init__(input_size, hidden_size, 2, hidden_size, decay, bias)
        if snap is not None:
            snap = (snap,) if isinstance(snap, int) else tuple(snap)
            if not snap or any(int(K) < 1 for K in snap):
                raise ValueError(f"snap must be positive integers; got {snap}")
            steps = torch.tensor([2 * math.pi / snap[i % len(snap)] for i in range(self.n)])
            self.register_buffer("snap_step", steps, persistent=False)
        self.snap = snap

    def _angles(self, params):
        """theta (B,T,n,1,1), snapped with a straight-through gradient when asked, and d = tanh(.)."""
        theta, u = params.chunk(2, dim=-1)
        if self.snap is not None:
            step = self.snap_step.to(theta.dtype)
            theta = theta + (torch.round(theta / step) * step - theta).detach()
        return theta[..., None, None], torch.tanh(u)

    def _scan(self, M, b, h0, group=None, **kwargs):
        return _scans(group).matrix_scan(M, b, h0=h0, return_prefix=False, **kwargs)


class GivensMinGRU(_BlockMixer):
    """k x k special-orthogonal blocks from R rounds of brick-wall Givens rotations
    (``matrix_affine_scan``)."""

    def __init__(self, input_size: int, hidden_size: int, block_size: int = 8, rounds: int = 3,
                 decay: bool = False, bias: bool = True):
        if block_size < 2 or block_size % 2:
            raise ValueError(f"block_size must be even and >= 2; got {block_size}")
        if rounds < 1:
            raise ValueError(f"rounds must be >= 1; got {rounds}")
        self.rounds = rounds
        super().__init__(input_size, hidden_size, block_size, (hidden_size // block_size) * rounds * block_size // 2,
                         decay, bias)

    def _angles(self, params):
        return params.reshape(*params.shape[:-1], self.n, self.rounds, self.k // 2), None

    def _scan(self, M, b, h0, group=None, **kwargs):
        out = _scans(group).matrix_affine_scan(M, b.unsqueeze(-1), h0=h0.unsqueeze(-1), return_prefix=False, **kwargs)
        return tuple(x.squeeze(-1) for x in out) if isinstance(out, tuple) else out.squeeze(-1)


MIXERS = {"mingru": MinGRU, "signed": SignedMinGRU, "rotation": RotationMinGRU, "givens": GivensMinGRU}


def _make_mixer(name: str, dim: int, **kwargs) -> _Mixer:
    if name not in MIXERS:
        raise ValueError(f"mixer must be one of {sorted(MIXERS)}; got {name!r}")
    return MIXERS[name](dim, dim, **kwargs)


class MinGRUBlock(nn.Module):
    """Pre-norm residual block: x + mixer(LN x), then + MLP(LN .) (4x, GELU)."""

    def __init__(self, dim: int, mixer: str = "mingru", mlp_ratio: int = 4, **mixer_kwargs):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.mixer = _make_mixer(mixer, dim, **mixer_kwargs)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_ratio * dim), nn.GELU(), nn.Linear(mlp_ratio * dim, dim))

    def forward(self, x, h_0=None, delta_t=None, return_state: bool = False, cu_seqlens=None, group=None):
        """x (B, T, dim) -> (B, T, dim); with ``return_state`` also the mixer's last state h_T
        (B, dim), the ``h_0`` that continues the sequence (chunked prefill, then ``step``).
        ``cu_seqlens``: x (1, T, dim) packs sequences (``scankit.packed``); h_0 and the states
        are then per sequence, (N, dim). ``group``: x is this rank's piece of time, the scan runs
        over the group's ranks (``scankit.distributed``); the states are then the whole sequence's."""
        out = self.mixer(self.norm1(x), h_0, delta_t, cu_seqlens=cu_seqlens, group=group,
                         return_final_state=return_state)
        h, state = out if return_state else (out, None)
        x = x + h
        y = x + self.mlp(self.norm2(x))
        return (y, state) if return_state else y

    def step(self, x_t, h=None, delta_t=None):
        """One token: returns (y_t (B, dim), h (B, dim))."""
        h = self.mixer.step(self.norm1(x_t), h, delta_t)
        y = x_t + h
        return y + self.mlp(self.norm2(y)), h


class MinGRUStack(nn.Module):
    """A stack of ``MinGRUBlock``; ``mixer`` is one name or one per layer."""

    def __init__(self, dim: int, depth: int, mixer="mingru", **mixer_kwargs):
        super().__init__()
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ValueError(f"depth must be an int >= 1 (the number of blocks); got {depth!r}")
        names = [mixer] * depth if isinstance(mixer, str) else list(mixer)
        if len(names) != depth:
            raise ValueError(f"mixer must be a name or a list of {depth} names; got {len(names)}")
        self.blocks = nn.ModuleList(MinGRUBlock(dim, name, **mixer_kwargs) for name in names)

    def forward(self, x, h_0=None, delta_t=None, return_state: bool = False, cu_seqlens=None, group=None):
        """h_0: None or a list of per-layer initial states; with ``return_state`` also the list
        of per-layer last states, which ``forward`` (as h_0) or ``step`` continues from.
        ``cu_seqlens`` (packed sequences in a batch of 1) and ``group`` (time sharded over a
        process group's ranks, ``scankit.distributed``) go to every layer."""
        if h_0 is not None and len(h_0) != len(self.blocks):
            raise ValueError(f"h_0 must be a list of {len(self.blocks)} per-layer states; got {len(h_0)}")
        states = []
        for i, block in enumerate(self.blocks):
            x = block(x, None if h_0 is None else h_0[i], delta_t, return_state=return_state, cu_seqlens=cu_seqlens,
                      group=group)
            if return_state:
                x, h = x
                states.append(h)
        return (x, states) if return_state else x

    def step(self, x_t, states=None, delta_t=None):
        """One token: returns (y_t, list of per-layer states)."""
        new_states = []
        for i, block in enumerate(self.blocks):
            x_t, h = block.step(x_t, None if states is None else states[i], delta_t)
            new_states.append(h)
        return x_t, new_states
