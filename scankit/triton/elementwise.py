"""Triton kernels for the elementwise recurrences (``linear_scan``, ``parallel_scan_log``).

Layout (B, T, D), any strides. One program owns (batch, T-chunk, D-tile); it walks its
chunk in (BLOCK_T, BLOCK_D) tiles, scanning each tile in registers with
``tl.associative_scan`` and carrying the last row to the next tile. Every tensor is read
once and written once. The backward is the same recurrence on reversed time:
``g^_t = g_t + a_{t+1} g^_{t+1}``, ``db_t = g^_t``, ``da_t = g^_t h_{t-1}``.

When (batch x D-tiles) programs cannot fill the GPU, T is split into chunks: a summary
pass reduces each chunk to (product of a, state from zero), and the main pass runs every
chunk in parallel, each program first folding the summaries of the chunks before it (after
it, backward) into its carry-in: two launches, no scan of the summaries in between;
``linear_scan`` runs single-pass with decoupled look-back there instead (``common.LOOKBACK``).

With GATE (``gated_scan``: ``mingru_scan``, ``signed_mingru_scan``) the linear kernels read a
projection's pre-activations where they would read (a, b) and form (a, b) in registers (minGRU:
a = sigmoid(-k), b = sigmoid(k) g(v)); the backward turns (da, db) into the pre-activations'
grads there too, written as one (B, T, n D) gradient: every path above (one pass, chunks,
look-back; not the in-thread walk, ``common.IN_THREAD``) runs the gated recurrences with no
tensor of a or b.

A scan from the end (``reverse``, constexpr REV) maps every time-indexed address through
``lang.row`` (step t at memory row T - 1 - t): the same kernels walk time backwards in place,
their tiles, chunks, look-back and carries in scan order.

The log op (``parallel_scan_log``) carries its state between chunks as log h. A chunk is
walked as above in linear space (a = exp(log_coeffs), b = exp(log_values), fp32), which is
exact where the coefficients only decay (a <= 1), the log values lie within +-LOG_RANGE and
the carry is at most e^LOG_RANGE times them (nothing overflows; what underflows is below
fp32 rounding of the result). The walk gathers, per element, whether that held; a chunk
where it did not (growing coefficients, values beyond e^+-60, zeros b = 0) is redone in the
same kernel, row by row, in log space: any finite inputs give h to fp32 rounding of its log,
wherever exp() of them lies. The backward likewise walks the linear backward, gathering
whether it was exact (also: decays above e^-60, states within e^+-60), and redoes a chunk
where it was not as the bounded recurrence of the shares r_t = a_t h_{t-1} / h_t and
w_t = b_t / h_t (both in [0, 1], from logs) with q_t = g^_t h_t:
``q_t = g_t h_t + r_{t+1} q_{t+1}``, ``dlog_a_t = q_t r_t``, ``dlog_b_t = q_t w_t``,
``dlog_h_0 = q_0 r_0``: finite whenever h is (h = inf, the fp32 overflow of a state, gives
no usable gradient). Chunk carries of the backward are q.
"""

from typing import Optional

import torch
import triton
import triton.language as tl

from . import common
from .lang import idx, program, row, when
from .common import align, cdiv, empty_like_shape as _empty, needs_int64, num_chunks, tiles

# The log op's linear-space tiles: |log values| and carry - log values at most this (module doc)
LOG_RANGE = tl.constexpr(60.0)
LOG_SPAN = tl.constexpr(1.1420073898156842e26)  # e^LOG_RANGE


@triton.jit
def _combine(a1, b1, a2, b2):
    """(a1, b1) then (a2, b2): x -> a2 (a1 x + b1) + b2."""
    return a1 * a2, a2 * b1 + b2


@triton.jit
def _sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def _tanh(x):
    """tanh from exp (no tanh in Triton's core language): (1 - e) / (1 + e) with e = exp(-2|x|),
    its odd series below |x| = 1/8, where 1 - e would cancel (relative error ~1e-9 there)."""
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    x2 = x * x
    series = x * (1.0 + x2 * (-0.3333333333333333 + x2 * (0.13333333333333333 - x2 * 0.05396825396825397)))
    return tl.where(tl.abs(x) < 0.125, series, tl.where(x < 0, -t, t))


@triton.jit
def _sech2(x):
    """1 - tanh(x)^2 = 4e / (1 + e)^2, e = exp(-2|x|): no cancellation where tanh nears 1."""
    e = tl.exp(-2.0 * tl.abs(x))
    return 4.0 * e / ((1.0 + e) * (1.0 + e))


# The gates (constexpr GATE): the recurrence's (a, b) formed in registers from a projection's
# pre-activations, read where (a, b) would be: 1, minGRU: (k, v) at (a_ptr, b_ptr), a = sigmoid(-k),
# b = sigmoid(k) g(v), g(v) = v + 1/2 (v >= 0), sigmoid(v) (v < 0); 2, the signed minGRU:
# (s, zk, v), s at a_ptr, v at b_ptr, zk the D columns before v, a = tanh(s), b = sigmoid(zk) v;
# 3, its coupled form, a = (1 - sigmoid(zk)) tanh(s). ``_gate_mid`` reads zk (GATE >= 2), through
# v's pointer: its offsets then stay within v's span, which the int64 choice (I64) covers.
@triton.jit
def _gate_mid(b_ptr, off, D, sb_d, mask, GATE: tl.constexpr):
    """The signed gates' zk (fp32): D columns before v's offsets ``off``; zeros (unread) for minGRU."""
    if GATE >= 2:
        m = tl.load(b_ptr + off - D * sb_d, mask=mask, other=0.0).to(tl.float32)
    else:
        m = tl.zeros_like(off).to(tl.float32)
    return m


@triton.jit
def _gate_coeff(x, m, GATE: tl.constexpr):
    """The gate's coefficient a from its first operand x (k or s) and zk = m."""
    if GATE == 1:
        a = _sigmoid(-x)
    else:
        a = _tanh(x)
        if GATE == 3:
            a = a * _sigmoid(-m)
    return a


@triton.jit
def _gate_ab(x, m, v, mask, GATE: tl.constexpr):
    """The gate's (a, b) from its operands (x = k or s, m = zk, v); the identity (1, 0) where masked."""
    if GATE == 1:
        b = _sigmoid(x) * tl.where(v >= 0, v + 0.5, _sigmoid(v))
    else:
        b = _sigmoid(m) * v
    return tl.where(mask, _gate_coeff(x, m, GATE), 1.0), tl.where(mask, b, 0.0)


@triton.jit
def _gate_grads(x, m, v, ghat, da, GATE: tl.constexpr):
    """The gate's operand grads (dx, dm, dv) from the recurrence's da = g^_t h_{t-1}, db = g^_t.
    minGRU: dk = sigmoid(k) sigmoid(-k) (g^ g(v) - da), dv = g^ sigmoid(k) g'(v), g'(v) = 1 (v >= 0),
    sigmoid(v) sigmoid(-v) (v < 0); signed: ds = da c sech^2(s), dzk = z (1 - z) (g^ v - [coupled] da tanh(s)),
    dv = g^ z, with z = sigmoid(zk), c = 1 - z coupled, else 1 (dm = 0 for minGRU)."""
    if GATE == 1:
        z, zc = _sigmoid(x), _sigmoid(-x)
        sv = _sigmoid(v)
        pos = v >= 0
        dx = z * zc * (ghat * tl.where(pos, v + 0.5, sv) - da)
        dm = dx * 0.0
        dv = ghat * z * tl.where(pos, 1.0, sv * _sigmoid(-v))
    else:
        z, zc = _sigmoid(m), _sigmoid(-m)
        dx = da * _sech2(x)
        dm = z * zc * ghat * v
        if GATE == 3:
            dm -= z * zc * da * _tanh(x)
            dx = dx * zc
        dv = ghat * z
    return dx, dm, dv


@triton.jit
def _resets(reset_ptr, m, T):
    """Whether memory rows ``m`` begin a packed sequence's scan: the carry resets there (the
    coefficient counts as 0, log a as -inf). ``reset_ptr``: int8 (T,), one flag per row."""
    return tl.load(reset_ptr + m, mask=(m >= 0) & (m < T), other=0) != 0


@triton.jit
def _logaddexp(x, y):
    m = tl.maximum(x, y)
    m = tl.where(m == float("-inf"), 0.0, m)  # both -inf: log(0 + 0) = -inf
    return m + tl.log(tl.exp(x - m) + tl.exp(y - m))


@triton.jit
def _last_row(x, BLOCK_T: tl.constexpr):
    rows = tl.arange(0, BLOCK_T)
    return tl.sum(tl.where(rows[:, None] == BLOCK_T - 1, x, 0.0), axis=0)


@triton.jit
def _initial_state(h0_ptr, bi, d, mask, sh_b, sh_d, HAS_H0: tl.constexpr, BLOCK_D: tl.constexpr):
    """h_0 of these columns of a linear recurrence: h0 or zeros."""
    if HAS_H0:
        h = tl.load(h0_ptr + bi * sh_b + d * sh_d, mask=mask, other=0.0).to(tl.float32)
    else:
        h = tl.zeros((BLOCK_D,), tl.float32)
    return h


