"""Triton kernels for the block affine recurrences (``matrix_affine_scan``, ``matrix_scan``).

Layout (B, T, n, k, k) and (B, T, n, k, v). One program owns (batch, T-chunk, BN blocks)
and walks time keeping the (BN, k, k) running product and the (BN, k, v) state in
registers. Products whose sides are all >= 16 (``tl.dot``'s minimum: k = 16, and k of 9-15 in
their padded tiles, with the other side >= 16) run on the tensor cores at ``tf32x3`` (fp32-grade:
TF32's default would cost ~1e-3 relative error). Smaller products are broadcast multiply-sums
in fp32.
The backward walks t = T..1: ``G^_t = G_t + A_{t+1}^T G^_{t+1}``,
``dA_t = G^A_t Abar_{t-1}^T + G^B_t Bbar_{t-1}^T``, ``dB_t = G^B_t``, re-reading the saved
forward outputs. Long sequences with few lanes split T into chunks as in
``elementwise``: a summary pass, then the main pass, each program folding the summaries of
the chunks before it (after it, backward) into its carry-in. A scan from the end (REV) routes
every time-indexed address through ``lang.row``: the same walk over the memory rows backwards.
"""
import torch
import triton
import triton.language as tl
from . import common
from .common import Knobs, align, cdiv, needs_int64, next_pow2, num_chunks, on_gpu, prefix_scan_op
from .lang import program, row, when


@triton.jit
def _mm(x, y):
    """(BN, K, M) @ (BN, M, W) -> (BN, K, W): ``tl.dot`` at fp32 accuracy where every side is
    at least 16 (its minimum), else a broadcast multiply-sum."""
    if (x.shape[1] >= 16) and (x.shape[2] >= 16) and (y.shape[2] >= 16):
        return tl.dot(x, y, input_precision="tf32x3")
    else:
        return tl.sum(x[:, :, :, None] * y[:, None, :, :], axis=2)


@triton.jit
def _mm_t(x, y):
    """(BN, K, M) @ (BN, W, M)^T -> (BN, K, W)."""
    if (x.shape[1] >= 16) and (x.shape[2] >= 16) and (y.shape[1] >= 16):
        return tl.dot(x, tl.permute(y, (0, 2, 1)), input_precision="tf32x3")
    else:
        return tl.sum(x[:, :, None, :] * y[:, None, :, :], axis=3)


@triton.jit
def _offsets(n, rows, cols, s_n, s_r, s_c):
    return n[:, None, None] * s_n + rows[None, :, None] * s_r + cols[None, None, :] * s_c


@triton.jit
def _inside(rows, cols, R: tl.constexpr, C: tl.constexpr):
    """(1, rows, cols): the entries of an (R x C) block in a tile padded to powers of two."""
    return (rows[None, :, None] < R) & (cols[None, None, :] < C)


@triton.jit
def _on(m, inside, PAD: tl.constexpr):
    """The mask ``m`` of a tile's loads and stores, its padding (``inside``) off where k or v is not
    a power of two (PAD): padded entries load as 0, which the products keep 0, and are never stored."""
    if PAD:
        m = m & inside
    return m


@triton.jit
def _fold(sp_ptr, sb_ptr, sa_ptr, xa, xb, bi, first, step, count, NC, N, off_kk, off_kv, nmask, in_kk, in_kv,
          K: tl.constexpr, V: tl.constexpr, PAD: tl.constexpr, TRACK: tl.constexpr, ADD_A: tl.constexpr):
    """(xa, xb) carried through ``count`` chunk summaries (product sp, state from zero sb, and
    with ADD_A the second state's sa; slots (bi * NC + j) * N), chunks j = first, first + step,
    ...: a main-pass program's carry-in, forward (chunks 0 .. ci - 1; xa the running product
    when TRACK) or backward (chunks NC - 1 down to ci + 1; xa G^A when TRACK and ADD_A). The
    scan of the summaries, folded into the main pass."""
    for c in range(0, count):
        slot = (bi * NC + first + step * c) * N
        p = tl.load(sp_ptr + slot * K * K + off_kk, mask=_on(nmask, in_kk, PAD), other=0.0)
        xb = _mm(p, xb) + tl.load(sb_ptr + slot * K * V + off_kv, mask=_on(nmask, in_kv, PAD), other=0.0)
        if TRACK:
            xa = _mm(p, xa)
            if ADD_A:
                xa += tl.load(sa_ptr + slot * K * K + off_kk, mask=_on(nmask, in_kk, PAD), other=0.0)
    return xa, xb


@triton.jit
def _step_ab(a_ptr, b_ptr, a_rel, b_rel, t, T, sa_t, sb_t, mask, in_kk, in_kv, PAD: tl.constexpr, REV: tl.constexpr):
    """(A_t, b_t) of the forward's step t in fp32 (zeros where masked)."""
    r = row(t, T, REV)
    at = tl.load(a_ptr + r * sa_t + a_rel, mask=_on(mask, in_kk, PAD), other=0.0).to(tl.float32)
    bt = tl.load(b_ptr + r * sb_t + b_rel, mask=_on(mask, in_kv, PAD), other=0.0).to(tl.float32)
    return at, bt


