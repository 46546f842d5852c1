"""Peer implementations of the roofline's common ground: ``h_t = a_t h_{t-1} + b_t`` from
h_0 = 0, a and b of shape (B, T, D), returning h (B, T, D) only (``linear_scan_state``).

Each peer is optional: ``unavailable(name)`` says why it cannot run here (not installed,
no CUDA), and ``peer_fn(name, a, b)`` returns what a (B, T, D) caller runs. Conversions a
user would hold already (fla's log gate) are made once, outside the timed call; layout
changes a (B, T, D) caller pays (accelerated-scan's (B, C, T)) are inside it.
"""
from __future__ import annotations

import importlib

from .grid import PEERS

_MODULES = {
    "accelerated_scan": "accelerated_scan.scalar",
    "accelerated_scan_native": "accelerated_scan.scalar",
    "fla_chunk_hgrn": "fla.ops.hgrn",
    "torch_associative_scan": "torch._higher_order_ops.associative_scan",
}


# Cells a peer is not timed on, and why
FORWARD_ONLY = {"torch_associative_scan": "its backward compiles for minutes at large shapes (> 250 s on the H200)"}


def unavailable(name: str, device: str = "cuda", direction: str = "fwd") -> str | None:
    """Why peer ``name`` cannot run here (on ``direction``), or None."""
    if name not in PEERS:
        raise ValueError(f"peer must be one of {PEERS}; got {name!r}")
    if device != "cuda":
        return "peers run on CUDA only"
    if direction != "fwd" and name in FORWARD_ONLY:
        return FORWARD_ONLY[name]
    try:
        importlib.import_module(_MODULES[name])
    except Exception as exc:  # ImportError, or a package that fails on import
        return f"{_MODULES[name].split('.')[0]} not importable: {type(exc).__name__}: {exc}"[:160]
    return None


def _combine(left, right):
    (a1, b1), (a2, b2) = left, right
    return a1 * a2, a2 * b1 + b2


def peer_fn(name: str, a, b):
    """(callable, its inputs) for peer ``name`` on the (B, T, D) inputs a, b."""
    import torch

    if name in ("accelerated_scan", "accelerated_scan_native"):
        from accelerated_scan.scalar import scan

        if name == "accelerated_scan":
            def run(a, b):  # (B, T, D) -> (B, D, T) contiguous, scan, and back as a view
                return scan(a.transpose(1, 2).contiguous(), b.transpose(1, 2).contiguous()).transpose(1, 2)
            return run, (a, b)
        at = a.detach().transpose(1, 2).contiguous().requires_grad_(a.requires_grad)
        bt = b.detach().transpose(1, 2).contiguous().requires_grad_(b.requires_grad)
        return scan, (at, bt)
    if name == "fla_chunk_hgrn":
        from fla.ops.hgrn import chunk_hgrn

        g = a.detach().abs().log().requires_grad_(a.requires_grad)  # fla's gate is log a (a > 0)

        def run(g, b):
            return chunk_hgrn(b, g)[0]
        return run, (g, b)
    if name == "torch_associative_scan":
        from torch._higher_order_ops.associative_scan import associative_scan

        compiled = torch.compile(lambda a, b: associative_scan(_combine, (a, b), dim=1, combine_mode="pointwise")[1],
                                 dynamic=False)
        return compiled, (a, b)
    raise ValueError(f"peer must be one of {PEERS}; got {name!r}")