@triton.jit
def _fold(p_ptr, s_ptr, prod, h, bi, first, step, count, NC, D, d, dmask):
    """(product, state) carried through ``count`` chunk summaries (product of the
    coefficients p, state from zero s; slot (bi * NC + j) * D + d), chunks j = first,
    first + step, ...: a main-pass program's carry-in, forward (chunks 0 .. ci - 1) or
    backward (chunks NC - 1 down to ci + 1). The scan of the summaries, folded into the pass."""
    for c in range(0, count):
        slot = (bi * NC + first + step * c) * D + d
        p = tl.load(p_ptr + slot, mask=dmask, other=0.0)
        h = p * h + tl.load(s_ptr + slot, mask=dmask, other=0.0)
        prod = prod * p
    return prod, h


@triton.jit
def _fold_log_before(sa_ptr, sh_ptr, ell, bi, ci, NC, D, d, dmask):
    """``_fold`` forward, for the log op in log space: log h through the summaries (sum of log a,
    log state from zero) of chunks 0 .. ci - 1."""
    for j in range(0, ci):
        slot = (bi * NC + j) * D + d
        ell = _logaddexp(tl.load(sa_ptr + slot, mask=dmask, other=0.0) + ell,
                         tl.load(sh_ptr + slot, mask=dmask, other=float("-inf")))
    return ell


@triton.jit
def _load_ab(a_ptr, b_ptr, bi, rows, d, mask, sa_b, sa_t, sa_d, sb_b, sb_t, sb_d, LOG: tl.constexpr,
             V0: tl.constexpr, reset_ptr, T, HAS_RESET: tl.constexpr, GATE: tl.constexpr, D):
    """A tile's coefficients and inputs in fp32: (a, b) with the identity (1, 0) where masked,
    or for the log op (log a, log b_t from row t + V0) with the identity (0, -inf); with GATE
    a_ptr, b_ptr hold a gate's pre-activations and (a, b) come from them (``_gate_ab``)."""
    a_off = bi * sa_b + rows[:, None] * sa_t + d[None, :] * sa_d
    if LOG:
        b_off = bi * sb_b + (rows + V0)[:, None] * sb_t + d[None, :] * sb_d
        a = tl.load(a_ptr + a_off, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + b_off, mask=mask, other=float("-inf")).to(tl.float32)
    else:
        b_off = bi * sb_b + rows[:, None] * sb_t + d[None, :] * sb_d
        a = tl.load(a_ptr + a_off, mask=mask, other=1.0).to(tl.float32)
        b = tl.load(b_ptr + b_off, mask=mask, other=0.0).to(tl.float32)
        if GATE:
            a, b = _gate_ab(a, _gate_mid(b_ptr, b_off, D, sb_d, mask, GATE), b, mask, GATE)
    if HAS_RESET:  # packed sequences: the carry restarts at each one's first step
        a = tl.where(_resets(reset_ptr, rows, T)[:, None], float("-inf") if LOG else 0.0, a)
    return a, b


@triton.jit
def _rows(D, sa_b, sa_t, sb_b, sb_t, VEC: tl.constexpr):
    """D and the inputs' batch and time strides, written as multiples of VEC where VEC > 1 (the
    host checked they are: ``common.row_vector``), so that Triton proves the rows' 16-byte
    loads and column masks where its own specialization (multiples of 16) cannot: D = 1000."""
    if VEC > 1:
        D, sa_b, sa_t = D // VEC * VEC, sa_b // VEC * VEC, sa_t // VEC * VEC
        sb_b, sb_t = sb_b // VEC * VEC, sb_t // VEC * VEC
    return D, sa_b, sa_t, sb_b, sb_t


@triton.jit
def _fwd_tile(a_ptr, b_ptr, out_a_ptr, out_h_ptr, reset_ptr, bi, rows, d, mask, h, prod, T, D,
              sa_b, sa_t, sa_d, sb_b, sb_t, sb_d, WRITE_A: tl.constexpr, SUMMARY: tl.constexpr,
              BLOCK_T: tl.constexpr, REV: tl.constexpr, HAS_RESET: tl.constexpr, GATE: tl.constexpr):
    """One forward tile of ``rows`` (``mask``: its valid elements) from the state ``h`` and the
    running product ``prod`` before it: stores its states (and products when WRITE_A) unless
    SUMMARY; returns (h, prod) after it."""
    a, b = _load_ab(a_ptr, b_ptr, bi, row(rows, T, REV), d, mask, sa_b, sa_t, sa_d, sb_b, sb_t, sb_d, False, 0,
                    reset_ptr, T, HAS_RESET, GATE, D)
    a_run, b_run = tl.associative_scan((a, b), 0, _combine)
    hs = a_run * h[None, :] + b_run
    if not SUMMARY:
        out_off = bi * T * D + row(rows, T, REV)[:, None] * D + d[None, :]
        tl.store(out_h_ptr + out_off, hs.to(out_h_ptr.dtype.element_ty), mask=mask)
        if WRITE_A:
            tl.store(out_a_ptr + out_off, (a_run * prod[None, :]).to(out_a_ptr.dtype.element_ty), mask=mask)
    return _last_row(hs, BLOCK_T), prod * _last_row(a_run, BLOCK_T)


@triton.jit
def _fwd_kernel(
    a_ptr, b_ptr, h0_ptr, carry_a_ptr, carry_h_ptr, out_a_ptr, out_h_ptr, reset_ptr,
    T, D, NC, CHUNK, NBC,
    sa_b, sa_t, sa_d, sb_b, sb_t, sb_d, sh_b, sh_d,
    HAS_H0: tl.constexpr, HAS_CARRY: tl.constexpr, WRITE_A: tl.constexpr, SUMMARY: tl.constexpr,
    I64: tl.constexpr, FOLD: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, STAGES: tl.constexpr,
    REV: tl.constexpr, HAS_RESET: tl.constexpr, GATE: tl.constexpr, VEC: tl.constexpr,
):
    """Linear recurrence over this program's chunk. Main pass: states h (and running
    products when WRITE_A) from h_0, carried through the summaries of the chunks before this
    one (HAS_CARRY: carry_a, carry_h). SUMMARY: each chunk's (product of a, state from zero)
    into out_a, out_h (B, NC, D). GATE: a, b from a gate's pre-activations (``_load_ab``)."""
    D, sa_b, sa_t, sb_b, sb_t = _rows(D, sa_b, sa_t, sb_b, sb_t, VEC)
    bi, ci, di = program(NBC, NC, I64, FOLD)
    d = di * BLOCK_D + tl.arange(0, BLOCK_D)
    dmask = d < D
    t_lo = ci * CHUNK  # this chunk: rows t_lo .. t_lo + CHUNK - 1 that are < T

    prod = tl.full((BLOCK_D,), 1.0, tl.float32)
    h = tl.zeros((BLOCK_D,), tl.float32)
    if not SUMMARY:
        h = _initial_state(h0_ptr, bi, d, dmask, sh_b, sh_d, HAS_H0, BLOCK_D)
        if HAS_CARRY:
            prod, h = _fold(carry_a_ptr, carry_h_ptr, prod, h, bi, 0, 1, ci, NC, D, d, dmask)

    # the chunk's whole tiles with a column mask alone (a row mask costs the one-warp walk a
    # predicate and select per row and load: H100, session 40, (8, 4097, 1024) fwd 243 us against
    # 158 at T = 4096), then its partial tile, if any (T % BLOCK_T rows; none after it)
    rows_in = tl.minimum(CHUNK, T - t_lo)
    whole = rows_in // BLOCK_T
    for j in tl.range(0, whole, num_stages=STAGES):
        rows = t_lo + j * BLOCK_T + tl.arange(0, BLOCK_T)
        h, prod = _fwd_tile(a_ptr, b_ptr, out_a_ptr, out_h_ptr, reset_ptr, bi, rows, d,
                            tl.broadcast_to(dmask[None, :], (BLOCK_T, BLOCK_D)), h, prod, T, D,
                            sa_b, sa_t, sa_d, sb_b, sb_t, sb_d, WRITE_A, SUMMARY, BLOCK_T, REV, HAS_RESET, GATE)
    if whole * BLOCK_T < rows_in:
        rows = t_lo + whole * BLOCK_T + tl.arange(0, BLOCK_T)
        h, prod = _fwd_tile(a_ptr, b_ptr, out_a_ptr, out_h_ptr, reset_ptr, bi, rows, d,
                            (rows < T)[:, None] & dmask[None, :], h, prod, T, D,
                            sa_b, sa_t, sa_d, sb_b, sb_t, sb_d, WRITE_A, SUMMARY, BLOCK_T, REV, HAS_RESET, GATE)
    if SUMMARY:
        side = (bi * NC + ci) * D + d
        tl.store(out_a_ptr + side, prod, mask=dmask)
        tl.store(out_h_ptr + side, h, mask=dmask)