@triton.jit
def _fwd_kernel(
    a_ptr, b_ptr, h0_ptr, carry_a_ptr, carry_b_ptr, out_a_ptr, out_b_ptr,
    T, N, NC, CHUNK, NBC,
    sa_b, sa_t, sa_n, sa_i, sa_j, sb_b, sb_t, sb_n, sb_i, sb_j, sh_b, sh_n, sh_i, sh_j,
    K: tl.constexpr, V: tl.constexpr, KB: tl.constexpr, VB: tl.constexpr, PAD: tl.constexpr, BN: tl.constexpr,
    HAS_H0: tl.constexpr, HAS_CARRY: tl.constexpr, TRACK_A: tl.constexpr, SUMMARY: tl.constexpr,
    I64: tl.constexpr, FOLD: tl.constexpr, REV: tl.constexpr,
):
    """Step t of the scan reads and writes memory row ``row(t, T, REV)`` (REV: from the end).
    Tiles are (BN, KB, KB) and (BN, KB, VB): k and v padded to powers of two (PAD: KB > K or VB > V)."""
    bi, ci, ni = program(NBC, NC, I64, FOLD)
    n = ni * BN + tl.arange(0, BN)
    ki, kj, vj = tl.arange(0, KB), tl.arange(0, KB), tl.arange(0, VB)
    nmask = (n < N)[:, None, None]
    in_kk, in_kv = _inside(ki, kj, K, K), _inside(ki, vj, K, V)
    off_kk = _offsets(n, ki, kj, K * K, K, 1)  # contiguous outputs / summaries
    off_kv = _offsets(n, ki, vj, K * V, V, 1)

    xa = tl.where(ki[None, :, None] == kj[None, None, :], 1.0, 0.0) + tl.zeros((BN, KB, KB), tl.float32)
    xb = tl.zeros((BN, KB, VB), tl.float32)
    if not SUMMARY:
        if HAS_H0:
            xb = tl.load(h0_ptr + bi * sh_b + _offsets(n, ki, vj, sh_n, sh_i, sh_j), mask=_on(nmask, in_kv, PAD),
                         other=0.0).to(tl.float32)
        if HAS_CARRY:
            xa, xb = _fold(carry_a_ptr, carry_b_ptr, None, xa, xb, bi, 0, 1, ci, NC, N, off_kk, off_kv, nmask,
                           in_kk, in_kv, K, V, PAD, TRACK_A, False)

    a_rel = bi * sa_b + _offsets(n, ki, kj, sa_n, sa_i, sa_j)
    b_rel = bi * sb_b + _offsets(n, ki, vj, sb_n, sb_i, sb_j)
    t0 = ci * CHUNK
    # each step's (A_t, b_t) is loaded one step ahead (register prefetch): its memory latency
    # overlaps the step before instead of stalling the state's dependent chain every step
    at, bt = _step_ab(a_ptr, b_ptr, a_rel, b_rel, t0, T, sa_t, sb_t, when(t0 < T, nmask), in_kk, in_kv, PAD, REV)
    for j in range(0, CHUNK):
        t = t0 + j
        m = when(t < T, nmask)
        r = row(t, T, REV)
        at_next, bt_next = _step_ab(a_ptr, b_ptr, a_rel, b_rel, t + 1, T, sa_t, sb_t,
                                    when((t + 1 < T) & (j + 1 < CHUNK), nmask), in_kk, in_kv, PAD, REV)
        # rows past T keep the state: A = 0 there, so blend instead of multiplying
        xb = tl.where(m, _mm(at, xb) + bt, xb)
        if TRACK_A:
            xa = tl.where(m, _mm(at, xa), xa)
        if not SUMMARY:
            at_row = (bi * T + r) * N
            tl.store(out_b_ptr + at_row * K * V + off_kv, xb.to(out_b_ptr.dtype.element_ty), mask=_on(m, in_kv, PAD))
            if TRACK_A:
                tl.store(out_a_ptr + at_row * K * K + off_kk, xa.to(out_a_ptr.dtype.element_ty),
                         mask=_on(m, in_kk, PAD))
        at, bt = at_next, bt_next
    if SUMMARY:
        side = (bi * NC + ci) * N
        tl.store(out_a_ptr + side * K * K + off_kk, xa, mask=_on(nmask, in_kk, PAD))
        tl.store(out_b_ptr + side * K * V + off_kv, xb, mask=_on(nmask, in_kv, PAD))


# Lane blocks (the backward of k x k, 3 <= k <= LANE_BLOCKS["max_k"]): one lane per block, the block and its
# state held as tuples of lane vectors (element (i, j) at index i * cols + j), so a step is k^2
# (or, tracking the running product, k^3) fused multiply-adds in one thread: no shuffles, no
# barriers, no layout conversions on the state's dependent chain (the generic kernels spread a
# block over 64 threads and reduce across them every step).


