"""Triton kernels for the elementwise recurrences (``linear_scan``, ``parallel_scan_log``).

Layout (B, T, D), D contiguous. One program owns (batch, T-chunk, D-tile); it walks its
chunk in (BLOCK_T, BLOCK_D) tiles, scanning each tile in registers with
``tl.associative_scan`` and carrying the last row to the next tile. Every tensor is read
once and written once. The backward is the same recurrence on reversed time:
``g^_t = g_t + a_{t+1} g^_{t+1}``, ``db_t = g^_t``, ``da_t = g^_t h_{t-1}``.

When (batch x D-tiles) programs cannot fill the GPU, T is split into chunks: a summary
pass reduces each chunk to (product of a, state from zero), a small scan over the chunk
summaries gives each chunk its carry-in, and the main pass runs every chunk in parallel.
The log op runs the same recurrence in linear space (fp32): ``a = exp(log_coeffs)``,
``b = exp(log_values)``, and its grads are chained through the exps.
"""
from typing import Optional

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from . import common
from .common import cdiv, empty_like_shape as _empty, num_chunks, tiles


@triton.jit
def _combine(a1, b1, a2, b2):
    """(a1, b1) then (a2, b2): x -> a2 (a1 x + b1) + b2."""
    return a1 * a2, a2 * b1 + b2


@triton.jit
def _last_row(x, BLOCK_T: tl.constexpr):
    rows = tl.arange(0, BLOCK_T)
    return tl.sum(tl.where(rows[:, None] == BLOCK_T - 1, x, 0.0), axis=0)


@triton.jit
def _initial_state(b_ptr, h0_ptr, bi, d, mask, sb_b, sb_d, sh_b, sh_d, LOG: tl.constexpr, HAS_H0: tl.constexpr,
                   BLOCK_D: tl.constexpr):
    """h_0 of these columns: exp(log_values[:, 0]) for the log op, else h0 or zeros."""
    if LOG:
        h = tl.exp(tl.load(b_ptr + bi * sb_b + d * sb_d, mask=mask, other=float("-inf")).to(tl.float32))
    elif HAS_H0:
        h = tl.load(h0_ptr + bi * sh_b + d * sh_d, mask=mask, other=0.0).to(tl.float32)
    else:
        h = tl.zeros((BLOCK_D,), tl.float32)
    return h


@triton.jit
def _load_ab(a_ptr, b_ptr, bi, rows, d, mask, sa_b, sa_t, sa_d, sb_b, sb_t, sb_d, LOG: tl.constexpr):
    """A tile's coefficients and inputs (a, b) in fp32 (log op: exps, b_t from slot t + 1)."""
    a_off = bi * sa_b + rows[:, None] * sa_t + d[None, :] * sa_d
    if LOG:
        b_off = bi * sb_b + (rows + 1)[:, None] * sb_t + d[None, :] * sb_d
        a = tl.exp(tl.load(a_ptr + a_off, mask=mask, other=0.0).to(tl.float32))
        b = tl.exp(tl.load(b_ptr + b_off, mask=mask, other=float("-inf")).to(tl.float32))
    else:
        b_off = bi * sb_b + rows[:, None] * sb_t + d[None, :] * sb_d
        a = tl.load(a_ptr + a_off, mask=mask, other=1.0).to(tl.float32)
        b = tl.load(b_ptr + b_off, mask=mask, other=0.0).to(tl.float32)
    return a, b


@triton.jit
def _load_next_a(a_ptr, bi, rows, d, valid, mask, T, sa_b, sa_t, sa_d, LOG: tl.constexpr):
    """a_{t+1} per row of a backward tile (0 past T; 1 on rows past T, the scan's identity)."""
    nxt = (rows + 1 < T)[:, None] & mask
    c_off = bi * sa_b + (rows + 1)[:, None] * sa_t + d[None, :] * sa_d
    if LOG:
        c = tl.exp(tl.load(a_ptr + c_off, mask=nxt, other=float("-inf")).to(tl.float32))
    else:
        c = tl.load(a_ptr + c_off, mask=nxt, other=0.0).to(tl.float32)
    return tl.where(valid[:, None], c, 1.0)