@triton.jit
def _log_fwd_kernel(
    lc_ptr, lv_ptr, lh0_ptr, sum_a_ptr, sum_h_ptr, out_ptr, reset_ptr,
    T, D, NC, CHUNK, NBC, sa_b, sa_t, sa_d, sb_b, sb_t, sb_d, sh_b, sh_d,
    HAS_CARRY: tl.constexpr, SUMMARY: tl.constexpr, V0: tl.constexpr, I64: tl.constexpr, FOLD: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, STAGES: tl.constexpr, REV: tl.constexpr,
    HAS_RESET: tl.constexpr, VEC: tl.constexpr,
):
    """The log op over this program's chunk; log b_t is row t + V0 of lv (V0 = 1: slot 0 of
    log_values is log h_0, which lh0 then points at too; V0 = 0: log_h0 given apart).
    From the log state ell_in: log h_0, carried
    through the summaries of the chunks before this one (HAS_CARRY). First the linear walk
    (a = exp(log a), b = exp(log b)), which also gathers where it is not exact (module doc);
    if anything was, the chunk again, row by row in log space (logaddexp), overwriting.
    SUMMARY: each chunk's (sum of log a, log state from zero) into sum_a, sum_h (B, NC, D)."""
    D, sa_b, sa_t, sb_b, sb_t = _rows(D, sa_b, sa_t, sb_b, sb_t, VEC)
    bi, ci, di = program(NBC, NC, I64, FOLD)
    d = di * BLOCK_D + tl.arange(0, BLOCK_D)
    dmask = d < D
    t_lo = ci * CHUNK
    ell_in = _log_h0(lv_ptr, lh0_ptr, bi, d, dmask, sb_b, sb_d, sh_b, sh_d, V0)  # (masked columns unused)
    if SUMMARY:
        ell_in = tl.full((BLOCK_D,), float("-inf"), tl.float32)
    elif HAS_CARRY:
        ell_in = _fold_log_before(sum_a_ptr, sum_h_ptr, ell_in, bi, ci, NC, D, d, dmask)
    out_base = bi * T * D + d[None, :]

    h = tl.exp(ell_in)
    bad = tl.zeros((BLOCK_T, BLOCK_D), tl.int1) | (ell_in > LOG_RANGE)[None, :]
    lsum = tl.zeros((BLOCK_T, BLOCK_D), tl.float32)
    for j in tl.range(0, CHUNK // BLOCK_T, num_stages=STAGES):
        rows = t_lo + j * BLOCK_T + tl.arange(0, BLOCK_T)
        mask = (rows < T)[:, None] & dmask[None, :]
        lc, lv = _load_ab(lc_ptr, lv_ptr, bi, row(rows, T, REV), d, mask, sa_b, sa_t, sa_d, sb_b, sb_t, sb_d, True,
                          V0, reset_ptr, T, HAS_RESET, 0, D)
        a, b = tl.exp(lc), tl.exp(lv)
        a_run, b_run = tl.associative_scan((a, b), 0, _combine)
        hs = a_run * h[None, :] + b_run
        if not SUMMARY:
            tl.store(out_ptr + out_base + row(rows, T, REV)[:, None] * D, hs.to(out_ptr.dtype.element_ty), mask=mask)
        # exact where: decays only, |log b| <= LOG_RANGE, carry <= e^LOG_RANGE b (from a and b,
        # live anyway: fewer registers than from the logs)
        far = (a > 1.0) | (b < 1.0 / LOG_SPAN) | (b > LOG_SPAN) | (h[None, :] > LOG_SPAN * b)
        bad = bad | (mask & far)
        lsum += lc
        h = _last_row(hs, BLOCK_T)
    redo = tl.max(tl.max(bad.to(tl.int32), axis=0), axis=0) > 0
    ell = tl.log(h)
    lsum = tl.sum(lsum, axis=0)
    if redo:  # rare: row by row, the simplest exact form
        ell = ell_in
        lsum = tl.zeros((BLOCK_D,), tl.float32)
        for t in range(t_lo, tl.minimum(t_lo + CHUNK, T)):
            m = row(t, T, REV)
            lc = tl.load(lc_ptr + bi * sa_b + m * sa_t + d * sa_d, mask=dmask, other=0.0).to(tl.float32)
            if HAS_RESET:
                lc = tl.where(tl.load(reset_ptr + m) != 0, float("-inf"), lc)
            lv = tl.load(lv_ptr + bi * sb_b + (m + V0) * sb_t + d * sb_d, mask=dmask, other=float("-inf"))
            ell = _logaddexp(lc + ell, lv.to(tl.float32))
            if not SUMMARY:
                tl.store(out_ptr + bi * T * D + m * D + d, tl.exp(ell).to(out_ptr.dtype.element_ty), mask=dmask)
            lsum += lc
    if SUMMARY:
        side = (bi * NC + ci) * D + d
        tl.store(sum_a_ptr + side, lsum, mask=dmask)
        tl.store(sum_h_ptr + side, ell, mask=dmask)


@triton.jit
def _pack(x, FLAG: tl.constexpr, epoch):
    """A look-back status word: fp32 ``x`` in the low 32 bits, ``4 epoch + FLAG`` above (1: the
    tile's aggregate, 2: its inclusive prefix). One 64-bit store, so a reader sees value and
    flag together and needs no fence; a word of another call (epoch) reads as unpublished."""
    return x.to(tl.uint32, bitcast=True).to(tl.int64) | ((epoch * 4 + FLAG).to(tl.int64) << 32)


@triton.jit
def _unpack(w):
    return (w & 0xFFFFFFFF).to(tl.uint32).to(tl.float32, bitcast=True)


@triton.jit
def _look_back(words_a, words_h, ti, stride_t, col, colmask, epoch, BLOCK_D: tl.constexpr, WINDOW: tl.constexpr):
    """(A, H): the composition of tiles 0 .. ti - 1 of these columns, from their status words.

    Reads WINDOW predecessors at a time, newest last; per column it stops at the newest
    published inclusive prefix and composes the aggregates after it, waiting (re-reading)
    while a needed tile has published nothing yet. Tiles took their tickets in order, so
    every predecessor is running or done: the wait ends."""
    acc_a = tl.full((BLOCK_D,), 1.0, tl.float32)
    acc_h = tl.zeros((BLOCK_D,), tl.float32)
    found = ~colmask
    hi = ti
    while tl.min(found.to(tl.int32), axis=0) == 0:
        j = hi - WINDOW + tl.arange(0, WINDOW)
        live = (j >= 0)[:, None] & (~found)[None, :]
        off = j[:, None] * stride_t + col[None, :]
        wa = tl.load(words_a + off, mask=live, other=0, volatile=True)
        wh = tl.load(words_h + off, mask=live, other=0, volatile=True)
        top = wa >> 32
        flag = tl.where((top == (wh >> 32)) & ((top >> 2) == epoch), top & 3, 0)
        newest = tl.max(tl.where(live & (flag == 2), j[:, None], -1), axis=0)
        need = live & (j[:, None] >= newest[None, :])
        if tl.min(tl.where(need, (flag > 0).to(tl.int32), 1)) == 1:
            seg_a, seg_h = tl.associative_scan(
                (tl.where(need, _unpack(wa), 1.0), tl.where(need, _unpack(wh), 0.0)), 0, _combine)
            acc_a, acc_h = _combine(_last_row(seg_a, WINDOW), _last_row(seg_h, WINDOW), acc_a, acc_h)
            found = found | (newest >= 0)
            hi -= WINDOW
    return acc_a, acc_h


@triton.jit
def _carry_in(words_a, words_h, ti, stride_t, col, colmask, tot_a, tot_h, init_h, epoch,
              BLOCK_D: tl.constexpr, WINDOW: tl.constexpr, PREFIX_EVERY: tl.constexpr):
    """Carry-in (A, H) of tile ``ti`` (``init_h`` for tile 0) for these columns: publish the
    tile's aggregate (tot_a, tot_h), look back, publish its inclusive prefix. PREFIX_EVERY > 1
    (tests) publishes only every so many prefixes, so look-backs compose aggregates."""
    slot = ti * stride_t + col
    if ti == 0:
        carry_a = tl.full((BLOCK_D,), 1.0, tl.float32)
        carry_h = init_h
    else:
        tl.store(words_a + slot, _pack(tot_a, 1, epoch), mask=colmask)
        tl.store(words_h + slot, _pack(tot_h, 1, epoch), mask=colmask)
        carry_a, carry_h = _look_back(words_a, words_h, ti, stride_t, col, colmask, epoch, BLOCK_D, WINDOW)
    if ti % PREFIX_EVERY == 0:
        inc_a, inc_h = _combine(carry_a, carry_h, tot_a, tot_h)
        tl.store(words_a + slot, _pack(inc_a, 2, epoch), mask=colmask)
        tl.store(words_h + slot, _pack(inc_h, 2, epoch), mask=colmask)
    return carry_a, carry_h


@triton.jit
def _lookback_program(status_ptr, NBD, ND, N, I64: tl.constexpr):
    """(time tile, batch, D-tile, epoch) from this program's ticket: time-tile major, so every
    predecessor of a tile has started before it. The ticket word holds the count in its low 32
    bits and the call's epoch above; the last of the N tickets starts the next epoch at count 0,
    so the words are ready for the next call with no zeroing (``common.status_words``)."""
    w = tl.atomic_add(status_ptr, 1)
    v = (w & 0xFFFFFFFF).to(tl.int32)
    epoch = (w >> 32).to(tl.int32)
    if v == N - 1:
        tl.atomic_xchg(status_ptr, ((epoch + 1) & 0x1FFFFFFF).to(tl.int64) << 32)  # common.EPOCHS
    c = v % NBD
    return idx(v // NBD, I64), idx(c // ND, I64), idx(c % ND, I64), epoch


@triton.jit
def _fwd_lookback_kernel(
    a_ptr, b_ptr, h0_ptr, status_ptr, out_a_ptr, out_h_ptr, reset_ptr,
    T, D, NBD, ND, STRIDE_T,
    sa_b, sa_t, sa_d, sb_b, sb_t, sb_d, sh_b, sh_d,
    HAS_H0: tl.constexpr, WRITE_A: tl.constexpr, I64: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, WINDOW: tl.constexpr, PREFIX_EVERY: tl.constexpr,
    REV: tl.constexpr, HAS_RESET: tl.constexpr, GATE: tl.constexpr, VEC: tl.constexpr,
):
    """Single-pass forward of the linear recurrence: one (BLOCK_T, BLOCK_D) tile per program,
    its carry-in from the tiles before it by decoupled look-back (status words after the
    ticket counter). GATE as in ``_fwd_kernel``."""
    D, sa_b, sa_t, sb_b, sb_t = _rows(D, sa_b, sa_t, sb_b, sb_t, VEC)
    ti, bi, di, epoch = _lookback_program(status_ptr, NBD, ND, tl.cdiv(T, BLOCK_T) * NBD, I64)
    d = di * BLOCK_D + tl.arange(0, BLOCK_D)
    dmask = d < D
    rows = ti * BLOCK_T + tl.arange(0, BLOCK_T)
    mask = (rows < T)[:, None] & dmask[None, :]
    a, b = _load_ab(a_ptr, b_ptr, bi, row(rows, T, REV), d, mask, sa_b, sa_t, sa_d, sb_b, sb_t, sb_d, False, 0,
                    reset_ptr, T, HAS_RESET, GATE, D)
    a_run, b_run = tl.associative_scan((a, b), 0, _combine)
    tot_a, tot_h = _last_row(a_run, BLOCK_T), _last_row(b_run, BLOCK_T)
    init_h = _initial_state(h0_ptr, bi, d, when(ti == 0, dmask), sh_b, sh_d, HAS_H0, BLOCK_D)
    words = status_ptr + 1
    carry_a, carry_h = _carry_in(words, words + STRIDE_T * tl.cdiv(T, BLOCK_T), ti, STRIDE_T, bi * D + d, dmask,
                                 tot_a, tot_h, init_h, epoch, BLOCK_D, WINDOW, PREFIX_EVERY)

    out_off = bi * T * D + row(rows, T, REV)[:, None] * D + d[None, :]
    tl.store(out_h_ptr + out_off, (a_run * carry_h[None, :] + b_run).to(out_h_ptr.dtype.element_ty), mask=mask)
    if WRITE_A:
        tl.store(out_a_ptr + out_off, (a_run * carry_a[None, :]).to(out_a_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _next_a(a_ptr, b_ptr, bi, rows, d, valid, mask, T, sa_b, sa_t, sa_d, sb_b, sb_t, sb_d, REV: tl.constexpr,
            reset_ptr, HAS_RESET: tl.constexpr, GATE: tl.constexpr, D):
    """a_{t+1} per row of a backward tile (0 past T and where step t + 1 resets; 1 on rows past
    T, the scan's identity); b_ptr is read only by the signed gates (``_gate_mid``)."""
    nxt = (rows + 1 < T)[:, None] & mask
    m = row(rows + 1, T, REV)
    if HAS_RESET:
        nxt = nxt & ~_resets(reset_ptr, m, T)[:, None]
    c = tl.load(a_ptr + bi * sa_b + m[:, None] * sa_t + d[None, :] * sa_d, mask=nxt, other=0.0).to(tl.float32)
    if GATE:  # c held the gate's first operand at step t + 1
        zk = _gate_mid(b_ptr, bi * sb_b + m[:, None] * sb_t + d[None, :] * sb_d, D, sb_d, nxt, GATE)
        c = tl.where(nxt, _gate_coeff(c, zk, GATE), 0.0)
    return tl.where(valid[:, None], c, 1.0)


@triton.jit
def _first_a(a_ptr, b_ptr, bi, d, dmask, T, sa_b, sa_t, sa_d, sb_b, sb_t, sb_d, REV: tl.constexpr,
             GATE: tl.constexpr, D):
    """a at step 0 of these columns (fp32), for dL/dh_0 = a_0 g^_0."""
    m = row(0, T, REV)
    a0 = tl.load(a_ptr + bi * sa_b + m * sa_t + d * sa_d, mask=dmask, other=0.0).to(tl.float32)
    if GATE:
        a0 = _gate_coeff(a0, _gate_mid(b_ptr, bi * sb_b + m * sb_t + d * sb_d, D, sb_d, dmask, GATE), GATE)
    return a0


@triton.jit
def _linear_grads(a_ptr, b_ptr, h0, hout_ptr, aout_ptr, da_ptr, db_ptr, bi, rows, d, off, mask, ghat, gahat, D,
                  sa_b, sa_t, sa_d, sb_b, sb_t, sb_d, HAS_GA: tl.constexpr, REV: tl.constexpr, reset_ptr, T,
                  HAS_RESET: tl.constexpr, GATE: tl.constexpr):
    """Store a backward tile's da = g^_t h_{t-1} (+ the prefix grad's g^A_t A_{t-1}) and db = g^_t
    (``off``: the tile's memory offsets; step t - 1 is a row before, or after with REV). GATE:
    the gate's operand grads from them (``_gate_grads``) into one contiguous (B, T, n D) gradient
    of its n operands (n = 2 for minGRU, 3 signed): the first operand's at da_ptr, v's at db_ptr,
    zk's D columns before v's."""
    first = (rows == 0)[:, None]
    later = mask & (rows >= 1)[:, None]
    back = -D if REV else D
    prev = tl.load(hout_ptr + off - back, mask=later, other=0.0).to(tl.float32)
    da = ghat * tl.where(first, h0[None, :], prev)
    if HAS_RESET:  # a reset step's coefficient was 0 whatever a said: no gradient reaches it
        da = tl.where(_resets(reset_ptr, row(rows, T, REV), T)[:, None], 0.0, da)
    if HAS_GA:
        aprev = tl.load(aout_ptr + off - back, mask=later, other=1.0).to(tl.float32)
        da += gahat * tl.where(first, 1.0, aprev)
    db = ghat
    if GATE:
        m = row(rows, T, REV)
        x = tl.load(a_ptr + bi * sa_b + m[:, None] * sa_t + d[None, :] * sa_d, mask=mask, other=0.0).to(tl.float32)
        v_off = bi * sb_b + m[:, None] * sb_t + d[None, :] * sb_d
        v = tl.load(b_ptr + v_off, mask=mask, other=0.0).to(tl.float32)
        da, dm, db = _gate_grads(x, _gate_mid(b_ptr, v_off, D, sb_d, mask, GATE), v, ghat, da, GATE)
        # row (bi T + m) of the (B T, n D) gradient, never past the n D-wide views' spans (I64); formed
        # from (row, d) and not from ``off`` (off - d + d: Triton's contiguity analysis loses the
        # columns there, and every store went scalar in the sm_90 build)
        if GATE == 1:
            width = 2 * D
        else:
            width = 3 * D
        off = (bi * T + m[:, None]) * width + d[None, :]
        if GATE >= 2:
            tl.store(db_ptr + off - D, dm.to(db_ptr.dtype.element_ty), mask=mask)  # zk's: D columns before v's
    tl.store(db_ptr + off, db.to(db_ptr.dtype.element_ty), mask=mask)
    tl.store(da_ptr + off, da.to(da_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _bwd_kernel(
    a_ptr, b_ptr, h0_ptr, gh_ptr, ga_ptr, hout_ptr, aout_ptr, carry_h_ptr, carry_a_ptr,
    da_ptr, db_ptr, dh0_ptr, sum_p_ptr, reset_ptr,
    T, D, NC, CHUNK, NBC, sa_b, sa_t, sa_d, sb_b, sb_t, sb_d, sh_b, sh_d,
    HAS_H0: tl.constexpr, HAS_GA: tl.constexpr, HAS_CARRY: tl.constexpr, SUMMARY: tl.constexpr,
    I64: tl.constexpr, FOLD: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, STAGES: tl.constexpr,
    REV: tl.constexpr, HAS_RESET: tl.constexpr, GATE: tl.constexpr, VEC: tl.constexpr,
):
    """Backward of the linear recurrence over this program's chunk, t descending, from g^
    (and the prefix grad's) after the chunk, carried through the summaries of the chunks
    after it (HAS_CARRY: sum_p, carry_h, carry_a). SUMMARY: each chunk's (product of
    a_{t+1}, g^ from zero) and the prefix grad's into sum_p, carry_h, carry_a (B, NC, D).
    b_ptr is read only with GATE (the gate's v; ``_linear_grads``)."""
    D, sa_b, sa_t, sb_b, sb_t = _rows(D, sa_b, sa_t, sb_b, sb_t, VEC)
    bi, ci, di = program(NBC, NC, I64, FOLD)
    d = di * BLOCK_D + tl.arange(0, BLOCK_D)
    dmask = d < D
    t_lo = ci * CHUNK
    side = (bi * NC + ci) * D + d

    g = tl.zeros((BLOCK_D,), tl.float32)   # g^ at the row after the current tile
    ga = tl.zeros((BLOCK_D,), tl.float32)
    prod = tl.full((BLOCK_D,), 1.0, tl.float32)
    if HAS_CARRY:
        _, g = _fold(sum_p_ptr, carry_h_ptr, g, g, bi, NC - 1, -1, NC - 1 - ci, NC, D, d, dmask)
        if HAS_GA:
            _, ga = _fold(sum_p_ptr, carry_a_ptr, ga, ga, bi, NC - 1, -1, NC - 1 - ci, NC, D, d, dmask)
    h0 = _initial_state(h0_ptr, bi, d, dmask, sh_b, sh_d, HAS_H0, BLOCK_D)

    base = bi * T * D + d[None, :]
    for j in tl.range(0, CHUNK // BLOCK_T, num_stages=STAGES):
        rows = t_lo + CHUNK - 1 - j * BLOCK_T - tl.arange(0, BLOCK_T)  # descending time
        valid = rows < T
        mask = valid[:, None] & dmask[None, :]
        off = base + row(rows, T, REV)[:, None] * D
        c = _next_a(a_ptr, b_ptr, bi, rows, d, valid, mask, T, sa_b, sa_t, sa_d, sb_b, sb_t, sb_d, REV, reset_ptr,
                    HAS_RESET, GATE, D)
        u = tl.load(gh_ptr + off, mask=mask, other=0.0).to(tl.float32)
        c_run, u_run = tl.associative_scan((c, u), 0, _combine)
        ghat = c_run * g[None, :] + u_run
        g = _last_row(ghat, BLOCK_T)
        gahat = ghat
        if HAS_GA:
            ua = tl.load(ga_ptr + off, mask=mask, other=0.0).to(tl.float32)
            ua_run = tl.associative_scan((c, ua), 0, _combine)[1]  # not `_, ua_run`: `_` is a (BLOCK_D,) above
            gahat = c_run * ga[None, :] + ua_run
            ga = _last_row(gahat, BLOCK_T)
        if SUMMARY:
            prod = prod * _last_row(c_run, BLOCK_T)
        else:
            _linear_grads(a_ptr, b_ptr, h0, hout_ptr, aout_ptr, da_ptr, db_ptr, bi, rows, d, off, mask, ghat, gahat,
                          D, sa_b, sa_t, sa_d, sb_b, sb_t, sb_d, HAS_GA, REV, reset_ptr, T, HAS_RESET, GATE)
    if SUMMARY:
        tl.store(sum_p_ptr + side, prod, mask=dmask)
        tl.store(carry_h_ptr + side, g, mask=dmask)
        if HAS_GA:
            tl.store(carry_a_ptr + side, ga, mask=dmask)
    elif HAS_H0:  # dL/dh_0 = a_0 g^_0 (g: g^ at row 0 once chunk 0 is walked)
        a0 = _first_a(a_ptr, b_ptr, bi, d, dmask, T, sa_b, sa_t, sa_d, sb_b, sb_t, sb_d, REV, GATE, D)
        tl.store(dh0_ptr + bi * D + d, (a0 * g).to(dh0_ptr.dtype.element_ty), mask=when(ci == 0, dmask))


@triton.jit
def _share(x, live):
    """exp(x) clamped to [0, 1] (a share of a positive state), 0 where not ``live``."""
    return tl.where(live, tl.minimum(tl.exp(x), 1.0), 0.0)


@triton.jit
def _in_range(h):
    """Whether a state is within e^+-LOG_RANGE (where the linear backward is exact)."""
    return (h >= 1.0 / LOG_SPAN) & (h <= LOG_SPAN)


@triton.jit(noinline=True)
def _log_bwd_rows(lc_ptr, lv_ptr, lh0_ptr, gh_ptr, h_ptr, carry_ptr, dlc_ptr, dlv_ptr, dh0_ptr, sum_p_ptr,
                  bi, ci, di, T, D, NC, CHUNK, sa_b, sa_t, sa_d, sb_b, sb_t, sb_d, sh_b, sh_d,
                  HAS_CARRY: tl.constexpr, SUMMARY: tl.constexpr, V0: tl.constexpr, BLOCK_D: tl.constexpr,
                  REV: tl.constexpr, reset_ptr, HAS_RESET: tl.constexpr):
    """``_log_bwd_kernel``'s chunk again as the bounded recurrence of the shares, row by row
    with t descending, overwriting its grads (SUMMARY: storing P and q); rarely called
    (scalar arguments, results through memory). Made a function of its own in the hope of
    sparing the hot loop registers; ptxas here says it does not (NOTES.md, session 5)."""
    d = di * BLOCK_D + tl.arange(0, BLOCK_D)
    dmask = d < D
    t_lo = ci * CHUNK
    base = bi * T * D + d
    lh0 = _log_h0(lv_ptr, lh0_ptr, bi, d, dmask, sb_b, sb_d, sh_b, sh_d, V0)
    q = tl.zeros((BLOCK_D,), tl.float32)
    if HAS_CARRY:
        _, q = _fold(sum_p_ptr, carry_ptr, q, q, bi, NC - 1, -1, NC - 1 - ci, NC, D, d, dmask)
    prod = tl.full((BLOCK_D,), 1.0, tl.float32)
    after = t_lo + CHUNK < T
    m_after = row(t_lo + CHUNK, T, REV)
    h_next = tl.load(h_ptr + base + m_after * D, mask=when(after, dmask), other=1.0).to(tl.float32)
    lc_next = tl.load(lc_ptr + bi * sa_b + m_after * sa_t + d * sa_d, mask=when(after, dmask),
                      other=0.0).to(tl.float32)
    if HAS_RESET:
        lc_next = tl.where(after & (tl.load(reset_ptr + m_after, mask=after, other=0) != 0), float("-inf"), lc_next)
    for j in range(0, tl.minimum(CHUNK, T - t_lo)):
        t = tl.minimum(t_lo + CHUNK, T) - 1 - j
        m = row(t, T, REV)
        h = tl.load(h_ptr + base + m * D, mask=dmask, other=1.0).to(tl.float32)
        lc = tl.load(lc_ptr + bi * sa_b + m * sa_t + d * sa_d, mask=dmask, other=0.0).to(tl.float32)
        if HAS_RESET:
            lc = tl.where(tl.load(reset_ptr + m) != 0, float("-inf"), lc)
        lh = tl.log(h)
        c = _share(lc_next + lh - tl.log(h_next), when(t + 1 < T, h_next > 0.0))  # r_{t+1}
        q = tl.load(gh_ptr + base + m * D, mask=dmask, other=0.0).to(tl.float32) * h + c * q
        if SUMMARY:
            prod = prod * c
        else:
            lv = tl.load(lv_ptr + bi * sb_b + (m + V0) * sb_t + d * sb_d, mask=dmask, other=float("-inf"))
            hp = tl.load(h_ptr + base + row(t - 1, T, REV) * D, mask=when(t >= 1, dmask), other=1.0).to(tl.float32)
            lh_prev = tl.where(t == 0, lh0, tl.log(hp))
            da = q * _share(lc + lh_prev - lh, h > 0.0)
            db = q * _share(lv.to(tl.float32) - lh, h > 0.0)
            tl.store(dlv_ptr + bi * (T + V0) * D + (m + V0) * D + d, db.to(dlv_ptr.dtype.element_ty), mask=dmask)
            _store_dlog_h0(dlv_ptr, dh0_ptr, bi, d, da, when(t == 0, dmask), T, D, V0)
            tl.store(dlc_ptr + base + m * D, da.to(dlc_ptr.dtype.element_ty), mask=dmask)
        h_next, lc_next = h, lc
    if SUMMARY:
        tl.store(sum_p_ptr + (bi * NC + ci) * D + d, prod, mask=dmask)
        tl.store(carry_ptr + (bi * NC + ci) * D + d, q, mask=dmask)


@triton.jit
def _log_bwd_kernel(
    lc_ptr, lv_ptr, lh0_ptr, gh_ptr, h_ptr, carry_ptr, dlc_ptr, dlv_ptr, dh0_ptr, sum_p_ptr, reset_ptr,
    T, D, NC, CHUNK, NBC, sa_b, sa_t, sa_d, sb_b, sb_t, sb_d, sh_b, sh_d,
    HAS_CARRY: tl.constexpr, SUMMARY: tl.constexpr, V0: tl.constexpr, I64: tl.constexpr, FOLD: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, STAGES: tl.constexpr, REV: tl.constexpr,
    HAS_RESET: tl.constexpr, VEC: tl.constexpr,
):
    """Backward of the log op over this program's chunk, t descending, from q_in = g^ h at
    the row after the chunk (0 at the end of time). First the linear backward
    (g^_t = u_t + a_{t+1} g^_{t+1}, dlog_a = g^ a_t h_{t-1}, dlog_b = g^ b_t from
    g^ = q_in / h there), which also gathers where it is not exact: growing coefficients,
    decays or log values beyond e^+-LOG_RANGE, states outside e^+-LOG_RANGE; if anything
    was, the chunk again as the bounded recurrence of the shares (module doc), overwriting.
    SUMMARY: each chunk's (P, q from zero) with q_start = P q_in + q: the carries are q.
    Rows and log h_0 as in ``_log_fwd_kernel`` (V0); dlog h_0 into dh0 (dlog_values itself at V0 = 1)."""
    D, sa_b, sa_t, sb_b, sb_t = _rows(D, sa_b, sa_t, sb_b, sb_t, VEC)
    bi, ci, di = program(NBC, NC, I64, FOLD)
    d = di * BLOCK_D + tl.arange(0, BLOCK_D)
    dmask = d < D
    t_lo = ci * CHUNK
    side = (bi * NC + ci) * D + d
    base = bi * T * D + d
    lh0 = _log_h0(lv_ptr, lh0_ptr, bi, d, dmask, sb_b, sb_d, sh_b, sh_d, V0)  # log h_0
    q_in = tl.zeros((BLOCK_D,), tl.float32)
    if HAS_CARRY:  # carried through the summaries (sum_p, carry) of the chunks after this one
        _, q_in = _fold(sum_p_ptr, carry_ptr, q_in, q_in, bi, NC - 1, -1, NC - 1 - ci, NC, D, d, dmask)
    # the states the linear walk divides and multiplies by: after the chunk (q_in -> g^) and
    # at its first row (g^ -> q)
    after = t_lo + CHUNK < T
    h_after = tl.load(h_ptr + base + row(t_lo + CHUNK, T, REV) * D, mask=when(after, dmask), other=1.0).to(tl.float32)
    h_first = tl.load(h_ptr + base + row(t_lo, T, REV) * D, mask=dmask, other=1.0).to(tl.float32)
    edge = dmask & (when(after, ~_in_range(h_after)) | ~_in_range(h_first))

    g = q_in / h_after
    lsum = tl.zeros((BLOCK_T, BLOCK_D), tl.float32)  # SUMMARY: sum of log a_{t+1} over the chunk
    bad = tl.zeros((BLOCK_T, BLOCK_D), tl.int1) | edge[None, :]
    for j in tl.range(0, CHUNK // BLOCK_T, num_stages=STAGES):
        rows = t_lo + CHUNK - 1 - j * BLOCK_T - tl.arange(0, BLOCK_T)  # descending time
        valid = rows < T
        mask = valid[:, None] & dmask[None, :]
        nxt = (rows + 1 < T)[:, None] & mask
        mrows = row(rows, T, REV)
        off = base[None, :] + mrows[:, None] * D
        a_off = bi * sa_b + mrows[:, None] * sa_t + d[None, :] * sa_d
        if HAS_RESET:  # a reset at step t + 1: its coefficient is 0 (log -inf, the masked value)
            nxt = nxt & ~_resets(reset_ptr, row(rows + 1, T, REV), T)[:, None]
        lc_next = tl.load(lc_ptr + a_off + (-sa_t if REV else sa_t), mask=nxt, other=float("-inf")).to(tl.float32)
        c = tl.where(valid[:, None], tl.exp(lc_next), 1.0)
        u = tl.load(gh_ptr + off, mask=mask, other=0.0).to(tl.float32)
        c_run, u_run = tl.associative_scan((c, u), 0, _combine)
        ghat = c_run * g[None, :] + u_run
        g = _last_row(ghat, BLOCK_T)
        grows = c > 1.0  # exact where: decays only (from a and b, live anyway: fewer registers than logs)
        if SUMMARY:
            lsum += tl.where(nxt, lc_next, 0.0)
            bad = bad | grows
        else:
            lc = tl.load(lc_ptr + a_off, mask=mask, other=0.0).to(tl.float32)
            rst = mask & False
            if HAS_RESET:
                rst = _resets(reset_ptr, mrows, T)[:, None] & mask
                lc = tl.where(rst, float("-inf"), lc)
            lv = tl.load(lv_ptr + bi * sb_b + (mrows + V0)[:, None] * sb_t + d[None, :] * sb_d, mask=mask,
                         other=0.0).to(tl.float32)
            hp = tl.load(h_ptr + off - (-D if REV else D), mask=(rows >= 1)[:, None] & mask, other=1.0).to(tl.float32)
            hp = tl.where((rows == 0)[:, None], tl.exp(lh0)[None, :], hp)  # h_{t-1}
            a, b = tl.exp(lc), tl.exp(lv)
            _log_grads(dlc_ptr, dlv_ptr, dh0_ptr, bi, rows, mrows, off, mask, ghat * a * hp, ghat * b, T, D, V0)
            # and decays, log values and the states multiplied by within e^+-LOG_RANGE
            # (a reset's a = 0 is exact: its dlog_a is 0 either way)
            far = (a > 1.0) | ((a < 1.0 / LOG_SPAN) & ~rst) | (b < 1.0 / LOG_SPAN) | (b > LOG_SPAN) \
                | (~_in_range(hp) & ~rst)
            bad = bad | grows | (mask & far)
    q = g * h_first
    # P = prod r_{t+1} = (prod a_{t+1}) h_first / h_after, from logs: prod a alone can underflow
    prod = tl.where(after, tl.exp(tl.sum(lsum, axis=0) + tl.log(h_first) - tl.log(h_after)), 0.0)
    if tl.max(tl.max(bad.to(tl.int32), axis=0), axis=0) > 0:
        _log_bwd_rows(lc_ptr, lv_ptr, lh0_ptr, gh_ptr, h_ptr, carry_ptr, dlc_ptr, dlv_ptr, dh0_ptr, sum_p_ptr,
                      bi, ci, di, T, D, NC, CHUNK, sa_b, sa_t, sa_d, sb_b, sb_t, sb_d, sh_b, sh_d,
                      HAS_CARRY, SUMMARY, V0, BLOCK_D, REV, reset_ptr, HAS_RESET)
    elif SUMMARY:
        tl.store(sum_p_ptr + side, prod, mask=dmask)
        tl.store(carry_ptr + side, q, mask=dmask)


@triton.jit
def _log_h0(lv_ptr, lh0_ptr, bi, d, dmask, sb_b, sb_d, sh_b, sh_d, V0: tl.constexpr):
    """log h_0 (fp32, 0 where masked): slot 0 of lv (V0 = 1; lh0 is None) or lh0 (V0 = 0)."""
    if V0 == 1:
        x = tl.load(lv_ptr + bi * sb_b + d * sb_d, mask=dmask, other=0.0)
    else:
        x = tl.load(lh0_ptr + bi * sh_b + d * sh_d, mask=dmask, other=0.0)
    return x.to(tl.float32)


@triton.jit
def _store_dlog_h0(dlv_ptr, dh0_ptr, bi, col, da, mask, T, D, V0: tl.constexpr):
    """d/dlog h_0 = dlog_a_0 (= q_0 r_0) at columns ``col``: into slot 0 of dlog_values
    (B, T + 1, D) when V0 = 1 (dh0 is None), else into dlog_h0 (B, D)."""
    if V0 == 1:
        tl.store(dlv_ptr + bi * (T + 1) * D + col, da.to(dlv_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(dh0_ptr + bi * D + col, da.to(dh0_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _log_grads(dlc_ptr, dlv_ptr, dh0_ptr, bi, rows, mrows, off, mask, da, db, T, D, V0: tl.constexpr):
    """Store a tile's dlog_a (into dlog_coeffs), its dlog_b into row t + V0 of dlog_values
    (B, T + V0, D), and step 0's dlog_a as dlog h_0 (``_store_dlog_h0``); ``rows`` the tile's
    steps, ``mrows`` their memory rows (``lang.row``), ``off`` their offsets."""
    tl.store(dlv_ptr + off + V0 * (bi * D + D), db.to(dlv_ptr.dtype.element_ty), mask=mask)
    col = off - bi * T * D - mrows[:, None] * D  # d, per element of the tile
    _store_dlog_h0(dlv_ptr, dh0_ptr, bi, col, da, mask & (rows == 0)[:, None], T, D, V0)
    tl.store(dlc_ptr + off, da.to(dlc_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _bwd_lookback_kernel(
    a_ptr, b_ptr, h0_ptr, gh_ptr, ga_ptr, hout_ptr, aout_ptr, status_ptr, da_ptr, db_ptr, dh0_ptr, reset_ptr,
    T, D, NBD, ND, STRIDE_T, sa_b, sa_t, sa_d, sb_b, sb_t, sb_d, sh_b, sh_d,
    HAS_H0: tl.constexpr, HAS_GA: tl.constexpr, I64: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, WINDOW: tl.constexpr, PREFIX_EVERY: tl.constexpr,
    REV: tl.constexpr, HAS_RESET: tl.constexpr, GATE: tl.constexpr, VEC: tl.constexpr,
):
    """Single-pass backward of the linear recurrence: ``_bwd_kernel``'s tile body, one tile
    per program, tiles taken from the end of time; the carry (g^ after the tile) by
    decoupled look-back."""
    D, sa_b, sa_t, sb_b, sb_t = _rows(D, sa_b, sa_t, sb_b, sb_t, VEC)
    n_tiles = tl.cdiv(T, BLOCK_T)
    tr, bi, di, epoch = _lookback_program(status_ptr, NBD, ND, n_tiles * NBD, I64)  # tr: tiles from the end of time
    d = di * BLOCK_D + tl.arange(0, BLOCK_D)
    dmask = d < D
    rows = (n_tiles - tr) * BLOCK_T - 1 - tl.arange(0, BLOCK_T)  # descending time
    valid = rows < T
    mask = valid[:, None] & dmask[None, :]
    off = bi * T * D + row(rows, T, REV)[:, None] * D + d[None, :]
    cf = _next_a(a_ptr, b_ptr, bi, rows, d, valid, mask, T, sa_b, sa_t, sa_d, sb_b, sb_t, sb_d, REV, reset_ptr,
                 HAS_RESET, GATE, D)
    u = tl.load(gh_ptr + off, mask=mask, other=0.0).to(tl.float32)
    c_run, u_run = tl.associative_scan((cf, u), 0, _combine)
    tot_c = _last_row(c_run, BLOCK_T)
    zero = tl.zeros((BLOCK_D,), tl.float32)
    words = status_ptr + 1
    plane = STRIDE_T * n_tiles
    col = bi * D + d
    _, g = _carry_in(words, words + plane, tr, STRIDE_T, col, dmask, tot_c, _last_row(u_run, BLOCK_T), zero,
                     epoch, BLOCK_D, WINDOW, PREFIX_EVERY)
    ghat = c_run * g[None, :] + u_run
    gahat = ghat
    if HAS_GA:
        ua = tl.load(ga_ptr + off, mask=mask, other=0.0).to(tl.float32)
        _, ua_run = tl.associative_scan((cf, ua), 0, _combine)
        _, ga = _carry_in(words + 2 * plane, words + 3 * plane, tr, STRIDE_T, col, dmask, tot_c,
                          _last_row(ua_run, BLOCK_T), zero, epoch, BLOCK_D, WINDOW, PREFIX_EVERY)
        gahat = c_run * ga[None, :] + ua_run
    last = tr == n_tiles - 1  # the tile holding t = 0
    h0 = _initial_state(h0_ptr, bi, d, when(last, dmask), sh_b, sh_d, HAS_H0, BLOCK_D)
    _linear_grads(a_ptr, b_ptr, h0, hout_ptr, aout_ptr, da_ptr, db_ptr, bi, rows, d, off, mask, ghat, gahat, D,
                  sa_b, sa_t, sa_d, sb_b, sb_t, sb_d, HAS_GA, REV, reset_ptr, T, HAS_RESET, GATE)
    if HAS_H0:  # dL/dh_0 = a_0 g^_0
        a0 = _first_a(a_ptr, b_ptr, bi, d, dmask, T, sa_b, sa_t, sa_d, sb_b, sb_t, sb_d, REV, GATE, D)
        tl.store(dh0_ptr + bi * D + d, (a0 * _last_row(ghat, BLOCK_T)).to(dh0_ptr.dtype.element_ty),
                 mask=when(last, dmask))


def _vec(D, *tensors, kind: str) -> int:
    """The ``kind`` kernels' VEC over these rows (``common.row_vector``; 1: no rewrite)."""
    return max(1, common.row_vector(D, *tensors, kind=kind))


def _h0_strides(h0):
    return h0.stride() if h0 is not None else (0, 0)


def _geometry(a, log: bool, pass_: str, *rows, gate: int = 0):
    """(BLOCK_T, BLOCK_D, warps, pipelining stages, chunks, chunk length) for (B, T, D) inputs
    ``a`` in pass ``pass_`` ("fwd" / "bwd") over the tensors ``rows`` it reads and writes: the
    in-thread walking tiles where they apply (``common.in_thread_walk``; not the log op nor the
    gates: ``common.IN_THREAD``), else enough T-chunks of the family's tiles to
    fill the device, pipelined only where the rows are aligned (``common.stages``); chunks a
    whole number of tiles long."""
    B, T, D = a.shape
    if not log and (not gate or common.IN_THREAD["gates"]) and common.in_thread_walk(a.device, B, D, pass_, *rows):
        block_t, block_d, warps = common.IN_THREAD["tile"]
        return block_t, block_d, warps, common.IN_THREAD["stages"][pass_], 1, cdiv(T, block_t) * block_t
    block_t, block_d, warps = tiles(a.device, log)
    nc = num_chunks(B * cdiv(D, block_d), T, block_t, a.device)
    chunk = cdiv(cdiv(T, nc), block_t) * block_t
    return block_t, block_d, warps, common.stages(log, pass_, D, *rows), cdiv(T, chunk), chunk


def _forward(a, b, h0, log: bool, write_a: bool, reverse: bool = False, reset=None, gate: int = 0):
    """States (and running products when ``write_a``) of the elementwise recurrence: one
    pass, or where T is chunked a summary pass and the main pass, which folds the chunk
    summaries into each chunk's carry-in (``linear_scan`` runs single-pass there instead).
    ``reverse``: from the end of time (the log op's slot 0 stays log h_0, read in place).
    ``reset``: int8 (T,) flags of the memory rows where a packed sequence's scan begins (B = 1).
    ``gate``: a, b are a gate's first and last pre-activations (``GATES``), the recurrence's from them.
    Planned once per shape class (``common.planned``); a call allocates and launches."""
    key = ("fwd", a.shape, a.stride(), a.dtype, a.device, align(a), b.shape, b.stride(), align(b),
           None if h0 is None else h0.stride(), align(h0), align(reset), log, write_a, reverse, gate,
           common.plan_epoch())
    return common.planned(key, lambda: _plan_forward(a, b, h0, log, write_a, reverse, reset, gate))(a, b, h0, reset)


def _plan_forward(a, b, h0, log, write_a, reverse, reset, gate):
    """``run(a, b, h0, reset) -> (products or None, states)`` for inputs like these."""
    B, T, D = a.shape
    shape = (B, T, D)

    def outputs(a):
        out_h = a.new_empty(shape)
        return (a.new_empty(shape) if write_a else out_h), out_h

    if B * T * D == 0:
        def empty(a, b, h0, reset):
            out_a, out_h = outputs(a)
            return (out_a if write_a else None), out_h
        return empty
    out = torch.empty(shape, device="meta")  # the outputs' layout (contiguous), for the geometry
    block_t, block_d, warps, stages, nc, chunk = _geometry(a, log, "fwd", a, b, out, gate=gate)
    strides = (*a.stride(), *b.stride(), *_h0_strides(h0))
    flags = dict(REV=reverse, HAS_RESET=reset is not None)
    if not log and common.use_lookback(nc):
        words, grid, meta, scalars = _lookback_plan(_fwd_lookback_kernel, a, 2, (a, b, h0, out, out, reset), strides,
                                                    HAS_H0=h0 is not None, WRITE_A=write_a, GATE=gate,
                                                    VEC=_vec(D, a, b, out, kind="lookback"), **flags)
        lookback = common.Slot(_fwd_lookback_kernel, grid, **meta)

        def run(a, b, h0, reset):
            out_a, out_h = outputs(a)
            lookback(a, b, h0, common.status_words(a.device, words), out_a, out_h, reset, *scalars)
            return (out_a if write_a else None), out_h
        return run
    kernel = _log_fwd_kernel if log else _fwd_kernel
    grid = (B * nc, cdiv(D, block_d))
    flags.update(BLOCK_T=block_t, BLOCK_D=block_d, STAGES=stages, num_warps=warps,
                 VEC=_vec(D, a, b, out, kind="log" if log else "linear"))
    flags.update(V0=int(h0 is None)) if log else flags.update(HAS_H0=h0 is not None, GATE=gate)
    scalars = (T, D, nc, chunk, B * nc, *strides)
    summary = common.Slot(kernel, grid, HAS_CARRY=False, SUMMARY=True, I64=needs_int64(a, b),
                          **dict(flags, WRITE_A=True) if not log else flags) if nc > 1 else None
    main = common.Slot(kernel, grid, HAS_CARRY=nc > 1, SUMMARY=False, I64=needs_int64(a, b, out),
                       **dict(flags, WRITE_A=write_a) if not log else flags)

    def run(a, b, h0, reset):
        out_a, out_h = outputs(a)
        sum_a = sum_h = None
        if summary is not None:  # each chunk's (product of a, state from zero); the log op's in log space
            sum_a = a.new_empty((B, nc, D), dtype=torch.float32)
            sum_h = torch.empty_like(sum_a)
            if log:
                summary(a, b, h0, sum_a, sum_h, None, reset, *scalars)
            else:
                summary(a, b, h0, None, None, sum_a, sum_h, reset, *scalars)
        if log:
            main(a, b, h0, sum_a, sum_h, out_h, reset, *scalars)
        else:
            main(a, b, h0, sum_a, sum_h, out_a, out_h, reset, *scalars)
        return (out_a if write_a else None), out_h
    return run


def _lookback_plan(kernel, a, planes: int, tensors, strides, **flags):
    """A single-pass look-back kernel over (B, T, D) inputs like ``a``: (status words it takes,
    its grid, its constexprs, its scalar arguments); a program per tile, a ticket word and
    ``planes`` status words per (tile, column) (``common.status_words``), passed between its
    tensors before and after them, then its geometry and ``strides``. ``tensors``: those it
    reads and writes (for the offsets' width)."""
    B, T, D = a.shape
    block_t, block_d, warps = common.lookback_tiles(a.device)
    nd, n_tiles = cdiv(D, block_d), cdiv(T, block_t)
    words = planes * n_tiles * B * D
    meta = dict(I64=needs_int64(*tensors) or 1 + words >= common.INT32_LIMIT, BLOCK_T=block_t, BLOCK_D=block_d,
                WINDOW=common.LOOKBACK["window"], PREFIX_EVERY=common.LOOKBACK["prefix_every"], num_warps=warps,
                **flags)
    return words, (n_tiles * B * nd,), meta, (T, D, B * nd, nd, B * D, *strides)


def _backward(a, b, h0, gh, ga, hout, aout, log: bool, reverse: bool = False, reset=None, gate: int = 0):
    """Input grads (da, db, dh0) of the elementwise recurrence from the saved outputs (the
    log op: of log_coeffs, log_values and log_h0, None in the slot-0 form); ``reverse`` as the
    forward ran. ``gate`` (a, b = a gate's first and last operands): (dp, None, dh0), dp
    (B, T, n D) the grads of its n operands side by side. Planned once per shape class."""
    gh = gh.contiguous()
    ga = ga.contiguous() if ga is not None else None
    key = ("bwd", a.shape, a.stride(), a.dtype, a.device, align(a), b.shape, b.stride(), align(b),
           None if h0 is None else h0.stride(), align(h0), align(gh), align(ga), hout.stride(), align(hout),
           None if aout is None else aout.stride(), align(aout), align(reset), log, reverse, gate, common.plan_epoch())
    run = common.planned(key, lambda: _plan_backward(a, b, h0, gh, ga, hout, aout, log, reverse, reset, gate))
    return run(a, b, h0, gh, ga, hout, aout, reset)


def _plan_backward(a, b, h0, gh, ga, hout, aout, log, reverse, reset, gate):
    """``run(a, b, h0, gh, ga, hout, aout, reset) -> grads`` for inputs like these (``_backward``)."""
    B, T, D = a.shape
    n = GATES[gate][1] if gate else 1
    has_h0 = h0 is not None  # (the plan's closures keep no tensor of the call that made it)

    def outputs(a, b, like=None):
        """(dp or None, da, db, dh0); ``like`` "meta": their layout only (for the geometry)."""
        new = (lambda shape: torch.empty(shape, device="meta")) if like == "meta" else a.new_empty
        if gate:  # one gradient of the gate's operands, as the projection that gave them wants it
            dp = new((B, T, n * D))
            return dp, dp[..., :D], dp[..., (n - 1) * D:], new((B, D)) if has_h0 else None
        return None, new((B, T, D)), new(b.shape), new((B, D)) if has_h0 else None  # (b: a's dtype and device)

    def grads(dp, da, db, dh0):
        return (dp, None, dh0) if gate else (da, db, dh0)

    if B * T * D == 0:
        def empty(a, b, h0, gh, ga, hout, aout, reset):
            dp, da, db, dh0 = outputs(a, b)
            da.zero_(), db.zero_(), (dh0.zero_() if dh0 is not None else None)
            return grads(dp, da, db, dh0)
        return empty
    _, da, db, dh0 = outputs(a, b, "meta")
    rows = (a, b, gh, ga, hout, aout, da, db)
    block_t, block_d, warps, stages, nc, chunk = _geometry(a, log, "bwd", *rows, gate=gate)
    strides = (*a.stride(), *b.stride(), *_h0_strides(h0))
    flags = dict(REV=reverse, HAS_RESET=reset is not None)
    if not log and common.use_lookback(nc):  # two status planes per recurrence: (g^, and the prefix grad's)
        words, grid, meta, scalars = _lookback_plan(
            _bwd_lookback_kernel, a, 4 if ga is not None else 2, (a, b, h0, gh, ga, hout, aout, da, db, dh0, reset),
            strides, HAS_H0=h0 is not None, HAS_GA=ga is not None, GATE=gate, VEC=_vec(D, *rows, kind="lookback"),
            **flags)
        lookback = common.Slot(_bwd_lookback_kernel, grid, **meta)

        def run(a, b, h0, gh, ga, hout, aout, reset):
            dp, da, db, dh0 = outputs(a, b)
            lookback(a, b, h0, gh, ga, hout, aout, common.status_words(a.device, words), da, db, dh0, reset, *scalars)
            return grads(dp, da, db, dh0)
        return run
    flags.update(I64=needs_int64(a, b, gh, hout, da, db), BLOCK_T=block_t, BLOCK_D=block_d, STAGES=stages,
                 num_warps=warps, VEC=_vec(D, *rows, kind="log" if log else "linear"))
    if log:
        kernel = _log_bwd_kernel
        flags.update(V0=int(h0 is None))
    else:
        kernel = _bwd_kernel
        flags.update(HAS_H0=h0 is not None, HAS_GA=ga is not None, GATE=gate)
    grid = (B * nc, cdiv(D, block_d))
    scalars = (T, D, nc, chunk, B * nc, *strides)
    summary = common.Slot(kernel, grid, HAS_CARRY=False, SUMMARY=True, **flags) if nc > 1 else None
    main = common.Slot(kernel, grid, HAS_CARRY=nc > 1, SUMMARY=False, **flags)

    def run(a, b, h0, gh, ga, hout, aout, reset):
        dp, da, db, dh0 = outputs(a, b)
        before = (a, b, h0, gh, hout) if log else (a, b, h0, gh, ga, hout, aout)
        sum_p, sums = None, ((None,) if log else (None, None))
        if summary is not None:  # each chunk's summary, which the main pass folds into its carry-in
            sum_p = a.new_empty((B, nc, D), dtype=torch.float32)
            sums = (torch.empty_like(sum_p),) if log else (torch.empty_like(sum_p),
                                                            torch.empty_like(sum_p) if ga is not None else None)
            summary(*before, *sums, None, None, None, sum_p, reset, *scalars)
        main(*before, *sums, da, db, dh0, sum_p, reset, *scalars)
        return grads(dp, da, db, dh0)
    return run


linear_scan = common.prefix_scan_op(
    "linear_scan",
    lambda a, b, h0, write_a, reverse, reset: _forward(a, b, h0, log=False, write_a=write_a, reverse=reverse,
                                                       reset=reset),
    lambda a, h0, prod, h, g_prod, g_h, reverse, reset: _backward(
        a, a, h0, g_h, g_prod, h, prod if g_prod is not None else None, log=False, reverse=reverse, reset=reset),
)


# The gates' (name, operands): gated_scan(proj (B, T, n D), h0, gate) scans the recurrence whose
# (a, b) the gate forms from proj's n column blocks (kernel doc above ``_gate_mid``)
GATES = {1: ("minGRU [k | v]", 2), 2: ("signed minGRU [s | zk | v]", 3), 3: ("coupled signed minGRU [s | zk | v]", 3)}


def _operands(proj: torch.Tensor, gate: int):
    """The gate's first and last operand blocks of proj (views): what the kernels take as (a, b)."""
    D = proj.shape[2] // GATES[gate][1]
    return proj[..., :D], proj[..., proj.shape[2] - D:]


def _gated_fwd(proj: torch.Tensor, h0: Optional[torch.Tensor], gate: int) -> torch.Tensor:
    return _forward(*_operands(proj, gate), h0, log=False, write_a=False, gate=gate)[1]


def _gated_bwd(proj: torch.Tensor, h0: Optional[torch.Tensor], h: torch.Tensor, g_h: torch.Tensor,
               gate: int) -> tuple[torch.Tensor, torch.Tensor]:
    d_proj, _, d_h0 = _backward(*_operands(proj, gate), h0, g_h, None, h, None, log=False, gate=gate)
    return d_proj, (d_h0 if d_h0 is not None else h.new_empty(0))


gated_scan_fwd = common.opaque_op("scankit::gated_scan_fwd", _gated_fwd)
gated_scan_bwd = common.opaque_op("scankit::gated_scan_bwd", _gated_bwd)


@gated_scan_fwd.register_fake
def _(proj, h0, gate):
    B, T, nD = proj.shape
    return _empty((B, T, nD // GATES[gate][1]), proj)


@gated_scan_bwd.register_fake
def _(proj, h0, h, g_h, gate):
    return _empty(proj.shape, proj), _empty(h0.shape if h0 is not None else (0,), proj)


_gated_bwd_call = common.either(gated_scan_bwd, _gated_bwd)


def _gated_setup(ctx, inputs, output):
    proj, h0, ctx.gate = inputs
    ctx.has_h0 = h0 is not None
    ctx.save_for_backward(proj, h0, output)


def _gated_backward(ctx, g_h):
    proj, h0, h = ctx.saved_tensors
    if g_h is None:
        return None, None, None
    d_proj, d_h0 = _gated_bwd_call(proj, h0, h, g_h, ctx.gate)
    return d_proj, (d_h0 if ctx.has_h0 else None), None


# A gated recurrence from its pre-activations, the gate math in the linear kernels' registers:
# proj (B, T, n D), h0 (B, D) or None (zeros), gate (``GATES``) -> h (B, T, D); its backward
# gives d proj (B, T, n D) and dh0
gated_scan = common.with_autograd(gated_scan_fwd, _gated_fwd, _gated_setup, _gated_backward)


def _log_fwd(log_coeffs: torch.Tensor, log_values: torch.Tensor, log_h0: Optional[torch.Tensor],
             reverse: bool, reset: Optional[torch.Tensor]) -> torch.Tensor:
    return _forward(log_coeffs, log_values, log_h0, log=True, write_a=False, reverse=reverse, reset=reset)[1]


def _log_bwd(log_coeffs: torch.Tensor, log_values: torch.Tensor, log_h0: Optional[torch.Tensor], h: torch.Tensor,
             g_h: torch.Tensor, reverse: bool, reset: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor,
                                                                                    torch.Tensor]:
    d_coeffs, d_values, d_h0 = _backward(log_coeffs, log_values, log_h0, g_h, None, h, None, log=True, reverse=reverse,
                                         reset=reset)
    return d_coeffs, d_values, (d_h0 if d_h0 is not None else log_coeffs.new_empty(0))


log_scan_fwd = common.opaque_op("scankit::log_scan_fwd", _log_fwd)
log_scan_bwd = common.opaque_op("scankit::log_scan_bwd", _log_bwd)


@log_scan_fwd.register_fake
def _(log_coeffs, log_values, log_h0, reverse, reset):
    return _empty(log_coeffs.shape, log_coeffs)


@log_scan_bwd.register_fake
def _(log_coeffs, log_values, log_h0, h, g_h, reverse, reset):
    return (_empty(log_coeffs.shape, log_coeffs), _empty(log_values.shape, log_values),
            _empty(log_h0.shape if log_h0 is not None else (0,), log_coeffs))


_log_bwd_call = common.either(log_scan_bwd, _log_bwd)


def _log_setup(ctx, inputs, output):
    ctx.has_h0, ctx.reverse = inputs[2] is not None, inputs[3]
    ctx.save_for_backward(*inputs[:3], inputs[4], output)


def _log_backward(ctx, g_h):
    log_coeffs, log_values, log_h0, reset, h = ctx.saved_tensors
    if g_h is None:
        return None, None, None, None, None
    d_coeffs, d_values, d_h0 = _log_bwd_call(log_coeffs, log_values, log_h0, h, g_h, ctx.reverse, reset)
    return d_coeffs, d_values, (d_h0 if ctx.has_h0 else None), None, None


log_scan = common.with_autograd(log_scan_fwd, _log_fwd, _log_setup, _log_backward)
