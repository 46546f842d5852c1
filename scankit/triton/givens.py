"""Angle-fused rotation scan: ``h_t = gamma_t G_{R-1} ... G_0 S_t h_{t-1} + b_t``.

G_r is round r of brick-wall plane rotations on a k-vector (pairs (i, i+1 mod k),
i = r % 2, r % 2 + 2, ...), S_t = diag(1, d_t) (the Rotation mixer's scale, k = 2 only)
and gamma_t an optional decay. One program owns BN (batch, block) lanes and keeps their
k-vectors in registers, applying the rotations straight from the angles: no k x k
matrix is formed or stored. The backward walks t = T..1, re-reading h_{t-1} from the
saved output, recomputing the step's rounds and undoing them with exact transposes
(orthogonal, so no error growth), and returns the grads of angles, scales, decays,
inputs and h_0.
"""
from typing import Optional

import torch
import triton
import triton.language as tl

from . import common
from .common import align, cdiv, either, empty_like_shape as _empty, needs_int64, next_pow2, target_programs, with_autograd
from .lang import idx, program, when


@triton.jit
def _round_tables(i, K: tl.constexpr, PAR: tl.constexpr):
    """Per column i (a tensor of column indices, any shape) in a round of parity PAR: whether
    it is its pair's first row, its pair index, its partner row and the sign of the partner term."""
    first = (i % 2) == PAR
    partner = tl.where(first, (i + 1) % K, (i + K - 1) % K)
    pair = ((i + K - PAR) % K) // 2
    sign = tl.where(first, -1.0, 1.0)
    return first, pair, partner, sign


@triton.jit
def _partner(h, partner):
    """h[..., partner(i)] (a gather along the last axis: no (BN, K, K) product, whose layouts
    Triton 3.6's layout pass failed on in the bf16 backward)."""
    return tl.gather(h, tl.broadcast_to(partner, h.shape), axis=-1)


@triton.jit
def _angles(ang_ptr, base, pair, ih, r, s_r, s_p, mask, PAR: tl.constexpr, ONCE: tl.constexpr):
    """cos and sin of round r's angles per column: ``base`` per lane, ``pair`` per column and
    ``ih`` the pair index (k / 2 of them), shaped to broadcast. With ONCE, in a round of parity 0
    (pairs (0, 1), (2, 3) ...) each pair's angle is loaded and its cos / sin taken once, then
    interleaved to both its rows (cos / sin cost far more than the move; a gather from the pair
    values, which parity 1 would need, made Triton 3.6's TritonGPUOptimizeThreadLocality pass fail
    at k = 8). ONCE where the pair values fill the program's threads (``_pair_once``)."""
    if ONCE:
        if PAR == 0:
            th = tl.load(ang_ptr + base + r * s_r + ih * s_p, mask=mask, other=0.0).to(tl.float32)
            c, s = tl.cos(th), tl.sin(th)
            return tl.interleave(c, c), tl.interleave(s, s)
    th = tl.load(ang_ptr + base + r * s_r + pair * s_p, mask=mask, other=0.0).to(tl.float32)
    return tl.cos(th), tl.sin(th)


@triton.jit
def _block(B, N, NC, BN: tl.constexpr, I64: tl.constexpr, FOLD: tl.constexpr):
    """This program's batch index, T-chunk and BN block lanes (and their mask) on the grid
    (B x NC chunks, block tiles)."""
    bi, ci, ni = program(B * NC, NC, I64, FOLD)
    n = ni * BN + tl.arange(0, BN)
    return bi, ci, n, n < N


@triton.jit
def _lanes(h0_ptr, sh_b, sh_n, sh_i, B, N, NC, K: tl.constexpr, BN: tl.constexpr, HAS_H0: tl.constexpr,
           I64: tl.constexpr, FOLD: tl.constexpr):
    """``_block``'s program with the column index and the lanes' h_0 (zeros if none)."""
    bi, ci, n, nm = _block(B, N, NC, BN, I64, FOLD)
    i = tl.arange(0, K)
    h0 = tl.zeros((BN, K), tl.float32)
    if HAS_H0:
        h0 = tl.load(h0_ptr + bi * sh_b + n[:, None] * sh_n + i[None, :] * sh_i, mask=nm[:, None], other=0.0)
        h0 = h0.to(tl.float32)
    return bi, ci, n, i, nm, h0


