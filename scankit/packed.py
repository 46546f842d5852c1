"""Packed variable-length sequences (``cu_seqlens``, FlashAttention's convention) for the ops.

Inputs of batch 1 hold N sequences one after another; ``cu_seqlens`` (N + 1,) gives their
offsets: sequence n is time steps cu_seqlens[n] .. cu_seqlens[n + 1] - 1. Each sequence scans
from its own initial state (``h0`` (N, ...), zeros when None) and its final state is its last
step. A sequence start is a reset of the carry: the recurrence's coefficient there becomes the
zero transition (log op: log a = -inf) and its input takes the initial state's term,
``b'_s = a_s h0_n + b_s``, so one dense scan of the packed tensor gives every sequence's states.

The elementwise kernels read the resets as int8 flags per row (``flags``) and restart their
carry in place; the block ops and the eager references get copies of the coefficients with the
zero transition written in (``reset_coefficients``). With h0, the inputs are a copy with its
term added (``with_initial_states``); gradients flow through torch's index ops.
"""
from __future__ import annotations

import torch

INDEX_DTYPES = (torch.int32, torch.int64)


def offsets(cu_seqlens, x: torch.Tensor, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(starts, ends) of the packed sequences, as int64 on ``x``'s device, after checking
    ``cu_seqlens`` against ``x`` (batch 1, time at dim 1). Reads the offsets on the host: a
    device ``cu_seqlens`` costs one synchronisation per call (a wrong offset would otherwise
    be a silent miscomputation); a CPU one costs none: the offsets go to the device from pinned
    memory (a copy from pageable memory would make the host wait for every kernel queued
    before it). Traced (torch.compile, fake tensors) the values are not known: dtype, shape and
    device are checked, the offsets are trusted."""
    if not isinstance(cu_seqlens, torch.Tensor):
        raise TypeError(f"cu_seqlens must be a torch.Tensor of int32 or int64 offsets (N+1,); got "
                        f"{type(cu_seqlens).__name__}")
    if cu_seqlens.dtype not in INDEX_DTYPES:
        raise TypeError(f"cu_seqlens must be int32 or int64; got {cu_seqlens.dtype}")
    if cu_seqlens.device.type != "cpu" and cu_seqlens.device != x.device:
        raise ValueError(f"cu_seqlens must be on the CPU or on the device of {name} ({x.device}); "
                         f"got {cu_seqlens.device}")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"cu_seqlens must be 1-D (N+1,) with N >= 1 sequences; got shape {tuple(cu_seqlens.shape)}")
    if x.shape[0] != 1:
        raise ValueError(f"cu_seqlens packs the sequences along time in a batch of 1: {name} must have batch 1; "
                         f"got shape {tuple(x.shape)}")
    if torch.compiler.is_compiling() or type(cu_seqlens) is not torch.Tensor:  # traced: no values to read
        bounds = cu_seqlens.to(device=x.device, dtype=torch.int64)
        return bounds[:-1], bounds[1:]
    values = cu_seqlens.tolist()
    T = x.shape[1]
    if values[0] != 0:
        raise ValueError(f"cu_seqlens must start at 0; got {values[0]}")
    if values[-1] != T:
        raise ValueError(f"cu_seqlens must end at the packed length T = {T} (dim 1 of {name}); got {values[-1]}")
    lengths = [b - a for a, b in zip(values, values[1:])]
    if min(lengths) <= 0:
        n = next(i for i, n in enumerate(lengths) if n <= 0)
        kind = "decreases" if lengths[n] < 0 else "has an empty sequence"
        raise ValueError(f"cu_seqlens {kind} at sequence {n} ({values[n]} -> {values[n + 1]}): offsets must "
                         f"increase strictly (every sequence at least one step)")
    # staged in pinned memory, so the copy is queued without waiting for the device (torch's
    # caching host allocator keeps the staging block until the copy has run)
    bounds = torch.tensor(values, dtype=torch.int64, pin_memory=x.device.type == "cuda").to(x.device, non_blocking=True)
    return bounds[:-1], bounds[1:]


def reset_coefficients(kind: str, coeffs: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
    """The coefficients with the zero transition at each sequence start (``kind`` "log": log a =
    -inf; "elementwise" a = 0; "matrix": A (..., k, k) = 0), a copy."""
    return coeffs.index_fill(1, starts, float("-inf") if kind == "log" else 0.0)


def flags(starts: torch.Tensor, T: int) -> torch.Tensor:
    """int8 (T,): 1 at the rows where a sequence's scan begins, what the elementwise kernels
    read to reset their carry in place (no copy of the coefficients)."""
    return torch.zeros(T, dtype=torch.int8, device=starts.device).index_fill_(0, starts, 1)


def with_initial_states(kind: str, coeffs: torch.Tensor, inputs: torch.Tensor, h0, starts: torch.Tensor):
    """The inputs with each sequence's initial-state term at its start, ``b'_s = a_s h0 + b_s``
    (a copy; the inputs themselves when h0 is None)."""
    if h0 is None:
        return inputs
    if kind == "log":  # log b'_s = log(a_s h0 + b_s)
        return inputs.index_copy(1, starts, torch.logaddexp(inputs.index_select(1, starts),
                                                            coeffs.index_select(1, starts) + h0.unsqueeze(0)))
    a_s = coeffs.index_select(1, starts)
    if kind == "elementwise":
        term = a_s * h0.unsqueeze(0)
    elif inputs.dim() == coeffs.dim() - 1:  # matrix_scan: B (..., k)
        term = (a_s @ h0.unsqueeze(0).unsqueeze(-1)).squeeze(-1)
    else:
        term = a_s @ h0.unsqueeze(0)
    return inputs.index_add(1, starts, term.to(inputs.dtype))


def final_states(h: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """Each sequence's last state (N, ...) of the packed states h (1, T, ...)."""
    return h.index_select(1, ends - 1).squeeze(0)