@triton.jit
def _ldk(p, s_i, s_j, mask, ROWS: tl.constexpr, COLS: tl.constexpr):
    """A (ROWS x COLS) block per lane, element (i, j) at p + i s_i + j s_j, as a tuple of fp32
    lane vectors (zeros where masked)."""
    x = ()
    for e in tl.static_range(ROWS * COLS):
        x = x + (tl.load(p + (e // COLS) * s_i + (e % COLS) * s_j, mask=mask, other=0.0).to(tl.float32),)
    return x


@triton.jit
def _stk(p, x, mask, SIZE: tl.constexpr):
    """Store a lane-block tuple row-major contiguous (SIZE elements a lane, from p), in p's dtype."""
    for e in tl.static_range(SIZE):
        tl.store(p + e, x[e].to(p.dtype.element_ty), mask=mask)


@triton.jit
def _prodk(a, x, R: tl.constexpr, M: tl.constexpr, C: tl.constexpr, A_R: tl.constexpr, A_M: tl.constexpr,
           X_M: tl.constexpr, X_C: tl.constexpr):
    """Per lane, the (R x C) product sum_m a[r A_R + m A_M] x[m X_M + c X_C] of two tuples (the
    strides pick a block or its transpose), row-major."""
    z = ()
    for e in tl.static_range(R * C):
        acc = a[(e // C) * A_R] * x[(e % C) * X_C]
        for m in tl.static_range(1, M):
            acc += a[(e // C) * A_R + m * A_M] * x[m * X_M + (e % C) * X_C]
        z = z + (acc,)
    return z


@triton.jit
def _mmk(a, x, K: tl.constexpr, COLS: tl.constexpr):
    """a @ x per lane: a (K x K), x (K x COLS), both tuples."""
    return _prodk(a, x, K, K, COLS, K, 1, COLS, 1)


@triton.jit
def _mmtk(a, x, K: tl.constexpr, COLS: tl.constexpr):
    """a^T @ x per lane: a (K x K), x (K x COLS), both tuples."""
    return _prodk(a, x, K, K, COLS, 1, K, COLS, 1)


@triton.jit
def _mm_tk(x, y, K: tl.constexpr, COLS: tl.constexpr):
    """x @ y^T per lane: x, y (K x COLS) tuples -> (K x K)."""
    return _prodk(x, y, K, COLS, K, COLS, 1, 1, COLS)


@triton.jit
def _blendk(mask, x, y, SIZE: tl.constexpr):
    """x where ``mask``, else y (tuples)."""
    z = ()
    for e in tl.static_range(SIZE):
        z = z + (tl.where(mask, x[e], y[e]),)
    return z


@triton.jit
def _addk(x, y, SIZE: tl.constexpr):
    z = ()
    for e in tl.static_range(SIZE):
        z = z + (x[e] + y[e],)
    return z


@triton.jit
def _eyek(like, K: tl.constexpr):
    """The identity block per lane (a tuple), lane vectors shaped as ``like``."""
    x = ()
    for e in tl.static_range(K * K):
        x = x + (tl.full(like.shape, 1.0 if e // K == e % K else 0.0, tl.float32),)
    return x


@triton.jit
def _bwdk_kernel(
    a_ptr, h0_ptr, gb_ptr, ga_ptr, outb_ptr, outa_ptr, carry_b_ptr, carry_a_ptr,
    da_ptr, db_ptr, dh0_ptr, sum_p_ptr,
    T, N, NC, CHUNK, NBC,
    sa_b, sa_t, sa_n, sa_i, sa_j, sh_b, sh_n, sh_i, sh_j,
    K: tl.constexpr, V: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_H0: tl.constexpr, HAS_GA: tl.constexpr, HAS_CARRY: tl.constexpr, SUMMARY: tl.constexpr,
    I64: tl.constexpr, FOLD: tl.constexpr, REV: tl.constexpr,
):
    """``_bwd_kernel`` with lane blocks (one lane per k x k block, walked step by step, its
    state and grads in registers as tuples): G^_t = A_{t+1}^T G^_{t+1} + g_t
    (and the running product's G^A the same way), dA_t = G^_t h_{t-1}^T (+ G^A_t Abar_{t-1}^T),
    dB_t = G^_t; t descending, the chunks after this one folded in from their summaries."""
    bi, ci, ni = program(NBC, NC, I64, FOLD)
    n = ni * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < N
    side = (bi * NC + ci) * N + n
    zero = tl.zeros((BLOCK_N,), tl.float32)
    eye = _eyek(zero, K)
    g = ()
    for e in tl.static_range(K * V):
        g = g + (zero,)
    q = ()  # G^A
    for e in tl.static_range(K * K):
        q = q + (zero,)
    prod = eye  # the product of the A^T (summary)
    if HAS_CARRY:  # the chunks after this one, last first: (product of A^T, G^ and G^A from zero)
        for f in range(0, NC - 1 - ci):
            slot = (bi * NC + NC - 1 - f) * N + n
            sp = _ldk(sum_p_ptr + slot * K * K, K, 1, nmask, K, K)
            g = _addk(_mmk(sp, g, K, V), _ldk(carry_b_ptr + slot * K * V, V, 1, nmask, K, V), K * V)
            if HAS_GA:
                q = _addk(_mmk(sp, q, K, K), _ldk(carry_a_ptr + slot * K * K, K, 1, nmask, K, K), K * K)
    a_lanes = a_ptr + bi * sa_b + n * sa_n
    for j in range(0, CHUNK):
        t = ci * CHUNK + CHUNK - 1 - j  # descending time
        m = when(t < T, nmask)
        an = _ldk(a_lanes + row(t + 1, T, REV) * sa_t, sa_i, sa_j, when(t + 1 < T, m), K, K)  # A_{t+1}
        at_row = (bi * T + row(t, T, REV)) * N + n
        before = (bi * T + row(t - 1, T, REV)) * N + n  # the previous step's outputs
        g = _blendk(m, _addk(_mmtk(an, g, K, V), _ldk(gb_ptr + at_row * K * V, V, 1, m, K, V), K * V), g, K * V)
        if HAS_GA:
            q = _blendk(m, _addk(_mmtk(an, q, K, K), _ldk(ga_ptr + at_row * K * K, K, 1, m, K, K), K * K), q, K * K)
        if SUMMARY:
            prod = _blendk(m, _mmtk(an, prod, K, K), prod, K * K)
        else:
            prev = when(t > 0, m)
            hp = _ldk(outb_ptr + before * K * V, V, 1, prev, K, V)
            if HAS_H0:
                hp = _addk(hp, _ldk(h0_ptr + bi * sh_b + n * sh_n, sh_i, sh_j, when(t == 0, m), K, V), K * V)
            da = _mm_tk(g, hp, K, V)
            if HAS_GA:  # + G^A Abar_{t-1}^T, Abar_{-1} = I
                ap = _blendk(t == 0, eye, _ldk(outa_ptr + before * K * K, K, 1, prev, K, K), K * K)
                da = _addk(da, _mm_tk(q, ap, K, K), K * K)
            _stk(da_ptr + at_row * K * K, da, m, K * K)
            _stk(db_ptr + at_row * K * V, g, m, K * V)
    if SUMMARY:
        _stk(sum_p_ptr + side * K * K, prod, nmask, K * K)
        _stk(carry_b_ptr + side * K * V, g, nmask, K * V)
        if HAS_GA:
            _stk(carry_a_ptr + side * K * K, q, nmask, K * K)
    elif HAS_H0:
        if ci == 0:  # dL/dh_0 = A_0^T G^_0
            a0 = _ldk(a_lanes + row(0, T, REV) * sa_t, sa_i, sa_j, nmask, K, K)
            _stk(dh0_ptr + (bi * N + n) * K * V, _mmtk(a0, g, K, V), nmask, K * V)


@triton.jit
def _ld2(p, stride, mask, o0, o1):
    """Two fp32 lane vectors at p and p + stride (2-vectors of the 2x2 kernels)."""
    return (tl.load(p, mask=mask, other=o0).to(tl.float32), tl.load(p + stride, mask=mask, other=o1).to(tl.float32))


@triton.jit
def _ld4(p, s_i, s_j, mask, o00, o01, o10, o11):
    """A 2x2 block per lane, element (i, j) at p + i s_i + j s_j, in fp32."""
    x00, x01 = _ld2(p, s_j, mask, o00, o01)
    x10, x11 = _ld2(p + s_i, s_j, mask, o10, o11)
    return x00, x01, x10, x11


@triton.jit
def _lanes(batch_off, n, s_n, SIZE: tl.constexpr, VEC: tl.constexpr):
    """Offsets of the lanes' blocks (``SIZE`` elements each) in a batch row: with VEC (the
    blocks contiguous, every row and batch offset a multiple of SIZE: ``_contiguous_blocks``)
    written so that Triton sees the multiples, which its wide loads need."""
    if VEC:
        off = tl.multiple_of(batch_off, SIZE) + n * SIZE
    else:
        off = batch_off + n * s_n
    return off


@triton.jit
def _ld2c(p, mask, o0, o1):
    """``_ld2`` of a contiguous 2-vector per lane: one (lanes, 2) tile, one 8-byte load a lane
    (fp32) where the offsets are known even."""
    q = tl.arange(0, 2)
    x = tl.load(p[:, None] + q[None, :], mask=mask[:, None], other=tl.where(q == 0, o0, o1)[None, :])
    return tl.split(x.to(tl.float32))


@triton.jit
def _ld4c(p, mask, o00, o01, o10, o11):
    """``_ld4`` of a row-major contiguous 2x2 block per lane: one (lanes, 4) tile, one 16-byte
    load a lane (fp32) where the offsets are known multiples of 4."""
    q = tl.arange(0, 4)
    other = tl.where(q == 0, o00, tl.where(q == 1, o01, tl.where(q == 2, o10, o11)))
    x = tl.load(p[:, None] + q[None, :], mask=mask[:, None], other=other[None, :]).to(tl.float32)
    c0, c1 = tl.split(tl.reshape(x, (x.shape[0], 2, 2)))  # [lane, i, j] -> j = 0, 1
    x00, x10 = tl.split(c0)
    x01, x11 = tl.split(c1)
    return x00, x01, x10, x11


@triton.jit
def _st2(p, x0, x1, mask):
    """Store a 2-vector per lane, contiguous, in p's dtype: one (lanes, 2) tile (one 8-byte
    store a lane in fp32, not two scalar ones)."""
    q = tl.arange(0, 2)
    tl.store(p[:, None] + q[None, :], tl.join(x0, x1).to(p.dtype.element_ty), mask=mask[:, None])


@triton.jit
def _st4(p, x00, x01, x10, x11, mask):
    """Store a 2x2 block per lane, row-major contiguous, in p's dtype: one (lanes, 4) tile
    (one 16-byte store a lane in fp32, not four scalar ones)."""
    x = tl.join(tl.join(x00, x10), tl.join(x01, x11))  # [lane, i, j]
    q = tl.arange(0, 4)
    tl.store(p[:, None] + q[None, :], tl.reshape(x, (x.shape[0], 4)).to(p.dtype.element_ty), mask=mask[:, None])


@triton.jit
def _mm2(a00, a01, a10, a11, x00, x01, x10, x11):
    """A X for 2x2 blocks held per lane (pass A's entries transposed for A^T X)."""
    return a00 * x00 + a01 * x10, a00 * x01 + a01 * x11, a10 * x00 + a11 * x10, a10 * x01 + a11 * x11


@triton.jit
def _fold2(sp_ptr, sb_ptr, sa_ptr, a00, a01, a10, a11, x0, x1, bi, first, step, count, NC, N, n, nmask,
           TRACK: tl.constexpr, ADD_A: tl.constexpr):
    """``_fold`` for the 2x2 kernels' per-lane (2x2 a, 2-vector x): summaries at (bi * NC + j) * N + n."""
    for c in range(0, count):
        slot = (bi * NC + first + step * c) * N + n
        s00, s01, s10, s11 = _ld4c(sp_ptr + slot * 4, nmask, 0.0, 0.0, 0.0, 0.0)
        y0, y1 = _ld2c(sb_ptr + slot * 2, nmask, 0.0, 0.0)
        x0, x1 = s00 * x0 + s01 * x1 + y0, s10 * x0 + s11 * x1 + y1
        if TRACK:
            a00, a01, a10, a11 = _mm2(s00, s01, s10, s11, a00, a01, a10, a11)
            if ADD_A:
                u00, u01, u10, u11 = _ld4c(sa_ptr + slot * 4, nmask, 0.0, 0.0, 0.0, 0.0)
                a00, a01, a10, a11 = a00 + u00, a01 + u01, a10 + u10, a11 + u11
    return a00, a01, a10, a11, x0, x1


@triton.jit
def _fwd2_kernel(
    a_ptr, b_ptr, h0_ptr, carry_a_ptr, carry_b_ptr, out_a_ptr, out_b_ptr,
    T, N, NC, CHUNK, NBC,
    sa_b, sa_t, sa_n, sa_i, sa_j, sb_b, sb_t, sb_n, sb_i, sh_b, sh_n, sh_i,
    HAS_H0: tl.constexpr, HAS_CARRY: tl.constexpr, TRACK_A: tl.constexpr, SUMMARY: tl.constexpr,
    I64: tl.constexpr, FOLD: tl.constexpr, BLOCK_N: tl.constexpr, STAGES: tl.constexpr, REV: tl.constexpr,
    VEC: tl.constexpr,
):
    """k = 2, v = 1 (``matrix_scan``): one lane per 2x2 block, its six numbers (M, v) and
    running (Abar, h) in registers as plain vectors, walked step by step (no per-step layout
    changes, unlike the generic kernel's broadcast products); parallelism from many lanes and
    T-chunks, latency hidden by many resident warps and the pipelined loop. Step t at memory
    row ``row(t, T, REV)``."""
    bi, ci, ni = program(NBC, NC, I64, FOLD)
    n = ni * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < N
    side = (bi * NC + ci) * N + n  # (B, NC, N) summary / carry slot
    one = tl.full((BLOCK_N,), 1.0, tl.float32)
    zero = tl.zeros((BLOCK_N,), tl.float32)
    p00, p01, p10, p11 = one, zero, zero, one
    h0, h1 = zero, zero
    if not SUMMARY:
        if HAS_H0:
            h0, h1 = _ld2(h0_ptr + bi * sh_b + n * sh_n, sh_i, nmask, 0.0, 0.0)
        if HAS_CARRY:
            p00, p01, p10, p11, h0, h1 = _fold2(carry_a_ptr, carry_b_ptr, None, p00, p01, p10, p11, h0, h1,
                                                bi, 0, 1, ci, NC, N, n, nmask, TRACK_A, False)
    pa = a_ptr + _lanes(bi * sa_b, n, sa_n, 4, VEC)
    pb = b_ptr + _lanes(bi * sb_b, n, sb_n, 2, VEC)
    for j in tl.range(0, CHUNK, num_stages=STAGES):
        t = ci * CHUNK + j
        m = when(t < T, nmask)  # steps past T are identity steps
        r = row(t, T, REV)
        if VEC:
            m00, m01, m10, m11 = _ld4c(pa + tl.multiple_of(r * sa_t, 4), m, 1.0, 0.0, 0.0, 1.0)
            x0, x1 = _ld2c(pb + tl.multiple_of(r * sb_t, 2), m, 0.0, 0.0)
        else:
            m00, m01, m10, m11 = _ld4(pa + r * sa_t, sa_i, sa_j, m, 1.0, 0.0, 0.0, 1.0)
            x0, x1 = _ld2(pb + r * sb_t, sb_i, m, 0.0, 0.0)
        h0, h1 = m00 * h0 + m01 * h1 + x0, m10 * h0 + m11 * h1 + x1
        if TRACK_A:
            p00, p01, p10, p11 = _mm2(m00, m01, m10, m11, p00, p01, p10, p11)
        if not SUMMARY:
            at_row = (bi * T + r) * N + n
            _st2(out_b_ptr + at_row * 2, h0, h1, m)
            if TRACK_A:
                _st4(out_a_ptr + at_row * 4, p00, p01, p10, p11, m)
    if SUMMARY:
        _st4(out_a_ptr + side * 4, p00, p01, p10, p11, nmask)
        _st2(out_b_ptr + side * 2, h0, h1, nmask)


@triton.jit
def _bwd_step_loads(a_ptr, gb_ptr, ga_ptr, outb_ptr, outa_ptr, a_rel_t, off_kk, off_kv, bi, t, T, N, sa_t, m,
                    in_kk, in_kv, K: tl.constexpr, V: tl.constexpr, PAD: tl.constexpr, HAS_GA: tl.constexpr,
                    SUMMARY: tl.constexpr, REV: tl.constexpr):
    """The backward's loads for step t (fp32, zeros where masked): A_{t+1}^T, the output grads
    g_t (and g^A_t with HAS_GA), and, outside the summary pass, the outputs of step t - 1 (h_{t-1},
    Abar_{t-1}); the ones a variant does not use are zeros."""
    m_kk, m_kv = _on(m, in_kk, PAD), _on(m, in_kv, PAD)
    c = tl.load(a_ptr + row(t + 1, T, REV) * sa_t + a_rel_t, mask=when(t + 1 < T, m_kk), other=0.0).to(tl.float32)
    at_row = (bi * T + row(t, T, REV)) * N
    before = (bi * T + row(t - 1, T, REV)) * N  # the previous step's outputs
    u = tl.load(gb_ptr + at_row * K * V + off_kv, mask=m_kv, other=0.0).to(tl.float32)
    ua = tl.zeros(c.shape, tl.float32)
    prev_b = tl.zeros(u.shape, tl.float32)
    prev_a = tl.zeros(c.shape, tl.float32)
    if HAS_GA:
        ua = tl.load(ga_ptr + at_row * K * K + off_kk, mask=m_kk, other=0.0).to(tl.float32)
    if not SUMMARY:
        prev_b = tl.load(outb_ptr + before * K * V + off_kv, mask=when(t > 0, m_kv), other=0.0).to(tl.float32)
        if HAS_GA:
            prev_a = tl.load(outa_ptr + before * K * K + off_kk, mask=when(t > 0, m_kk), other=0.0).to(tl.float32)
    return c, u, ua, prev_b, prev_a


@triton.jit
def _bwd_kernel(
    a_ptr, h0_ptr, gb_ptr, ga_ptr, outb_ptr, outa_ptr, carry_b_ptr, carry_a_ptr,
    da_ptr, db_ptr, dh0_ptr, sum_p_ptr,
    T, N, NC, CHUNK, NBC,
    sa_b, sa_t, sa_n, sa_i, sa_j, sh_b, sh_n, sh_i, sh_j,
    K: tl.constexpr, V: tl.constexpr, KB: tl.constexpr, VB: tl.constexpr, PAD: tl.constexpr, BN: tl.constexpr,
    HAS_H0: tl.constexpr, HAS_GA: tl.constexpr, HAS_CARRY: tl.constexpr, SUMMARY: tl.constexpr,
    I64: tl.constexpr, FOLD: tl.constexpr, REV: tl.constexpr,
):
    """Steps t, t + 1, t - 1 of the scan at memory rows ``row(., T, REV)`` (REV: from the end).
    Tiles padded to powers of two as in ``_fwd_kernel``."""
    bi, ci, ni = program(NBC, NC, I64, FOLD)
    n = ni * BN + tl.arange(0, BN)
    ki, kj, vj = tl.arange(0, KB), tl.arange(0, KB), tl.arange(0, VB)
    nmask = (n < N)[:, None, None]
    in_kk, in_kv = _inside(ki, kj, K, K), _inside(ki, vj, K, V)
    off_kk = _offsets(n, ki, kj, K * K, K, 1)
    off_kv = _offsets(n, ki, vj, K * V, V, 1)
    eye = tl.where(ki[None, :, None] == kj[None, None, :], 1.0, 0.0) + tl.zeros((BN, KB, KB), tl.float32)
    side = (bi * NC + ci) * N

    gb = tl.zeros((BN, KB, VB), tl.float32)
    ga = tl.zeros((BN, KB, KB), tl.float32)
    prod = eye
    if HAS_CARRY:
        ga, gb = _fold(sum_p_ptr, carry_b_ptr, carry_a_ptr, ga, gb, bi, NC - 1, -1, NC - 1 - ci, NC, N, off_kk,
                       off_kv, nmask, in_kk, in_kv, K, V, PAD, HAS_GA, True)

    a_rel_t = bi * sa_b + _offsets(n, ki, kj, sa_n, sa_j, sa_i)  # A^T
    t_hi = ci * CHUNK + CHUNK - 1
    # each step's loads are made one step ahead (register prefetch), as in the forward
    c, u, ua, prev_b, prev_a = _bwd_step_loads(a_ptr, gb_ptr, ga_ptr, outb_ptr, outa_ptr, a_rel_t, off_kk, off_kv,
                                               bi, t_hi, T, N, sa_t, when(t_hi < T, nmask), in_kk, in_kv, K, V,
                                               PAD, HAS_GA, SUMMARY, REV)
    for j in range(0, CHUNK):
        t = t_hi - j  # descending time
        m = when(t < T, nmask)
        nxt = _bwd_step_loads(a_ptr, gb_ptr, ga_ptr, outb_ptr, outa_ptr, a_rel_t, off_kk, off_kv, bi, t - 1, T, N,
                              sa_t, when((t - 1 < T) & (j + 1 < CHUNK), nmask), in_kk, in_kv, K, V, PAD, HAS_GA,
                              SUMMARY, REV)
        at_row = (bi * T + row(t, T, REV)) * N
        gb = tl.where(m, _mm(c, gb) + u, gb)
        if HAS_GA:
            ga = tl.where(m, _mm(c, ga) + ua, ga)
        if SUMMARY:
            prod = tl.where(m, _mm(c, prod), prod)
        else:
            first = t == 0
            if HAS_H0:
                h0 = tl.load(h0_ptr + bi * sh_b + _offsets(n, ki, vj, sh_n, sh_i, sh_j),
                             mask=_on(when(first, m), in_kv, PAD), other=0.0)
                prev_b += h0.to(tl.float32)
            da = _mm_t(gb, prev_b)
            if HAS_GA:
                da += _mm_t(ga, tl.where(first, eye, prev_a))
            tl.store(da_ptr + at_row * K * K + off_kk, da.to(da_ptr.dtype.element_ty), mask=_on(m, in_kk, PAD))
            tl.store(db_ptr + at_row * K * V + off_kv, gb.to(db_ptr.dtype.element_ty), mask=_on(m, in_kv, PAD))
        c, u, ua, prev_b, prev_a = nxt
    if SUMMARY:
        tl.store(sum_p_ptr + side * K * K + off_kk, prod, mask=_on(nmask, in_kk, PAD))
        tl.store(carry_b_ptr + side * K * V + off_kv, gb, mask=_on(nmask, in_kv, PAD))
        if HAS_GA:
            tl.store(carry_a_ptr + side * K * K + off_kk, ga, mask=_on(nmask, in_kk, PAD))
    elif HAS_H0:
        if ci == 0:  # dL/dh_0 = A_1^T G^_1
            a0t = tl.load(a_ptr + row(0, T, REV) * sa_t + a_rel_t, mask=_on(nmask, in_kk, PAD), other=0.0).to(tl.float32)
            tl.store(dh0_ptr + bi * N * K * V + off_kv, _mm(a0t, gb).to(dh0_ptr.dtype.element_ty),
                     mask=_on(nmask, in_kv, PAD))


@triton.jit
def _bwd2_kernel(
    a_ptr, h0_ptr, gb_ptr, ga_ptr, outb_ptr, outa_ptr, carry_b_ptr, carry_a_ptr,
    da_ptr, db_ptr, dh0_ptr, sum_p_ptr,
    T, N, NC, CHUNK, NBC,
    sa_b, sa_t, sa_n, sa_i, sa_j, sh_b, sh_n, sh_i, sh_j,
    HAS_H0: tl.constexpr, HAS_GA: tl.constexpr, HAS_CARRY: tl.constexpr, SUMMARY: tl.constexpr,
    I64: tl.constexpr, FOLD: tl.constexpr, BLOCK_N: tl.constexpr, STAGES: tl.constexpr, REV: tl.constexpr,
    VEC: tl.constexpr,
):
    """``_bwd_kernel`` for k = 2, v = 1, one lane per 2x2 block as plain vectors (like
    ``_fwd2_kernel``): G^_t = A_{t+1}^T G^_{t+1} + g_t (and the same for the running
    product's grad), dA_t = G^_t h_{t-1}^T (+ G^A_t Abar_{t-1}^T), dB_t = G^_t."""
    bi, ci, ni = program(NBC, NC, I64, FOLD)
    n = ni * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < N
    side = (bi * NC + ci) * N + n
    zero = tl.zeros((BLOCK_N,), tl.float32)
    one = tl.full((BLOCK_N,), 1.0, tl.float32)
    g0, g1 = zero, zero
    q00, q01, q10, q11 = zero, zero, zero, zero  # G^A
    p00, p01, p10, p11 = one, zero, zero, one  # product of the A^T (summary)
    if HAS_CARRY:
        q00, q01, q10, q11, g0, g1 = _fold2(sum_p_ptr, carry_b_ptr, carry_a_ptr, q00, q01, q10, q11, g0, g1,
                                            bi, NC - 1, -1, NC - 1 - ci, NC, N, n, nmask, HAS_GA, True)
    pa = a_ptr + _lanes(bi * sa_b, n, sa_n, 4, VEC)
    for j in tl.range(0, CHUNK, num_stages=STAGES):
        t = ci * CHUNK + CHUNK - 1 - j  # descending time
        m = when(t < T, nmask)
        nxt = when(t + 1 < T, m)
        if VEC:
            m00, m01, m10, m11 = _ld4c(pa + tl.multiple_of(row(t + 1, T, REV) * sa_t, 4), nxt, 0.0, 0.0, 0.0, 0.0)
        else:
            m00, m01, m10, m11 = _ld4(pa + row(t + 1, T, REV) * sa_t, sa_i, sa_j, nxt, 0.0, 0.0, 0.0, 0.0)
        at_row = (bi * T + row(t, T, REV)) * N + n
        before = (bi * T + row(t - 1, T, REV)) * N + n  # the previous step's outputs
        u0, u1 = _ld2c(gb_ptr + at_row * 2, m, 0.0, 0.0)
        g0, g1 = tl.where(m, m00 * g0 + m10 * g1 + u0, g0), tl.where(m, m01 * g0 + m11 * g1 + u1, g1)
        if HAS_GA:
            v00, v01, v10, v11 = _ld4c(ga_ptr + at_row * 4, m, 0.0, 0.0, 0.0, 0.0)
            n00, n01, n10, n11 = _mm2(m00, m10, m01, m11, q00, q01, q10, q11)  # A^T G^A
            q00, q01 = tl.where(m, n00 + v00, q00), tl.where(m, n01 + v01, q01)
            q10, q11 = tl.where(m, n10 + v10, q10), tl.where(m, n11 + v11, q11)
        if SUMMARY:
            n00, n01, n10, n11 = _mm2(m00, m10, m01, m11, p00, p01, p10, p11)
            p00, p01 = tl.where(m, n00, p00), tl.where(m, n01, p01)
            p10, p11 = tl.where(m, n10, p10), tl.where(m, n11, p11)
        else:
            prev = when(t > 0, m)
            h0, h1 = _ld2c(outb_ptr + before * 2, prev, 0.0, 0.0)
            if HAS_H0:
                i0, i1 = _ld2(h0_ptr + bi * sh_b + n * sh_n, sh_i, when(t == 0, m), 0.0, 0.0)
                h0, h1 = h0 + i0, h1 + i1
            d00, d01, d10, d11 = g0 * h0, g0 * h1, g1 * h0, g1 * h1
            if HAS_GA:  # + G^A Abar_{t-1}^T, Abar_{-1} = I
                r00, r01, r10, r11 = _ld4c(outa_ptr + before * 4, prev, 1.0, 0.0, 0.0, 1.0)
                d00 += q00 * r00 + q01 * r01
                d01 += q00 * r10 + q01 * r11
                d10 += q10 * r00 + q11 * r01
                d11 += q10 * r10 + q11 * r11
            _st4(da_ptr + at_row * 4, d00, d01, d10, d11, m)
            _st2(db_ptr + at_row * 2, g0, g1, m)
    if SUMMARY:
        _st4(sum_p_ptr + side * 4, p00, p01, p10, p11, nmask)
        _st2(carry_b_ptr + side * 2, g0, g1, nmask)
        if HAS_GA:
            _st4(carry_a_ptr + side * 4, q00, q01, q10, q11, nmask)
    elif HAS_H0:
        if ci == 0:  # dL/dh_0 = A_0^T G^_0
            a00, a01, a10, a11 = _ld4(pa + row(0, T, REV) * sa_t, sa_i, sa_j, nmask, 0.0, 0.0, 0.0, 0.0)
            _st2(dh0_ptr + (bi * N + n) * 2, a00 * g0 + a10 * g1, a01 * g0 + a11 * g1, nmask)


# Launch knobs of the block kernels on the GPU (scripts/tune_scans.py sweeps them):
# elements of the per-step (BN, K, K, max(K, V)) product, shortest T-chunk, warps per program.
# H200 sweep (experiments/logs/2026-11-30-h200-tune-scans-run7.json): one block per program
# and 2 warps take matrix_affine_scan (k=8) large fwd from 13.8 to 5.1 ms. One warp: the k = 8
# block's state then never crosses warps (no barriers, no shared-memory round trip per step;
# experiments/logs/2026-12-05-cpu-s24-block-sync-probe.txt), and on the H100 k = 8 fwd goes
# 5.04 -> 2.68 ms, fwd+bwd 12.2 -> 8.7 ms, states-only (1, 65536) 0.42x
# (experiments/logs/2026-12-06-h100-s25-ab-one-warp.txt).
TUNING = Knobs({"product_elems": 512, "min_chunk": 32, "num_warps": 1})


def _block_lanes(N: int, K: int, V: int) -> int:
    """Blocks per program: keep the (BN, K, K, max(K, V)) product (k and v padded to powers of
    two, as the tiles are) near TUNING's size."""
    K, V = next_pow2(K), next_pow2(V)
    return max(1, min(next_pow2(N), 32, TUNING["product_elems"] // (K * K * max(K, V))))


def _tiles(K: int, V: int) -> dict:
    """The generic kernels' block constants: k, v, their tiles' sizes (powers of two) and PAD."""
    KB, VB = next_pow2(K), next_pow2(V)
    return dict(K=K, V=V, KB=KB, VB=VB, PAD=(KB, VB) != (K, V))


def _warps(device) -> int:
    return TUNING["num_warps"] if on_gpu(device) else 1


def _geometry(A, V):
    B, T, N, K, _ = A.shape
    bn = _block_lanes(N, K, V)
    min_chunk = TUNING["min_chunk"] if on_gpu(A.device) else 4
    return (bn, *_split(T, num_chunks(B * cdiv(N, bn), T, min_chunk, A.device, family="affine")))


def _split(T: int, nc: int) -> tuple[int, int]:
    """(chunks, chunk length) of T cut into at most ``nc`` equal chunks."""
    chunk = cdiv(T, nc)
    return cdiv(T, chunk), chunk


def _s(x, dims=5):
    return tuple(x.stride()) if x is not None else (0,) * dims


# The 2x2 kernels (matrix_scan, k = 2, v = 1): lanes per program, warps, programs per SM
# they aim at when chunking T, shortest chunk, pipelining depth of the step loop, and the
# shortest T they take on the GPU. H200 sweeps (NOTES.md, session 4; runs 13-15): the 2x2
# kernels took matrix_scan large fwd from 700-1280 to 370-620 us (generic, same run) and fwd+bwd
# from 2959 to 1702 us (run 15, 32 lanes, 1 warp, 32 per SM). Below T = 256 ("min_t") the
# generic kernels' single pass runs: session 18 gave the 2x2 kernels every T (c50bd40; asv,
# 070f538 -> c50bd40, lab device time fwd 27.5 -> 18.0 us, fwd+bwd 84.5 -> 39.1), but their
# chunked path makes 2 / 4 launches where the generic one makes 1 / 2, and lab's call latency
# went 142.0 -> 198.6 us (fwd), 645.2 -> 978.0 (fwd+bwd): at host-bound shapes that is what a
# caller feels. They take every T once they run lab in one launch (issue 15).
TWO_BY_TWO = Knobs({"enabled": True, "block_n": 32, "num_warps": 1, "per_sm": 32, "min_chunk": 16, "stages": None,
              "min_t": 256})


def _two_by_two(A, V: int) -> bool:
    """Whether the 2x2 kernels run this (k = 2, v = 1) scan; on the GPU only from
    TWO_BY_TWO["min_t"] steps (below it the generic kernel's single pass costs less)."""
    K, T = A.shape[3], A.shape[1]
    return TWO_BY_TWO["enabled"] and K == 2 and V == 1 and (T >= TWO_BY_TWO["min_t"] or not on_gpu(A.device))


def _geometry_2x2(A):
    """(lanes per program, chunks, chunk length) of the 2x2 kernels."""
    B, T, N = A.shape[:3]
    gpu = on_gpu(A.device)
    bn = TWO_BY_TWO["block_n"] if gpu else 16
    nc = num_chunks(B * cdiv(N, bn), T, TWO_BY_TWO["min_chunk"] if gpu else 4, A.device, family="affine",
                    per_sm=TWO_BY_TWO["per_sm"])
    return (bn, *_split(T, nc))


# Lane blocks (``_bwdk_kernel``): the backward of the k x k scans (3 <= k <= "max_k") where a
# lane's values fit in registers ("max_values": k^2 of the step's block, of the running product's
# grad where there is one and of the chunk's product, 3 k v of grads and states); lanes per
# program, warps, programs per SM aimed at when chunking T and the shortest chunk, as the 2x2
# kernels'. Fewer, longer chunks than theirs: a main-pass program folds every summary before its
# chunk, a k x k product each (a step's worth). From A/Bs against the generic kernels (NOTES.md):
# k = 8 lanes were 1.15x the forward's time and 2.1x states-only fwd+bwd (session 24, H200: a
# lane's 64 scalar loads a step, 256 B from the next lane's, cost more than the generic kernels'
# reductions); k = 4 against the one-warp generic kernels with prefetch (session 26, H100,
# (32, 4096, 64, 4)): a lane-block forward took 1.23x the forward's time (so no forward runs in
# lanes; it was removed), the lane-block backward 0.68x fwd+bwd's.
LANE_BLOCKS = Knobs({"max_k": 4, "max_values": 160, "block_n": 32, "num_warps": 1, "per_sm": 8, "min_chunk": 32})


def _lane_blocks(A, V: int, has_ga: bool) -> bool:
    """Whether this k x k scan's backward (``has_ga``: the running product's grad too) runs in
    lane blocks: the values a lane holds at once, counted as k^2 a block or product and k v a
    state, its input or grad, within LANE_BLOCKS["max_values"]."""
    K = A.shape[3]
    held = K * K * (3 if has_ga else 2) + 3 * K * V
    return 3 <= K <= LANE_BLOCKS["max_k"] and held <= LANE_BLOCKS["max_values"]


def _geometry_lanes(A):
    """(lanes per program, chunks, chunk length) of the lane-block backward."""
    B, T, N = A.shape[:3]
    gpu = on_gpu(A.device)
    bn = LANE_BLOCKS["block_n"] if gpu else 16
    nc = num_chunks(B * cdiv(N, bn), T, LANE_BLOCKS["min_chunk"] if gpu else 4, A.device, family="affine",
                    per_sm=LANE_BLOCKS["per_sm"])
    return (bn, *_split(T, nc))


def _knobs_2x2(device) -> dict:
    """Launch options of the 2x2 kernels (Triton's defaults in the interpreter)."""
    gpu = on_gpu(device)
    return dict(STAGES=TWO_BY_TWO["stages"] if gpu else None, num_warps=TWO_BY_TWO["num_warps"] if gpu else 1)


def _contiguous_blocks(*tensors) -> bool:
    """Whether every (B, T, N, 2[, 2]) tensor (None skipped) holds each lane's block contiguous
    (row-major) with its batch and time strides and storage offset multiples of the block's size:
    the 2x2 kernels' wide loads (VEC). Strides only: fake tensors too."""
    for x in tensors:
        if x is None:
            continue
        size = 1  # the block's elements (4 for a 2x2 block, 2 for a 2-vector), row-major from the last dim
        for dim in reversed(range(3, x.dim())):
            if x.shape[dim] != 1 and x.stride(dim) != size:
                return False
            size *= x.shape[dim]
        if x.stride(2) != size or x.stride(0) % size or x.stride(1) % size or x.storage_offset() % size:
            return False
    return True


def _fwd_slot(kind, A, Bm, h0, sums, outs, bn, nc, track_a, summary, reverse):
    """The launch of one forward pass ("generic" or "2x2") over (B x chunks x block tiles), for
    inputs like these: the carry-in ``sums`` and outputs ``outs`` ((products, states); meta
    tensors of the plan's layout do) fix its offsets' width."""
    B, T, N, K, _ = A.shape
    grid = (B * nc, cdiv(N, bn))
    flags = dict(HAS_H0=h0 is not None, HAS_CARRY=sums is not None, TRACK_A=track_a, SUMMARY=summary,
                 I64=needs_int64(A, Bm, *outs), REV=reverse)
    if kind == "2x2":
        return common.Slot(_fwd2_kernel, grid, BLOCK_N=bn, VEC=_contiguous_blocks(A, Bm), **_knobs_2x2(A.device),
                           **flags)
    return common.Slot(_fwd_kernel, grid, **_tiles(K, Bm.shape[-1]), BN=bn, num_warps=_warps(A.device), **flags)


def _fwd_strides(kind, A, Bm, h0):
    """The forward kernels' stride arguments (the 2x2 kernels' blocks have fewer dims)."""
    if kind == "2x2":
        return (*_s(A), *_s(Bm)[:4], *_s(h0, 4)[:3])
    return (*_s(A), *_s(Bm), *_s(h0, 4))


def _forward(A, Bm, h0, track_a: bool, reverse: bool = False):
    """(Abar or None, Bbar or h) of the block recurrence; ``reverse``: from the end of time
    (the kernels walk the memory rows backwards; outputs in the inputs' time order). Planned
    once per shape class (``common.planned``: shapes, strides, dtype, device, alignments, the
    storage offsets' block phase the 2x2 kernels' wide loads need, flags); a call allocates
    and launches."""
    key = ("fwd", A.shape, A.stride(), A.dtype, A.device, align(A), A.storage_offset() & 3, Bm.shape, Bm.stride(),
           align(Bm), Bm.storage_offset() & 3, None if h0 is None else h0.stride(), align(h0), track_a, reverse,
           common.plan_epoch())
    return common.planned(key, lambda: _plan_forward(A, Bm, h0, track_a, reverse))(A, Bm, h0)


def _plan_forward(A, Bm, h0, track_a, reverse):
    """``run(A, Bm, h0) -> (Abar or None, Bbar or h)`` for inputs like these (``_forward``)."""
    B, T, N, K, _ = A.shape
    V = Bm.shape[-1]

    def outputs(A):
        out_b = A.new_empty((B, T, N, K, V))
        return (A.new_empty((B, T, N, K, K)) if track_a else out_b), out_b

    if B * T * N * K * V == 0:
        def empty(A, Bm, h0):
            out_a, out_b = outputs(A)
            return (out_a if track_a else None), out_b
        return empty
    if _two_by_two(A, V):
        kind, (bn, nc, chunk) = "2x2", _geometry_2x2(A)
    else:
        kind, (bn, nc, chunk) = "generic", _geometry(A, V)
    meta = lambda *shape: torch.empty(shape, device="meta")  # noqa: E731  (a layout, for the offsets' width)
    out_b = meta(B, T, N, K, V)
    outs = (meta(B, T, N, K, K) if track_a else out_b, out_b)
    sums = (meta(B, nc, N, K, K), meta(B, nc, N, K, V)) if nc > 1 else None
    geometry = (T, N, nc, chunk, B * nc)
    summary = _fwd_slot(kind, A, Bm, None, None, sums, bn, nc, True, True, reverse) if nc > 1 else None
    summary_args = (*geometry, *_fwd_strides(kind, A, Bm, None))
    main = _fwd_slot(kind, A, Bm, h0, sums, outs, bn, nc, track_a, False, reverse)
    main_args = (*geometry, *_fwd_strides(kind, A, Bm, h0))

    def run(A, Bm, h0):
        out_a, out_b = outputs(A)
        sum_a = sum_b = None
        if summary is not None:  # each chunk's (product, state from zero); the main pass folds them into its carry-in
            sum_a = A.new_empty((B, nc, N, K, K), dtype=torch.float32)
            sum_b = A.new_empty((B, nc, N, K, V), dtype=torch.float32)
            summary(A, Bm, None, None, None, sum_a, sum_b, *summary_args)
        main(A, Bm, h0, sum_a, sum_b, out_a, out_b, *main_args)
        return (out_a if track_a else None), out_b
    return run


def _backward(A, h0, gb, ga, out_b, out_a, reverse: bool = False):
    """(dA, dB, dh0) of the block recurrence from the saved outputs (of a scan from the end:
    ``reverse``). Planned once per shape class, as ``_forward``."""
    gb = gb.contiguous()
    ga = ga.contiguous() if ga is not None else None
    out_a = out_a if ga is not None else None  # the running product is read only with its gradient
    key = ("bwd", A.shape, A.stride(), A.dtype, A.device, align(A), A.storage_offset() & 3,
           None if h0 is None else h0.stride(), align(h0), gb.shape, align(gb), align(ga), out_b.stride(),
           align(out_b), None if out_a is None else out_a.stride(), align(out_a), reverse, common.plan_epoch())
    return common.planned(key, lambda: _plan_backward(A, h0, gb, ga, out_b, out_a, reverse))(
        A, h0, gb, ga, out_b, out_a)


def _plan_backward(A, h0, gb, ga, out_b, out_a, reverse):
    """``run(A, h0, gb, ga, out_b, out_a) -> (dA, dB, dh0)`` for inputs like these (``_backward``)."""
    B, T, N, K, _ = A.shape
    V = gb.shape[-1]
    has_h0, has_ga = h0 is not None, ga is not None  # (the plan's closures keep no tensor of the call that made it)

    def outputs(A):
        return (A.new_empty((B, T, N, K, K)), A.new_empty((B, T, N, K, V)),
                A.new_empty((B, N, K, V)) if has_h0 else None)

    if B * T * N * K * V == 0:
        def empty(A, h0, gb, ga, out_b, out_a):
            dA, dB, dh0 = outputs(A)
            return dA.zero_(), dB, (dh0.zero_() if dh0 is not None else None)
        return empty
    two = _two_by_two(A, V)
    lanes = not two and _lane_blocks(A, V, has_ga)
    bn, nc, chunk = _geometry_2x2(A) if two else _geometry_lanes(A) if lanes else _geometry(A, V)
    grid = (B * nc, cdiv(N, bn))
    if two:
        kernel = _bwd2_kernel
        consts = dict(BLOCK_N=bn, VEC=_contiguous_blocks(A), **_knobs_2x2(A.device))
    elif lanes:
        kernel = _bwdk_kernel
        consts = dict(K=K, V=V, BLOCK_N=bn, num_warps=LANE_BLOCKS["num_warps"] if on_gpu(A.device) else 1)
    else:
        kernel = _bwd_kernel
        consts = dict(**_tiles(K, V), BN=bn, num_warps=_warps(A.device))
    meta = lambda *shape: torch.empty(shape, device="meta")  # noqa: E731
    consts.update(HAS_H0=has_h0, HAS_GA=has_ga, REV=reverse,
                  I64=needs_int64(A, gb, ga, meta(B, T, N, K, K), meta(B, T, N, K, V)))
    args = (T, N, nc, chunk, B * nc, *_s(A), *_s(h0, 4))
    summary = common.Slot(kernel, grid, HAS_CARRY=False, SUMMARY=True, **consts) if nc > 1 else None
    main = common.Slot(kernel, grid, HAS_CARRY=nc > 1, SUMMARY=False, **consts)

    def run(A, h0, gb, ga, out_b, out_a):
        dA, dB, dh0 = outputs(A)
        sum_p = sum_b = sum_a = None
        if summary is not None:  # each chunk's summary, which the main pass folds into its carry-in
            sum_p = A.new_empty((B, nc, N, K, K), dtype=torch.float32)
            sum_b = A.new_empty((B, nc, N, K, V), dtype=torch.float32)
            sum_a = torch.empty_like(sum_p) if has_ga else None
            summary(A, h0, gb, ga, out_b, out_a, sum_b, sum_a, None, None, None, sum_p, *args)
        main(A, h0, gb, ga, out_b, out_a, sum_b, sum_a, dA, dB, dh0, sum_p, *args)
        return dA, dB, dh0
    return run


def _dense(A, B, h0, track_a, reverse, reset):
    if reset is not None:  # scankit.ops resets the block ops' carry itself (a copy of the coefficients)
        raise ValueError("the block-scan kernels scan dense batches (no in-kernel resets)")
    return _forward(A, B, h0, track_a=track_a, reverse=reverse)


affine_scan = prefix_scan_op(
    "affine_scan",
    _dense,
    lambda A, h0, Abar, out, g_Abar, g_out, reverse, reset: _backward(A, h0, g_out, g_Abar, out, Abar, reverse),
)


def _column(x):
    """A (.., k) vector block as a (.., k, 1) matrix block (a view), or None."""
    return None if x is None else x.unsqueeze(-1)


def _vector_dense(M, b, h0, track_a, reverse, reset):
    Abar, out = _dense(M, _column(b), _column(h0), track_a, reverse, reset)
    return Abar, out.squeeze(-1)


def _vector_backward(M, h0, Abar, out, g_Abar, g_out, reverse, reset):
    dM, db, dh0 = _backward(M, _column(h0), _column(g_out), g_Abar, _column(out), Abar, reverse)
    return dM, db.squeeze(-1), None if dh0 is None else dh0.squeeze(-1)


# ``matrix_scan``: the block recurrence with v = 1, its b, h0 and states vectors. The views to
# and from one-column blocks are taken inside the op, so a call records no autograd nodes for
# them (an unsqueeze and a squeeze around ``affine_scan`` cost two more in every fwd+bwd).
matrix_scan = prefix_scan_op("matrix_scan", _vector_dense, _vector_backward)
