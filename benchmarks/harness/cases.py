"""The one registry of scan ops, shapes, input builders, parity gates and byte models.

Tests, the asv suites, ``scripts/bench_scans.py`` and the renderer all iterate this
module; none keeps its own list of ops, shapes or tolerances.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from scankit import mixers, ops, reference
from .grid import SHAPES, Shape  # noqa: F401 (Shape re-exported for callers of the registry)


@dataclass(frozen=True)
class Gate:
    """Pass when ``|x - ref| <= atol + rtol |ref|`` everywhere (``scaled``: atol is
    relative to max |ref|, for half precision where rounding scales with the values)."""

    atol: float
    rtol: float
    scaled: bool = False

    def margin(self, out: torch.Tensor, ref: torch.Tensor) -> float:
        """max |x - ref| / (atol + rtol |ref|): the case passes when this is <= 1 (inf when
        out and ref disagree on which elements are finite)."""
        out, ref = out.double(), ref.double()
        finite = torch.isfinite(ref)
        if not torch.equal(torch.isfinite(out), finite):
            return float("inf")
        if not finite.any():
            return 0.0
        atol = self.atol * (ref[finite].abs().max().item() if self.scaled else 1.0)
        return ((out - ref).abs()[finite] / (atol + self.rtol * ref.abs()[finite])).max().item()

    def passes(self, out: torch.Tensor, ref: torch.Tensor) -> bool:
        return self.margin(out, ref) <= 1.0


AFFINE_FWD = Gate(1e-5, 0.0)
LOG_FWD = Gate(1e-4, 1e-4)
GRAD = Gate(1e-3, 0.0)
MIXER_PARAM = Gate(1e-3, 1e-3)
# bfloat16 / float16 outputs carry a rounding of 2^-8 (bf16) of their magnitude
HALF_FWD = Gate(1e-2, 1e-2, scaled=True)
HALF_GRAD = Gate(3e-2, 3e-2, scaled=True)


def _uniform(shape, lo, hi, gen, device, dtype=torch.float32):
    return torch.empty(shape, device=device, dtype=dtype).uniform_(lo, hi, generator=gen)


def _normal(shape, gen, device, dtype=torch.float32):
    return torch.randn(shape, device=device, dtype=dtype, generator=gen)


def _signs(shape, gen, device):
    return torch.randint(0, 2, shape, device=device, generator=gen).float() * 2 - 1


def _build_log(gen, device, B, T, D):
    log_coeffs = _uniform((B, T, D), 0.9, 1.0, gen, device).log_()
    log_values = _normal((B, T + 1, D), gen, device)
    return log_coeffs, log_values


def _build_linear(gen, device, B, T, D):
    a = _uniform((B, T, D), 0.9, 1.0, gen, device) * _signs((B, T, D), gen, device)
    return a, _normal((B, T, D), gen, device)


def _build_matrix(gen, device, B, T, n):
    theta = _uniform((B, T, n), -math.pi, math.pi, gen, device)
    d = _uniform((B, T, n), 0.9, 1.0, gen, device)
    c, s = torch.cos(theta), torch.sin(theta)
    M = torch.stack([torch.stack([c, -s * d], -1), torch.stack([s, c * d], -1)], -2)
    return M, _normal((B, T, n, 2), gen, device)


def random_transitions(gen, device, B, T, n, k):
    """Scaled orthogonal k x k blocks (scale in [0.9, 1]): decays near 1, never blowing up."""
    scale = _uniform((B, T, n, 1, 1), 0.9, 1.0, gen, device)
    if k == 1:
        return scale * _signs((B, T, n, 1, 1), gen, device)
    if k % 2 == 0:
        angles = _uniform((B, T, n, 2, k // 2), -math.pi, math.pi, gen, device)
        return scale * mixers.givens_matrix(angles, k)
    q, _ = torch.linalg.qr(_normal((B, T, n, k, k), gen, device))
    return scale * q


def _build_affine(gen, device, B, T, n, k, v):
    return random_transitions(gen, device, B, T, n, k), _normal((B, T, n, k, v), gen, device)


@dataclass(frozen=True)
class OpSpec:
    """One scan op: its public and eager functions, inputs, gates and byte model."""

    name: str
    fn: Callable
    eager: Callable
    public: str                 # the scankit function it calls (an older commit may lack it)
    builder: Callable
    dims_at: Callable[[Shape], dict]
    input_shapes: Callable[[dict], list]
    fwd_gate: Gate
    grad_gate: Gate = GRAD

    def gate_for(self, direction: str, dtype=torch.float32) -> Gate:
        if dtype in (torch.bfloat16, torch.float16):
            return HALF_FWD if direction == "fwd" else HALF_GRAD
        return self.fwd_gate if direction == "fwd" else self.grad_gate

    def inputs(self, dims: dict, dtype=torch.float32, device="cpu", seed: int = 0, requires_grad=False):
        """Seeded random inputs of this op at ``dims`` (see ``dims_at``)."""
        gen = torch.Generator(device=device).manual_seed(seed)
        xs = self.builder(gen, torch.device(device), **dims)
        return tuple(x.to(dtype).requires_grad_(requires_grad) for x in xs)

    def shape_inputs(self, shape: str, **kwargs):
        return self.inputs(self.dims_at(SHAPES[shape]), **kwargs)


def bytes_moved(inputs, outputs, direction: str) -> int:
    """Fewest bytes: fwd reads each input and writes each output once; fwd+bwd also
    reads grad-out, inputs and outputs and writes one grad per input."""
    size = lambda ts: sum(t.numel() * t.element_size() for t in ts)  # noqa: E731
    fwd = size(inputs) + size(outputs)
    if direction == "fwd":
        return fwd
    if direction == "fwdbwd":
        return fwd + size(outputs) + size(inputs) + size(outputs) + size(inputs)
    raise ValueError(f"direction must be 'fwd' or 'fwdbwd'; got {direction!r}")


def _late(module, name: str, **kwargs) -> Callable:
    """``module.name(*args, **kwargs)``, looked up at call time: the harness measures every
    commit of scankit, and an older one may lack a function (its cells are then n/a)."""
    def call(*args, **more):
        return getattr(module, name)(*args, **kwargs, **more)
    call.__name__ = name
    return call


def _op(name, public, builder, dims_at, input_shapes, fwd_gate, **kwargs) -> OpSpec:
    return OpSpec(name, _late(ops, public, **kwargs), _late(reference, public, **kwargs), public, builder, dims_at,
                  input_shapes, fwd_gate)


OPS = {
    op.name: op
    for op in (
        _op("parallel_scan_log", "parallel_scan_log", _build_log, lambda s: dict(B=s.B, T=s.T, D=s.D),
            lambda d: [(d["B"], d["T"], d["D"]), (d["B"], d["T"] + 1, d["D"])], LOG_FWD),
        _op("linear_scan", "linear_scan", _build_linear, lambda s: dict(B=s.B, T=s.T, D=s.D),
            lambda d: [(d["B"], d["T"], d["D"])] * 2, AFFINE_FWD),
        _op("linear_scan_state", "linear_scan", _build_linear, lambda s: dict(B=s.B, T=s.T, D=s.D),
            lambda d: [(d["B"], d["T"], d["D"])] * 2, AFFINE_FWD, return_prefix=False),
        _op("matrix_scan", "matrix_scan", _build_matrix, lambda s: dict(B=s.B, T=s.T, n=s.d // 2),
            lambda d: [(d["B"], d["T"], d["n"], 2, 2), (d["B"], d["T"], d["n"], 2)], AFFINE_FWD),
        _op("matrix_affine_scan", "matrix_affine_scan", _build_affine,
            lambda s: dict(B=s.B, T=s.T, n=s.d // 8, k=8, v=1),
            lambda d: [(d["B"], d["T"], d["n"], d["k"], d["k"]), (d["B"], d["T"], d["n"], d["k"], d["v"])],
            AFFINE_FWD),
    )
}

# The parity grid of the earlier system (REFERENCE.md): 290 op cases, fwd + grad each,
# plus linear_scan's state-only form at the same sizes.
CHECK_T = (1, 13, 64, 128, 1024)
CHECK_B = (2, 128)
KERNEL_KV = (1, 2, 4, 8, 16)


def check_dims():
    """Yield (op name, dims) for every op case of the parity grid."""
    for T in CHECK_T:
        for B in CHECK_B:
            yield "parallel_scan_log", dict(B=B, T=T, D=64)
            yield "linear_scan", dict(B=B, T=T, D=64)
            yield "linear_scan_state", dict(B=B, T=T, D=64)
            yield "matrix_scan", dict(B=B, T=T, n=4)
            for k in KERNEL_KV:
                for v in KERNEL_KV:
                    yield "matrix_affine_scan", dict(B=B, T=T, n=1, k=k, v=v)
            yield "matrix_affine_scan", dict(B=B, T=T, n=3, k=8, v=4)


# Mixer-level cases (grid.MIXER_LABELS): constructors at the lab shape (B=128, T=64, d=64).
MIXER_CASES = {
    "GivensMinGRU(k=8,R=3)": lambda: mixers.GivensMinGRU(64, 64, block_size=8, rounds=3),
    "GivensMinGRU(k=4,R=2,decay)": lambda: mixers.GivensMinGRU(64, 64, block_size=4, rounds=2, decay=True),
    "GivensMinGRU(k=16,R=1)": lambda: mixers.GivensMinGRU(64, 64, block_size=16, rounds=1),
    "RotationMinGRU": lambda: mixers.RotationMinGRU(64, 64),
    "RotationMinGRU(snap,decay)": lambda: mixers.RotationMinGRU(64, 64, snap=(2, 3, 4, 6), decay=True),
}