@triton.jit
def _store_grads(a_ptr, b_ptr, da_ptr, db_ptr, bi, rows, d, off, mask, ghat, da, D,
                 sa_b, sa_t, sa_d, sb_b, sb_t, sb_d, LOG: tl.constexpr):
    """Store a backward tile's da and db (log op: chained through the exps, db into slot t + 1)."""
    if LOG:  # d/dlog a = a * d/da ; d/dlog b = b * d/db (b = exp(log_values[t + 1]))
        a_off = bi * sa_b + rows[:, None] * sa_t + d[None, :] * sa_d
        da *= tl.exp(tl.load(a_ptr + a_off, mask=mask, other=0.0).to(tl.float32))
        b_off = bi * sb_b + (rows + 1)[:, None] * sb_t + d[None, :] * sb_d
        db = ghat * tl.exp(tl.load(b_ptr + b_off, mask=mask, other=float("-inf")).to(tl.float32))
        tl.store(db_ptr + off + bi * D + D, db.to(db_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(db_ptr + off, ghat.to(db_ptr.dtype.element_ty), mask=mask)
    tl.store(da_ptr + off, da.to(da_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _store_dh0(a_ptr, db_ptr, dh0_ptr, bi, d, dmask, g0, h0, T, D, sa_b, sa_d,
               LOG: tl.constexpr, HAS_H0: tl.constexpr):
    """dL/dh_0 = a_0 g^_0 (log op: times h_0, into log_values[:, 0])."""
    a0 = tl.load(a_ptr + bi * sa_b + d * sa_d, mask=dmask, other=0.0).to(tl.float32)
    if LOG:
        tl.store(db_ptr + bi * (T + 1) * D + d, (tl.exp(a0) * g0 * h0).to(db_ptr.dtype.element_ty), mask=dmask)
    elif HAS_H0:
        tl.store(dh0_ptr + bi * D + d, (a0 * g0).to(dh0_ptr.dtype.element_ty), mask=dmask)


@triton.jit
def _fwd_kernel(
    a_ptr, b_ptr, h0_ptr, carry_a_ptr, carry_h_ptr, out_a_ptr, out_h_ptr,
    T, D, NC, CHUNK,
    sa_b, sa_t, sa_d, sb_b, sb_t, sb_d, sh_b, sh_d,
    LOG: tl.constexpr, HAS_H0: tl.constexpr, HAS_CARRY: tl.constexpr,
    WRITE_A: tl.constexpr, SUMMARY: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, STAGES: tl.constexpr,
):
    pid = tl.program_id(0)
    bi, ci = pid // NC, pid % NC
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    dmask = d < D
    t_lo = ci * CHUNK  # this chunk: rows t_lo .. t_lo + CHUNK - 1 that are < T
    side = bi * NC * D + ci * D + d  # (B, NC, D) summary / carry slot

    prod = tl.full((BLOCK_D,), 1.0, tl.float32)
    h = tl.zeros((BLOCK_D,), tl.float32)
    if not SUMMARY:
        if HAS_CARRY:
            h = tl.load(carry_h_ptr + side, mask=dmask, other=0.0)
            if WRITE_A:
                prod = tl.load(carry_a_ptr + side, mask=dmask, other=1.0)
        else:
            h = _initial_state(b_ptr, h0_ptr, bi, d, dmask, sb_b, sb_d, sh_b, sh_d, LOG, HAS_H0, BLOCK_D)

    out_base = bi * T * D + d[None, :]
    for j in tl.range(0, CHUNK // BLOCK_T, num_stages=STAGES):
        rows = t_lo + j * BLOCK_T + tl.arange(0, BLOCK_T)
        mask = (rows < T)[:, None] & dmask[None, :]
        a, b = _load_ab(a_ptr, b_ptr, bi, rows, d, mask, sa_b, sa_t, sa_d, sb_b, sb_t, sb_d, LOG)
        a_run, b_run = tl.associative_scan((a, b), 0, _combine)
        hs = a_run * h[None, :] + b_run
        if not SUMMARY:
            out_off = out_base + rows[:, None] * D
            tl.store(out_h_ptr + out_off, hs.to(out_h_ptr.dtype.element_ty), mask=mask)
            if WRITE_A:
                tl.store(out_a_ptr + out_off, (a_run * prod[None, :]).to(out_a_ptr.dtype.element_ty), mask=mask)
        h = _last_row(hs, BLOCK_T)
        prod = prod * _last_row(a_run, BLOCK_T)
    if SUMMARY:
        tl.store(out_a_ptr + side, prod, mask=dmask)
        tl.store(out_h_ptr + side, h, mask=dmask)


@triton.jit
def _pack(x, FLAG: tl.constexpr):
    """A look-back status word: fp32 ``x`` in the low 32 bits, ``FLAG`` above (1: the tile's
    aggregate, 2: its inclusive prefix). One 64-bit store, so a reader sees value and flag
    together and needs no fence."""
    return x.to(tl.uint32, bitcast=True).to(tl.int64) | (FLAG << 32)


@triton.jit
def _unpack(w):
    return (w & 0xFFFFFFFF).to(tl.uint32).to(tl.float32, bitcast=True)


@triton.jit
def _look_back(words_a, words_h, ti, stride_t, col, colmask, BLOCK_D: tl.constexpr, WINDOW: tl.constexpr):
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
        flag = tl.where((wa >> 32) == (wh >> 32), wa >> 32, 0)
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
def _carry_in(words_a, words_h, ti, stride_t, col, colmask, tot_a, tot_h, init_h,
              BLOCK_D: tl.constexpr, WINDOW: tl.constexpr, PREFIX_EVERY: tl.constexpr):
    """Carry-in (A, H) of tile ``ti`` (``init_h`` for tile 0) for these columns: publish the
    tile's aggregate (tot_a, tot_h), look back, publish its inclusive prefix. PREFIX_EVERY > 1
    (tests) publishes only every so many prefixes, so look-backs compose aggregates."""
    slot = ti * stride_t + col
    if ti == 0:
        carry_a = tl.full((BLOCK_D,), 1.0, tl.float32)
        carry_h = init_h
    else:
        tl.store(words_a + slot, _pack(tot_a, 1), mask=colmask)
        tl.store(words_h + slot, _pack(tot_h, 1), mask=colmask)
        carry_a, carry_h = _look_back(words_a, words_h, ti, stride_t, col, colmask, BLOCK_D, WINDOW)
    if ti % PREFIX_EVERY == 0:
        inc_a, inc_h = _combine(carry_a, carry_h, tot_a, tot_h)
        tl.store(words_a + slot, _pack(inc_a, 2), mask=colmask)
        tl.store(words_h + slot, _pack(inc_h, 2), mask=colmask)
    return carry_a, carry_h


@triton.jit
def _fwd_lookback_kernel(
    a_ptr, b_ptr, h0_ptr, status_ptr, out_a_ptr, out_h_ptr,
    T, D, NBD, ND, STRIDE_T,
    sa_b, sa_t, sa_d, sb_b, sb_t, sb_d, sh_b, sh_d,
    LOG: tl.constexpr, HAS_H0: tl.constexpr, WRITE_A: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, WINDOW: tl.constexpr, PREFIX_EVERY: tl.constexpr,
):
    """Single-pass forward: one (BLOCK_T, BLOCK_D) tile per program, its carry-in from
    the tiles before it by decoupled look-back (status words after the ticket counter)."""
    v = tl.atomic_add(status_ptr, 1).to(tl.int32)  # ticket: time-tile major, so predecessors start first
    ti, c = v // NBD, v % NBD
    bi, di = c // ND, c % ND
    d = di * BLOCK_D + tl.arange(0, BLOCK_D)
    dmask = d < D
    rows = ti * BLOCK_T + tl.arange(0, BLOCK_T)
    mask = (rows < T)[:, None] & dmask[None, :]
    a, b = _load_ab(a_ptr, b_ptr, bi, rows, d, mask, sa_b, sa_t, sa_d, sb_b, sb_t, sb_d, LOG)
    a_run, b_run = tl.associative_scan((a, b), 0, _combine)
    tot_a, tot_h = _last_row(a_run, BLOCK_T), _last_row(b_run, BLOCK_T)
    init_h = _initial_state(b_ptr, h0_ptr, bi, d, dmask & (ti == 0), sb_b, sb_d, sh_b, sh_d, LOG, HAS_H0, BLOCK_D)
    words = status_ptr + 1
    carry_a, carry_h = _carry_in(words, words + STRIDE_T * tl.cdiv(T, BLOCK_T), ti, STRIDE_T, bi * D + d, dmask,
                                 tot_a, tot_h, init_h, BLOCK_D, WINDOW, PREFIX_EVERY)

    out_off = bi * T * D + rows[:, None] * D + d[None, :]
    tl.store(out_h_ptr + out_off, (a_run * carry_h[None, :] + b_run).to(out_h_ptr.dtype.element_ty), mask=mask)
    if WRITE_A:
        tl.store(out_a_ptr + out_off, (a_run * carry_a[None, :]).to(out_a_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _bwd_kernel(
    a_ptr, b_ptr, h0_ptr, gh_ptr, ga_ptr, hout_ptr, aout_ptr, carry_h_ptr, carry_a_ptr,
    da_ptr, db_ptr, dh0_ptr, sum_p_ptr,
    T, D, NC, CHUNK,
    sa_b, sa_t, sa_d, sb_b, sb_t, sb_d, sh_b, sh_d,
    LOG: tl.constexpr, HAS_H0: tl.constexpr, HAS_GA: tl.constexpr, HAS_CARRY: tl.constexpr,
    SUMMARY: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, STAGES: tl.constexpr,
):
    pid = tl.program_id(0)
    bi, ci = pid // NC, pid % NC
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    dmask = d < D
    t_lo = ci * CHUNK
    side = bi * NC * D + ci * D + d

    g = tl.zeros((BLOCK_D,), tl.float32)   # g^ at the row after the current tile
    ga = tl.zeros((BLOCK_D,), tl.float32)
    prod = tl.full((BLOCK_D,), 1.0, tl.float32)
    if HAS_CARRY:
        g = tl.load(carry_h_ptr + side, mask=dmask, other=0.0)
        if HAS_GA:
            ga = tl.load(carry_a_ptr + side, mask=dmask, other=0.0)
    h0 = _initial_state(b_ptr, h0_ptr, bi, d, dmask, sb_b, sb_d, sh_b, sh_d, LOG, HAS_H0, BLOCK_D)

    base = bi * T * D + d[None, :]
    for j in tl.range(0, CHUNK // BLOCK_T, num_stages=STAGES):
        rows = t_lo + CHUNK - 1 - j * BLOCK_T - tl.arange(0, BLOCK_T)  # descending time
        valid = rows < T
        mask = valid[:, None] & dmask[None, :]
        c = _load_next_a(a_ptr, bi, rows, d, valid, mask, T, sa_b, sa_t, sa_d, LOG)
        off = base + rows[:, None] * D
        u = tl.load(gh_ptr + off, mask=mask, other=0.0).to(tl.float32)
        c_run, u_run = tl.associative_scan((c, u), 0, _combine)
        ghat = c_run * g[None, :] + u_run
        g = _last_row(ghat, BLOCK_T)
        if HAS_GA:
            ua = tl.load(ga_ptr + off, mask=mask, other=0.0).to(tl.float32)
            _, ua_run = tl.associative_scan((c, ua), 0, _combine)
            gahat = c_run * ga[None, :] + ua_run
            ga = _last_row(gahat, BLOCK_T)
        if SUMMARY:
            prod = prod * _last_row(c_run, BLOCK_T)
        else:
            first = rows == 0
            prev = tl.load(hout_ptr + off - D, mask=mask & (rows >= 1)[:, None], other=0.0).to(tl.float32)
            prev = tl.where(first[:, None], h0[None, :], prev)
            da = ghat * prev
            if HAS_GA:
                aprev = tl.load(aout_ptr + off - D, mask=mask & (rows >= 1)[:, None], other=1.0).to(tl.float32)
                da += gahat * tl.where(first[:, None], 1.0, aprev)
            _store_grads(a_ptr, b_ptr, da_ptr, db_ptr, bi, rows, d, off, mask, ghat, da, D,
                         sa_b, sa_t, sa_d, sb_b, sb_t, sb_d, LOG)
    if SUMMARY:
        tl.store(sum_p_ptr + side, prod, mask=dmask)
        tl.store(carry_h_ptr + side, g, mask=dmask)
        if HAS_GA:
            tl.store(carry_a_ptr + side, ga, mask=dmask)
    elif ci == 0:
        _store_dh0(a_ptr, db_ptr, dh0_ptr, bi, d, dmask, g, h0, T, D, sa_b, sa_d, LOG, HAS_H0)


@triton.jit
def _bwd_lookback_kernel(
    a_ptr, b_ptr, h0_ptr, gh_ptr, ga_ptr, hout_ptr, aout_ptr, status_ptr, da_ptr, db_ptr, dh0_ptr,
    T, D, NBD, ND, STRIDE_T,
    sa_b, sa_t, sa_d, sb_b, sb_t, sb_d, sh_b, sh_d,
    LOG: tl.constexpr, HAS_H0: tl.constexpr, HAS_GA: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, WINDOW: tl.constexpr, PREFIX_EVERY: tl.constexpr,
):
    """Single-pass backward: ``_bwd_kernel``'s tile body, one tile per program, tiles taken
    from the end of time; the carry (g^ after the tile) by decoupled look-back."""
    v = tl.atomic_add(status_ptr, 1).to(tl.int32)
    tr, c = v // NBD, v % NBD  # tr: tiles counted from the end of time
    bi, di = c // ND, c % ND
    n_tiles = tl.cdiv(T, BLOCK_T)
    d = di * BLOCK_D + tl.arange(0, BLOCK_D)
    dmask = d < D
    rows = (n_tiles - tr) * BLOCK_T - 1 - tl.arange(0, BLOCK_T)  # descending time
    valid = rows < T
    mask = valid[:, None] & dmask[None, :]
    cf = _load_next_a(a_ptr, bi, rows, d, valid, mask, T, sa_b, sa_t, sa_d, LOG)
    off = bi * T * D + rows[:, None] * D + d[None, :]
    u = tl.load(gh_ptr + off, mask=mask, other=0.0).to(tl.float32)
    c_run, u_run = tl.associative_scan((cf, u), 0, _combine)
    tot_c = _last_row(c_run, BLOCK_T)
    zero = tl.zeros((BLOCK_D,), tl.float32)
    words = status_ptr + 1
    plane = STRIDE_T * n_tiles
    col = bi * D + d
    _, g = _carry_in(words, words + plane, tr, STRIDE_T, col, dmask, tot_c, _last_row(u_run, BLOCK_T), zero,
                     BLOCK_D, WINDOW, PREFIX_EVERY)
    ghat = c_run * g[None, :] + u_run
    first = rows == 0
    prev = tl.load(hout_ptr + off - D, mask=mask & (rows >= 1)[:, None], other=0.0).to(tl.float32)
    h0 = _initial_state(b_ptr, h0_ptr, bi, d, dmask & (tr == n_tiles - 1), sb_b, sb_d, sh_b, sh_d, LOG, HAS_H0,
                        BLOCK_D)
    da = ghat * tl.where(first[:, None], h0[None, :], prev)
    if HAS_GA:
        ua = tl.load(ga_ptr + off, mask=mask, other=0.0).to(tl.float32)
        _, ua_run = tl.associative_scan((cf, ua), 0, _combine)
        _, ga = _carry_in(words + 2 * plane, words + 3 * plane, tr, STRIDE_T, col, dmask, tot_c,
                          _last_row(ua_run, BLOCK_T), zero, BLOCK_D, WINDOW, PREFIX_EVERY)
        aprev = tl.load(aout_ptr + off - D, mask=mask & (rows >= 1)[:, None], other=1.0).to(tl.float32)
        da += (c_run * ga[None, :] + ua_run) * tl.where(first[:, None], 1.0, aprev)
    _store_grads(a_ptr, b_ptr, da_ptr, db_ptr, bi, rows, d, off, mask, ghat, da, D,
                 sa_b, sa_t, sa_d, sb_b, sb_t, sb_d, LOG)
    if tr == n_tiles - 1:  # the tile holding t = 0
        _store_dh0(a_ptr, db_ptr, dh0_ptr, bi, d, dmask, _last_row(ghat, BLOCK_T), h0, T, D, sa_b, sa_d, LOG, HAS_H0)


def _strides3(x):
    return x.stride(0), x.stride(1), x.stride(2)


def _h0_strides(h0):
    return (h0.stride(0), h0.stride(1)) if h0 is not None else (0, 0)


def _geometry(a, log: bool, nc: Optional[int] = None):
    """(BLOCK_T, BLOCK_D, warps, chunks, chunk length) for (B, T, D) inputs ``a``: enough
    T-chunks to fill the device unless ``nc`` is given; chunks a whole number of tiles long."""
    B, T, D = a.shape
    block_t, block_d, warps = tiles(a.device, log)
    nc = num_chunks(B * cdiv(D, block_d), T, block_t, a.device) if nc is None else nc
    chunk = cdiv(cdiv(T, nc), block_t) * block_t
    return block_t, block_d, warps, cdiv(T, chunk), chunk


def _forward(a, b, h0, log: bool, write_a: bool, nc: Optional[int] = None):
    """States (and running products when ``write_a``) of the elementwise recurrence."""
    B, T, D = a.shape
    block_t, block_d, warps, nc, chunk = _geometry(a, log, nc)
    out_h = torch.empty((B, T, D), device=a.device, dtype=a.dtype)
    out_a = torch.empty((B, T, D), device=a.device, dtype=a.dtype) if write_a else out_h
    if common.use_lookback(nc, log):
        _launch_lookback(_fwd_lookback_kernel, a, b, h0, log, 2, (a, b, h0), (out_a, out_h), WRITE_A=write_a)
        return (out_a if write_a else None), out_h
    carry_a = carry_h = None
    if nc > 1:
        carry_a, carry_h = _carries(a, b, h0, log, write_a, nc, chunk, (block_t, block_d, warps))
    grid = (B * nc, cdiv(D, block_d))
    wrap_triton(_fwd_kernel)[grid](
        a, b, h0, carry_a, carry_h, out_a, out_h, T, D, nc, chunk,
        *_strides3(a), *_strides3(b), *_h0_strides(h0),
        LOG=log, HAS_H0=h0 is not None, HAS_CARRY=nc > 1, WRITE_A=write_a, SUMMARY=False,
        BLOCK_T=block_t, BLOCK_D=block_d, STAGES=common.stages(log, "fwd"), num_warps=warps,
    )
    return (out_a if write_a else None), out_h


def _launch_lookback(kernel, a, b, h0, log: bool, planes: int, before, after, **flags):
    """One single-pass look-back kernel over (B, T, D): a program per tile, a ticket counter
    and ``planes`` zeroed status words per (tile, column) passed between the kernel's
    ``before`` and ``after`` tensors."""
    B, T, D = a.shape
    block_t, block_d, warps = common.lookback_tiles(a.device, log)
    nd, n_tiles = cdiv(D, block_d), cdiv(T, block_t)
    status = torch.zeros(1 + planes * n_tiles * B * D, device=a.device, dtype=torch.int64)
    wrap_triton(kernel)[(n_tiles * B * nd,)](
        *before, status, *after, T, D, B * nd, nd, B * D, *_strides3(a), *_strides3(b), *_h0_strides(h0),
        LOG=log, HAS_H0=h0 is not None, BLOCK_T=block_t, BLOCK_D=block_d, WINDOW=common.LOOKBACK["window"],
        PREFIX_EVERY=common.LOOKBACK["prefix_every"], num_warps=warps, **flags,
    )


def _carries(a, b, h0, log, write_a, nc, chunk, tile):
    """Per-chunk carry-in (running product, state) from a summary pass and a scan over it."""
    B, T, D = a.shape
    block_t, block_d, warps = tile
    sum_a = torch.empty((B, nc, D), device=a.device, dtype=torch.float32)
    sum_h = torch.empty_like(sum_a)
    wrap_triton(_fwd_kernel)[(B * nc, cdiv(D, block_d))](
        a, b, h0, None, None, sum_a, sum_h, T, D, nc, chunk,
        *_strides3(a), *_strides3(b), *_h0_strides(h0),
        LOG=log, HAS_H0=h0 is not None, HAS_CARRY=False, WRITE_A=True, SUMMARY=True,
        BLOCK_T=block_t, BLOCK_D=block_d, STAGES=common.stages(log, "fwd"), num_warps=warps,
    )
    h_init = b[:, 0].float().exp() if log else (h0.float() if h0 is not None else torch.zeros_like(sum_h[:, 0]))
    run_a, run_h = _forward(sum_a, sum_h, h_init, log=False, write_a=write_a, nc=1)
    carry_h = torch.cat([h_init.unsqueeze(1), run_h[:, :-1]], dim=1)
    carry_a = torch.cat([torch.ones_like(sum_a[:, :1]), run_a[:, :-1]], dim=1) if write_a else None
    return carry_a, carry_h


def _backward(a, b, h0, gh, ga, hout, aout, log: bool):
    """Input grads (da, db, dh0) of the elementwise recurrence from the saved outputs."""
    B, T, D = a.shape
    block_t, block_d, warps, nc, chunk = _geometry(a, log)
    gh = gh.contiguous()
    ga = ga.contiguous() if ga is not None else None
    da = torch.empty((B, T, D), device=a.device, dtype=a.dtype)
    db = torch.empty(b.shape, device=a.device, dtype=b.dtype)
    dh0 = torch.empty((B, D), device=a.device, dtype=a.dtype) if (h0 is not None and not log) else None
    if common.use_lookback(nc, log):  # two status planes per recurrence: (g^, and the prefix grad's)
        _launch_lookback(_bwd_lookback_kernel, a, b, h0, log, 4 if ga is not None else 2,
                         (a, b, h0, gh, ga, hout, aout), (da, db, dh0), HAS_GA=ga is not None)
        return da, db, dh0
    strides = (*_strides3(a), *_strides3(b), *_h0_strides(h0))
    grid = (B * nc, cdiv(D, block_d))
    consts = dict(LOG=log, HAS_H0=h0 is not None, HAS_GA=ga is not None, BLOCK_T=block_t, BLOCK_D=block_d,
                  STAGES=common.stages(log, "bwd"), num_warps=warps)
    carry_h = carry_a = None
    if nc > 1:
        sum_p = torch.empty((B, nc, D), device=a.device, dtype=torch.float32)
        sum_h, sum_a = torch.empty_like(sum_p), (torch.empty_like(sum_p) if ga is not None else None)
        wrap_triton(_bwd_kernel)[grid](
            a, b, h0, gh, ga, hout, aout, sum_h, sum_a, None, None, None, sum_p,
            T, D, nc, chunk, *strides, HAS_CARRY=False, SUMMARY=True, **consts,
        )
        carry_h = _reverse_carry(sum_p, sum_h)
        carry_a = _reverse_carry(sum_p, sum_a) if ga is not None else None
    wrap_triton(_bwd_kernel)[grid](
        a, b, h0, gh, ga, hout, aout, carry_h, carry_a, da, db, dh0, None,
        T, D, nc, chunk, *strides, HAS_CARRY=nc > 1, SUMMARY=False, **consts,
    )
    return da, db, dh0


def _reverse_carry(prod, state):
    """Carry-in of each chunk for a reverse-time recurrence, from chunk summaries."""
    _, run = _forward(prod.flip(1), state.flip(1), None, log=False, write_a=False, nc=1)
    return torch.cat([torch.zeros_like(run[:, :1]), run[:, :-1]], dim=1).flip(1).contiguous()


linear_scan = common.prefix_scan_op(
    "linear_scan",
    lambda a, b, h0, write_a: _forward(a, b, h0, log=False, write_a=write_a),
    lambda a, h0, prod, h, g_prod, g_h: _backward(a, a, h0, g_h, g_prod, h, prod if g_prod is not None else None,
                                                  log=False),
)


def _log_fwd(log_coeffs: torch.Tensor, log_values: torch.Tensor) -> torch.Tensor:
    return _forward(log_coeffs, log_values, None, log=True, write_a=False)[1]


def _log_bwd(log_coeffs: torch.Tensor, log_values: torch.Tensor, h: torch.Tensor, g_h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    d_coeffs, d_values, _ = _backward(log_coeffs, log_values, None, g_h, None, h, None, log=True)
    return d_coeffs, d_values


log_scan_fwd = triton_op("scankit::log_scan_fwd", mutates_args={})(_log_fwd)
log_scan_bwd = triton_op("scankit::log_scan_bwd", mutates_args={})(_log_bwd)


@log_scan_fwd.register_fake
def _(log_coeffs, log_values):
    return _empty(log_coeffs.shape, log_coeffs)


@log_scan_bwd.register_fake
def _(log_coeffs, log_values, h, g_h):
    return _empty(log_coeffs.shape, log_coeffs), _empty(log_values.shape, log_values)


_log_bwd_call = common.either(log_scan_bwd, _log_bwd)


def _log_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs, output)


def _log_backward(ctx, g_h):
    log_coeffs, log_values, h = ctx.saved_tensors
    if g_h is None:
        return None, None
    return _log_bwd_call(log_coeffs, log_values, h, g_h)


log_scan = common.with_autograd(log_scan_fwd, _log_fwd, _log_setup, _log_backward)