@triton.jit
def _step(u, cols, ang_ptr, sc_ptr, gm_ptr, bi, t, lane, lm, i, ih, sa_b, sa_t, sa_n, sa_r, sa_p, ss_b, ss_t, ss_n,
          sg_b, sg_t, sg_n, K: tl.constexpr, R: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_GAMMA: tl.constexpr,
          COLS: tl.constexpr, TRANSPOSE: tl.constexpr, ONCE: tl.constexpr):
    """A_t u = gamma_t G_{R-1} ... G_0 S_t u (A_t^T u if TRANSPOSE) for vectors u along the last
    axis (column index i, pair index ih); ``lane`` and its mask ``lm`` index u's lanes, shaped to
    broadcast against it. With COLS also A_t (A_t^T) of ``cols``, each lane's (K, K) columns,
    from the same loads: a step's angles are loaded and their cos / sin taken once for both.
    ONCE: each parity-0 round's cos / sin once a pair (``_angles``)."""
    if HAS_SCALE:
        sc = tl.load(sc_ptr + bi * ss_b + t * ss_t + lane * ss_n, mask=lm, other=1.0).to(tl.float32)
    if HAS_GAMMA:
        gm = tl.load(gm_ptr + bi * sg_b + t * sg_t + lane * sg_n, mask=lm, other=1.0).to(tl.float32)
    if HAS_SCALE and not TRANSPOSE:  # S_t first
        u = tl.where(i == 1, u * sc, u)
        if COLS:
            cols = tl.where(i == 1, cols * sc, cols)
    if HAS_GAMMA and TRANSPOSE:  # gamma_t first
        u = u * gm
        if COLS:
            cols = cols * gm
    base = bi * sa_b + t * sa_t + lane * sa_n
    for rr in tl.static_range(R):
        r = rr
        if TRANSPOSE:  # G_r^T, last round first
            r = R - 1 - rr
        first, pair, partner, sign = _round_tables(i, K, r % 2)
        c, s = _angles(ang_ptr, base, pair, ih, r, sa_r, sa_p, lm, r % 2, ONCE)
        s = sign * s
        if TRANSPOSE:
            s = -s
        u = c * u + s * _partner(u, partner)
        if COLS:
            cols = c * cols + s * _partner(cols, partner)
    if HAS_GAMMA and not TRANSPOSE:
        u = u * gm
        if COLS:
            cols = cols * gm
    if HAS_SCALE and TRANSPOSE:
        u = tl.where(i == 1, u * sc, u)
        if COLS:
            cols = tl.where(i == 1, cols * sc, cols)
    return u, cols


@triton.jit
def _fold(sm_ptr, sv_ptr, x, bi, first, step, count, NC, N, n, nm, i, K: tl.constexpr):
    """Apply ``count`` chunk summaries to (BN, K) vectors x, chunk ``first`` first, then
    ``first + step``...: x -> M_j x + v_j, M_j stored per lane as its columns (row c of the
    lane's (K, K) block: M_j e_c), v_j a K-vector."""
    c = tl.arange(0, K)
    for q in range(0, count):
        slot = (bi * NC + first + step * q) * N + n
        cols = tl.load(sm_ptr + slot[:, None, None] * K * K + c[None, :, None] * K + i[None, None, :],
                       mask=nm[:, None, None], other=0.0)
        v = tl.load(sv_ptr + slot[:, None] * K + i[None, :], mask=nm[:, None], other=0.0)
        x = tl.sum(cols * x[:, :, None], axis=1) + v
    return x


