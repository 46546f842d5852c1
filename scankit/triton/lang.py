"""Triton helpers every kernel family shares: program indices (grids folded past CUDA's
limits), int64 indexing where offsets can pass 2^31, block masks from scalar conditions."""
import triton
import triton.language as tl


@triton.jit
def idx(x, I64: tl.constexpr):
    """``x`` as an index: int64 in the I64 specialization (offsets that can pass 2^31)."""
    if I64:
        x = x.to(tl.int64)
    return x


@triton.jit
def program(NBC, NC, I64: tl.constexpr, FOLD: tl.constexpr):
    """(batch, T-chunk, lane tile) of this program: grid (B x NC, lane tiles), chunks fastest,
    or with FOLD (lane tiles past the grid's y limit, ``common.launch``) that grid folded into
    its x dimension, NBC = B x NC programs per lane tile."""
    if FOLD:
        pid = tl.program_id(0)
        bc, lane = pid % NBC, pid // NBC
    else:
        bc, lane = tl.program_id(0), tl.program_id(1)
    return idx(bc // NC, I64), idx(bc % NC, I64), idx(lane, I64)


@triton.jit
def when(cond, mask):
    """The block ``mask`` where the scalar ``cond`` holds, else all False (built as a block:
    Triton 3.9's interpreter refuses a block mask ``&``-ed with a scalar)."""
    return tl.where(cond, mask, False)


@triton.jit
def row(r, T, REV: tl.constexpr):
    """The memory row of time step ``r``: ``r``, or ``T - 1 - r`` for a scan from the end
    (REV: every time-indexed address goes through here, so the kernels walk time backwards in
    place; the logic, masks and carries stay in scan order)."""
    if REV:
        r = T - 1 - r
    return r