@triton.jit
def _summary_start(B, N, NC, K: tl.constexpr, BN: tl.constexpr, I64: tl.constexpr, FOLD: tl.constexpr):
    """A summary program's block and lanes, shaped (BN, 1, 1) with their mask; the column index
    (1, 1, K) and pair index (1, 1, K / 2); its vector (BN, 1, K) zeros and its columns (BN, K, K), an identity per lane,
    which it carries through its chunk's maps."""
    bi, ci, n, nm = _block(B, N, NC, BN, I64, FOLD)
    i = tl.arange(0, K)[None, None, :]
    eye = (tl.arange(0, K)[None, :, None] == i).to(tl.float32)
    cols = tl.zeros((BN, K, K), tl.float32) + eye
    ih = tl.arange(0, K // 2)[None, None, :]
    return bi, ci, n[:, None, None], nm[:, None, None], i, ih, tl.zeros((BN, 1, K), tl.float32), cols


@triton.jit
def _store_summary(sm_ptr, sv_ptr, cols, v, bi, ci, NC, N, lane, lm, i, K: tl.constexpr):
    """A chunk's map: its lanes' (K, K) columns (as ``_fold`` reads them) and its vector."""
    slot = (bi * NC + ci) * N + lane
    tl.store(sm_ptr + slot * K * K + tl.arange(0, K)[None, :, None] * K + i, cols, mask=lm)
    tl.store(sv_ptr + slot * K + i, v, mask=lm)


@triton.jit
def _fwd_summary_kernel(
    ang_ptr, b_ptr, sc_ptr, gm_ptr, sm_ptr, sv_ptr, B, T, N, NC, CHUNK,
    sa_b, sa_t, sa_n, sa_r, sa_p, sb_b, sb_t, sb_n, sb_i, ss_b, ss_t, ss_n, sg_b, sg_t, sg_n,
    K: tl.constexpr, R: tl.constexpr, BN: tl.constexpr,
    HAS_SCALE: tl.constexpr, HAS_GAMMA: tl.constexpr, I64: tl.constexpr, FOLD: tl.constexpr, ONCE: tl.constexpr,
):
    """Each T-chunk's map h -> M h + v (the forward's chunk summary, from h = 0 for v): v walks
    the chunk as the forward does, M's columns walk it from the identity (no b)."""
    bi, ci, lane, lm, i, ih, v, cols = _summary_start(B, N, NC, K, BN, I64, FOLD)
    start = ci * CHUNK
    for t in range(start, tl.minimum(T, start + CHUNK)):
        v, cols = _step(v, cols, ang_ptr, sc_ptr, gm_ptr, bi, t, lane, lm, i, ih, sa_b, sa_t, sa_n, sa_r, sa_p,
                        ss_b, ss_t, ss_n, sg_b, sg_t, sg_n, K, R, HAS_SCALE, HAS_GAMMA, True, False, ONCE)
        v += tl.load(b_ptr + bi * sb_b + t * sb_t + lane * sb_n + i * sb_i, mask=lm, other=0.0).to(tl.float32)
    _store_summary(sm_ptr, sv_ptr, cols, v, bi, ci, NC, N, lane, lm, i, K)


@triton.jit
def _fwd_kernel(
    ang_ptr, b_ptr, sc_ptr, gm_ptr, h0_ptr, sm_ptr, sv_ptr, out_ptr, B, T, N, NC, CHUNK,
    sa_b, sa_t, sa_n, sa_r, sa_p, sb_b, sb_t, sb_n, sb_i, ss_b, ss_t, ss_n, sg_b, sg_t, sg_n, sh_b, sh_n, sh_i,
    K: tl.constexpr, R: tl.constexpr, BN: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_GAMMA: tl.constexpr,
    HAS_H0: tl.constexpr, HAS_CARRY: tl.constexpr, I64: tl.constexpr, FOLD: tl.constexpr, ONCE: tl.constexpr,
):
    """The states of one T-chunk (of NC): from h_0 folded through the summaries of the chunks
    before it (HAS_CARRY), walked step by step."""
    bi, ci, n, i, nm, h = _lanes(h0_ptr, sh_b, sh_n, sh_i, B, N, NC, K, BN, HAS_H0, I64, FOLD)
    T = idx(T, I64)  # the step index t then runs in int64 too
    m2 = nm[:, None]
    if HAS_CARRY:
        h = _fold(sm_ptr, sv_ptr, h, bi, 0, 1, ci, NC, N, n, nm, i, K)
    out_rows = (bi * T * N + n[:, None]) * K + i[None, :]
    ih = tl.arange(0, K // 2)[None, :]
    start = ci * CHUNK
    for t in range(start, tl.minimum(T, start + CHUNK)):
        u, _ = _step(h, h, ang_ptr, sc_ptr, gm_ptr, bi, t, n[:, None], m2, i[None, :], ih, sa_b, sa_t, sa_n, sa_r,
                     sa_p, ss_b, ss_t, ss_n, sg_b, sg_t, sg_n, K, R, HAS_SCALE, HAS_GAMMA, False, False, ONCE)
        bt = tl.load(b_ptr + bi * sb_b + t * sb_t + n[:, None] * sb_n + i[None, :] * sb_i, mask=m2, other=0.0)
        h = u + bt.to(tl.float32)
        tl.store(out_ptr + out_rows + t * N * K, h.to(out_ptr.dtype.element_ty), mask=m2)


@triton.jit
def _bwd_summary_kernel(
    ang_ptr, sc_ptr, gm_ptr, g_ptr, sm_ptr, sw_ptr, B, T, N, NC, CHUNK,
    sa_b, sa_t, sa_n, sa_r, sa_p, ss_b, ss_t, ss_n, sg_b, sg_t, sg_n,
    K: tl.constexpr, R: tl.constexpr, BN: tl.constexpr,
    HAS_SCALE: tl.constexpr, HAS_GAMMA: tl.constexpr, I64: tl.constexpr, FOLD: tl.constexpr, ONCE: tl.constexpr,
):
    """Each T-chunk's backward map x -> P x + w: x = dL/dh at the chunk's last step from the
    steps after it, P x + w = dL/dh before its first step; w from the chunk's own grads (x = 0),
    P = A_first^T ... A_last^T (its columns walk the chunk backwards from the identity)."""
    bi, ci, lane, lm, i, ih, w, cols = _summary_start(B, N, NC, K, BN, I64, FOLD)
    start = ci * CHUNK
    end = tl.minimum(T, start + CHUNK)
    rows = (bi * T * N + lane) * K + i
    for j in range(0, end - start):
        t = end - 1 - j
        w += tl.load(g_ptr + rows + t * N * K, mask=lm, other=0.0).to(tl.float32)
        w, cols = _step(w, cols, ang_ptr, sc_ptr, gm_ptr, bi, t, lane, lm, i, ih, sa_b, sa_t, sa_n, sa_r, sa_p,
                        ss_b, ss_t, ss_n, sg_b, sg_t, sg_n, K, R, HAS_SCALE, HAS_GAMMA, True, True, ONCE)
    _store_summary(sm_ptr, sw_ptr, cols, w, bi, ci, NC, N, lane, lm, i, K)


@triton.jit
def _bwd_kernel(
    ang_ptr, sc_ptr, gm_ptr, h0_ptr, out_ptr, g_ptr, sm_ptr, sw_ptr, dang_ptr, db_ptr, dsc_ptr, dgm_ptr, dh0_ptr,
    B, T, N, NC, CHUNK,
    sa_b, sa_t, sa_n, sa_r, sa_p, ss_b, ss_t, ss_n, sg_b, sg_t, sg_n, sh_b, sh_n, sh_i,
    K: tl.constexpr, R: tl.constexpr, BN: tl.constexpr, HAS_SCALE: tl.constexpr, HAS_GAMMA: tl.constexpr,
    HAS_H0: tl.constexpr, HAS_CARRY: tl.constexpr, I64: tl.constexpr, FOLD: tl.constexpr, ONCE: tl.constexpr,
):
    """The grads of one T-chunk (of NC), walked t descending from the grad that the chunks
    after it pass back (their backward summaries folded, HAS_CARRY)."""
    bi, ci, n, i, nm, h0 = _lanes(h0_ptr, sh_b, sh_n, sh_i, B, N, NC, K, BN, HAS_H0, I64, FOLD)
    T = idx(T, I64)
    m2, i2, ih = nm[:, None], i[None, :], tl.arange(0, K // 2)[None, :]
    rows = (bi * T * N + n[:, None]) * K + i[None, :]   # contiguous (B, T, n, K) at t = 0
    side = bi * T * N + n                                # contiguous (B, T, n) at t = 0
    carry = tl.zeros((BN, K), tl.float32)                # dL/dh_t through h_{t+1}
    if HAS_CARRY:  # the chunks after this one, the last first
        carry = _fold(sm_ptr, sw_ptr, carry, bi, NC - 1, -1, NC - 1 - ci, NC, N, n, nm, i, K)
    start = ci * CHUNK
    end = tl.minimum(T, start + CHUNK)
    for j in range(0, end - start):
        t = end - 1 - j
        gh = tl.load(g_ptr + rows + t * N * K, mask=m2, other=0.0).to(tl.float32) + carry
        tl.store(db_ptr + rows + t * N * K, gh.to(db_ptr.dtype.element_ty), mask=m2)
        hp = tl.load(out_ptr + rows + (t - 1) * N * K, mask=when(t > 0, m2), other=0.0).to(tl.float32)
        hp = tl.where(t > 0, hp, h0)
        u = hp
        if HAS_SCALE:
            sc = tl.load(sc_ptr + bi * ss_b + t * ss_t + n * ss_n, mask=nm, other=1.0).to(tl.float32)
            u = tl.where(i[None, :] == 1, u * sc[:, None], u)
        base = (bi * sa_b + t * sa_t + n * sa_n)[:, None]
        cs = ()  # each round's (cos, sign x sin), the last round's first: the undo's order
        for r in tl.static_range(R):  # recompute the step's rotations
            first, pair, partner, sign = _round_tables(i2, K, r % 2)
            c, s = _angles(ang_ptr, base, pair, ih, r, sa_r, sa_p, m2, r % 2, ONCE)
            cs = (c, sign * s) + cs
            u = c * u + sign * s * _partner(u, partner)
        du = gh
        if HAS_GAMMA:
            gm = tl.load(gm_ptr + bi * sg_b + t * sg_t + n * sg_n, mask=nm, other=1.0).to(tl.float32)
            tl.store(dgm_ptr + side + t * N, tl.sum(gh * u, axis=1).to(dgm_ptr.dtype.element_ty), mask=nm)
            du = du * gm[:, None]
        for rr in tl.static_range(R):  # undo them, last round first
            r = R - 1 - rr
            first, pair, partner, sign = _round_tables(i2, K, r % 2)
            c, s = cs[2 * rr], cs[2 * rr + 1]
            cross = u * _partner(du, partner)               # u'_i du'_j
            dth = cross - _partner(cross, partner)          # at a pair's first row: u'_i du'_j - u'_j du'_i
            d_off = (side + t * N)[:, None] * (R * (K // 2)) + r * (K // 2) + pair
            tl.store(dang_ptr + d_off, dth.to(dang_ptr.dtype.element_ty), mask=m2 & first)
            du = c * du - s * _partner(du, partner)   # G_r^T du
            u = c * u - s * _partner(u, partner)      # G_r^T u
        if HAS_SCALE:
            dsc = tl.sum(tl.where(i[None, :] == 1, du * hp, 0.0), axis=1)
            tl.store(dsc_ptr + side + t * N, dsc.to(dsc_ptr.dtype.element_ty), mask=nm)
            du = tl.where(i[None, :] == 1, du * sc[:, None], du)
        carry = du
    if HAS_H0:  # the first chunk's carry: dL/dh_0
        tl.store(dh0_ptr + (bi * N + n[:, None]) * K + i[None, :], carry.to(dh0_ptr.dtype.element_ty),
                 mask=when(ci == 0, m2))


def _lanes_per_program(B: int, N: int, device) -> int:
    """Blocks per program: as many as keep >= 2 programs per SM-slot busy, up to 16."""
    bn = 1
    while bn < 16 and B * cdiv(N, 2 * bn) >= target_programs(device) // 2:
        bn *= 2
    return min(bn, next_pow2(N))


# T-chunking. Each step of a walk waits on its loads (one memory round trip: latency-bound,
# far below the bandwidth), so a walk of T steps on few lanes (a B = 1 prefill) or on lanes
# that only just fill the device (the training shapes) is slow however few its bytes. Chunked,
# a summary pass per direction forms each chunk's map (a k x k block per lane from its columns
# walked through the chunk) and the main pass folds the chunks before (after, backward) into
# its carry: two walks of T / chunks steps instead of one of T. On the GPU a chunked program
# takes "elems" // k lanes (a fuller tile costs a latency-bound step nothing) and T is cut
# into chunks of at least "min_chunk" steps until the programs reach "per_sm" per SM. The
# summaries walk k + 1 vectors a lane (the step's angles loaded and their cos / sin taken once
# for all of them; (k + 1) x k FMAs a rotation round), so chunking adds work: T is chunked only
# into "min_chunks" chunks or more (two passes of T / chunks steps against one of T), else one
# walk (with _lanes_per_program's lanes). Tuned on the H100 (tune_scans.py --sections rotation;
# NOTES.md, sessions 28 and 29): 64 elements a program and 24 programs per SM (below the 32
# resident blocks an SM holds) beat 32, 128 and 12, 48; min_chunk 32 helps short T. Where k's
# pair values would not fill a program's threads at "elems" // k lanes (Givens k = 8, 16), a
# program takes the lanes of the pair-once path (PAIR_ONCE, below) and "per_sm" shrinks by as
# much, so an SM holds the same elements (H100, session 36: Givens k = 8 0.79-0.87x fwd,
# 0.79-0.83x fwd+bwd at large, vlong, (16, 2048, 512), (64, 2048, 1024); k = 16 0.81x / 0.80x at
# large, 1.00x / 0.92x at vlong; doubling the lanes without halving per_sm lost at vlong, 1.12x).
CHUNKS = common.Knobs({"elems": 64, "per_sm": 24, "min_chunk": 32, "min_chunks": 3})


# A round's cos / sin taken once a pair (``_angles``' ONCE) where the pair values fill the
# program's threads "pairs_per_thread" times or more (lanes x k / 2 >= that x 32 x warps); below,
# interleaving them to both rows costs more than the cos / sin it saves (H100, session 31,
# tune_scans.py --sections rotation, every cell one rule: Givens k = 8 (2 warps) 4-15% faster
# at 16 lanes a program, 0-13% slower at 8 and 4 lanes; Rotation k = 2 (1 warp) 2-4% faster at
# 32 lanes, unchanged at 16). The rule's A/B against per-row values (H100, session 36, both trees in
# one machine; experiments/pending/README.md): no cell at CHUNKS' point slower than 1.005x, the
# 16-lane Givens walks 0.85-0.93x, Rotation chunked 0.92-0.94x.
PAIR_ONCE = common.Knobs({"pairs_per_thread": 1})


def _warps(K: int) -> int:
    return 1 if K <= 4 else 2


def _pair_once(bn: int, K: int) -> bool:
    return bn * (K // 2) >= PAIR_ONCE["pairs_per_thread"] * 32 * _warps(K)


def _pair_once_lanes(K: int) -> int:
    """The fewest lanes a program takes for ``_pair_once``."""
    return cdiv(PAIR_ONCE["pairs_per_thread"] * 32 * _warps(K), max(1, K // 2))


def _geometry(B: int, T: int, N: int, K: int, device) -> tuple[int, int, int]:
    """(lanes per program, chunks, chunk length) of the rotation kernels."""
    if common.on_gpu(device):
        lanes = max(1, CHUNKS["elems"] // K)
        bn = min(max(lanes, _pair_once_lanes(K)), next_pow2(N))
        per_sm = max(1, CHUNKS["per_sm"] * lanes // max(lanes, bn))  # the same elements an SM
        want = cdiv(target_programs(device, per_sm=per_sm), B * cdiv(N, bn))
        nc = min(want, T // CHUNKS["min_chunk"])
        if nc < CHUNKS["min_chunks"]:
            bn, nc = _lanes_per_program(B, N, device), 1
    else:  # the interpreter: chunked at small shapes, so the tests walk the chunked kernels
        bn = _lanes_per_program(B, N, device)
        nc = common.num_chunks(B * cdiv(N, bn), T, 4, device)
    chunk = cdiv(T, nc)
    return bn, cdiv(T, chunk), chunk


def _s(x, dims):
    return tuple(x.stride()) if x is not None else (0,) * dims


def _key(direction, *tensors):
    """A plan key for these tensors (None allowed): what a launch specializes on, per tensor."""
    key = [direction, common.plan_epoch()]
    for t in tensors:
        key += (None, None, None, -1) if t is None else (t.shape, t.stride(), t.dtype, align(t))
    key.append(tensors[0].device)
    return tuple(key)


def _rotation_fwd(angles: torch.Tensor, b: torch.Tensor, scale: Optional[torch.Tensor],
                  gamma: Optional[torch.Tensor], h0: Optional[torch.Tensor]) -> torch.Tensor:
    """The states (B, T, N, K); planned once per shape class (``common.planned``)."""
    run = common.planned(_key("fwd", angles, b, scale, gamma, h0), lambda: _plan_fwd(angles, b, scale, gamma, h0))
    return run(angles, b, scale, gamma, h0)


def _plan_fwd(angles, b, scale, gamma, h0):
    B, T, N, R, _ = angles.shape
    K = b.shape[-1]
    if B * T * N * K == 0:
        return lambda angles, b, scale, gamma, h0: b.new_empty((B, T, N, K))
    bn, nc, chunk = _geometry(B, T, N, K, b.device)
    grid = (B * nc, cdiv(N, bn))
    flags = dict(K=K, R=R, BN=bn, HAS_SCALE=scale is not None, HAS_GAMMA=gamma is not None,
                 I64=needs_int64(angles, b, scale, gamma, torch.empty((B, T, N, K), device="meta")),
                 num_warps=_warps(K), ONCE=_pair_once(bn, K))
    strides = (*_s(angles, 5), *_s(b, 4), *_s(scale, 3), *_s(gamma, 3))
    summary = common.Slot(_fwd_summary_kernel, grid, **flags) if nc > 1 else None
    main = common.Slot(_fwd_kernel, grid, HAS_H0=h0 is not None, HAS_CARRY=nc > 1, **flags)
    main_strides = (*strides, *_s(h0, 3))

    def run(angles, b, scale, gamma, h0):
        out = b.new_empty((B, T, N, K))
        sm = sv = None
        if summary is not None:  # each chunk's map, which the main pass folds into its carry-in
            sm = b.new_empty((B, nc, N, K, K), dtype=torch.float32)
            sv = b.new_empty((B, nc, N, K), dtype=torch.float32)
            summary(angles, b, scale, gamma, sm, sv, B, T, N, nc, chunk, *strides)
        main(angles, b, scale, gamma, h0, sm, sv, out, B, T, N, nc, chunk, *main_strides)
        return out
    return run


def _rotation_bwd(angles: torch.Tensor, scale: Optional[torch.Tensor], gamma: Optional[torch.Tensor],
                  h0: Optional[torch.Tensor], out: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(d angles, d b, d scale, d gamma, d h0; an absent input's grad is empty); planned as the forward."""
    g = g.contiguous()
    run = common.planned(_key("bwd", angles, scale, gamma, h0, out, g), lambda: _plan_bwd(angles, scale, gamma, h0, out))
    return run(angles, scale, gamma, h0, out, g)


def _plan_bwd(angles, scale, gamma, h0, out):
    B, T, N, R, P = angles.shape
    K = out.shape[-1]
    has_scale, has_gamma, has_h0 = scale is not None, gamma is not None, h0 is not None

    def outputs(angles, out):
        return (angles.new_empty((B, T, N, R, P)), out.new_empty((B, T, N, K)),
                out.new_empty((B, T, N) if has_scale else (0,)), out.new_empty((B, T, N) if has_gamma else (0,)),
                out.new_empty((B, N, K) if has_h0 else (0,)))

    if B * T * N * K == 0:
        def empty(angles, scale, gamma, h0, out, g):
            d_angles, d_b, d_scale, d_gamma, d_h0 = outputs(angles, out)
            return d_angles.zero_(), d_b, d_scale.zero_(), d_gamma.zero_(), d_h0.zero_()
        return empty
    bn, nc, chunk = _geometry(B, T, N, K, out.device)
    grid = (B * nc, cdiv(N, bn))
    flags = dict(K=K, R=R, BN=bn, HAS_SCALE=has_scale, HAS_GAMMA=has_gamma, num_warps=_warps(K),
                 ONCE=_pair_once(bn, K),
                 I64=needs_int64(angles, scale, gamma, out, torch.empty(out.shape, device="meta"),
                                 torch.empty(angles.shape, device="meta")))
    strides = (*_s(angles, 5), *_s(scale, 3), *_s(gamma, 3))
    summary = common.Slot(_bwd_summary_kernel, grid, **flags) if nc > 1 else None
    main = common.Slot(_bwd_kernel, grid, HAS_H0=has_h0, HAS_CARRY=nc > 1, **flags)
    main_strides = (*strides, *_s(h0, 3))

    def run(angles, scale, gamma, h0, out, g):
        d_angles, d_b, d_scale, d_gamma, d_h0 = outputs(angles, out)
        sm = sw = None
        if summary is not None:  # each chunk's backward map, which the main pass folds into its carry-in
            sm = out.new_empty((B, nc, N, K, K), dtype=torch.float32)
            sw = out.new_empty((B, nc, N, K), dtype=torch.float32)
            summary(angles, scale, gamma, g, sm, sw, B, T, N, nc, chunk, *strides)
        main(angles, scale, gamma, h0, out, g, sm, sw, d_angles, d_b, d_scale, d_gamma, d_h0, B, T, N, nc, chunk,
             *main_strides)
        return d_angles, d_b, d_scale, d_gamma, d_h0
    return run


rotation_scan_fwd = common.opaque_op("scankit::rotation_scan_fwd", _rotation_fwd)
rotation_scan_bwd = common.opaque_op("scankit::rotation_scan_bwd", _rotation_bwd)


@rotation_scan_fwd.register_fake
def _(angles, b, scale, gamma, h0):
    return _empty(b.shape[:3] + (b.shape[-1],), b)


@rotation_scan_bwd.register_fake
def _(angles, scale, gamma, h0, out, g):
    B, T, N, K = out.shape
    opt = lambda x, shape: _empty(shape if x is not None else (0,), out)  # noqa: E731
    return _empty(angles.shape, angles), _empty(out.shape, out), opt(scale, (B, T, N)), opt(gamma, (B, T, N)), opt(h0, (B, N, K))


def _setup(ctx, inputs, output):
    angles, _, scale, gamma, h0 = inputs
    ctx.has = (scale is not None, gamma is not None, h0 is not None)
    ctx.save_for_backward(angles, scale, gamma, h0, output)


def _backward(ctx, g):
    angles, scale, gamma, h0, out = ctx.saved_tensors
    if g is None:
        return None, None, None, None, None
    d_angles, d_b, d_scale, d_gamma, d_h0 = _rotation_bwd_call(angles, scale, gamma, h0, out, g)
    has_scale, has_gamma, has_h0 = ctx.has
    return d_angles, d_b, d_scale if has_scale else None, d_gamma if has_gamma else None, d_h0 if has_h0 else None


_rotation_bwd_call = either(rotation_scan_bwd, _rotation_bwd)
rotation_scan = with_autograd(rotation_scan_fwd, _rotation_fwd, _setup, _backward)
