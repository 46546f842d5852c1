"""Triton kernels for the block affine recurrences (``matrix_affine_scan``, ``matrix_scan``).

Layout (B, T, n, k, k) and (B, T, n, k, v). One program owns (batch, T-chunk, BN blocks)
and walks time keeping the (BN, k, k) running product and the (BN, k, v) state in
registers; products are broadcast-multiply-sums in fp32 (no ``tl.dot``: its TF32 default
would cost ~1e-3 relative error, and k < 16 is below its minimum anyway).
The backward walks t = T..1: ``G^_t = G_t + A_{t+1}^T G^_{t+1}``,
``dA_t = G^A_t Abar_{t-1}^T + G^B_t Bbar_{t-1}^T``, ``dB_t = G^B_t``, re-reading the saved
forward outputs. Long sequences with few lanes split T into chunks as in
``elementwise``: summary pass, a scan of the chunk summaries (this same kernel), main pass.
"""
import torch
import triton
import triton.language as tl
from torch.library import wrap_triton

from .common import num_chunks, on_gpu, prefix_scan_op


@triton.jit
def _mm(x, y):
    """(BN, K, M) @ (BN, M, W) -> (BN, K, W)."""
    return tl.sum(x[:, :, :, None] * y[:, None, :, :], axis=2)


@triton.jit
def _mm_t(x, y):
    """(BN, K, M) @ (BN, W, M)^T -> (BN, K, W)."""
    return tl.sum(x[:, :, None, :] * y[:, None, :, :], axis=3)


@triton.jit
def _offsets(n, rows, cols, s_n, s_r, s_c):
    return n[:, None, None] * s_n + rows[None, :, None] * s_r + cols[None, None, :] * s_c


@triton.jit
def _fwd_kernel(
    a_ptr, b_ptr, h0_ptr, carry_a_ptr, carry_b_ptr, out_a_ptr, out_b_ptr,
    T, N, NC, CHUNK,
    sa_b, sa_t, sa_n, sa_i, sa_j, sb_b, sb_t, sb_n, sb_i, sb_j, sh_b, sh_n, sh_i, sh_j,
    K: tl.constexpr, V: tl.constexpr, BN: tl.constexpr,
    HAS_H0: tl.constexpr, HAS_CARRY: tl.constexpr, TRACK_A: tl.constexpr, SUMMARY: tl.constexpr,
):
    pid = tl.program_id(0)
    bi, ci = pid // NC, pid % NC
    n = tl.program_id(1) * BN + tl.arange(0, BN)
    ki, kj, vj = tl.arange(0, K), tl.arange(0, K), tl.arange(0, V)
    nmask = (n < N)[:, None, None]
    off_kk = _offsets(n, ki, kj, K * K, K, 1)  # contiguous outputs / summaries
    off_kv = _offsets(n, ki, vj, K * V, V, 1)

    xa = tl.where(ki[None, :, None] == kj[None, None, :], 1.0, 0.0) + tl.zeros((BN, K, K), tl.float32)
    xb = tl.zeros((BN, K, V), tl.float32)
    if not SUMMARY:
        if HAS_CARRY:
            side = (bi * NC + ci) * N
            xb = tl.load(carry_b_ptr + side * K * V + off_kv, mask=nmask, other=0.0)
            if TRACK_A:
                xa = tl.load(carry_a_ptr + side * K * K + off_kk, mask=nmask, other=0.0)
        elif HAS_H0:
            xb = tl.load(h0_ptr + bi * sh_b + _offsets(n, ki, vj, sh_n, sh_i, sh_j), mask=nmask, other=0.0).to(tl.float32)

    a_rel = _offsets(n, ki, kj, sa_n, sa_i, sa_j)
    b_rel = _offsets(n, ki, vj, sb_n, sb_i, sb_j)
    for j in range(0, CHUNK):
        t = ci * CHUNK + j
        m = nmask & (t < T)
        at = tl.load(a_ptr + bi * sa_b + t * sa_t + a_rel, mask=m, other=0.0).to(tl.float32)
        bt = tl.load(b_ptr + bi * sb_b + t * sb_t + b_rel, mask=m, other=0.0).to(tl.float32)
        # rows past T keep the state: A = 0 there, so blend instead of multiplying
        xb = tl.where(m, _mm(at, xb) + bt, xb)
        if TRACK_A:
            xa = tl.where(m, _mm(at, xa), xa)
        if not SUMMARY:
            row = (bi * T + t) * N
            tl.store(out_b_ptr + row * K * V + off_kv, xb.to(out_b_ptr.dtype.element_ty), mask=m)
            if TRACK_A:
                tl.store(out_a_ptr + row * K * K + off_kk, xa.to(out_a_ptr.dtype.element_ty), mask=m)
    if SUMMARY:
        side = (bi * NC + ci) * N
        tl.store(out_a_ptr + side * K * K + off_kk, xa, mask=nmask)
        tl.store(out_b_ptr + side * K * V + off_kv, xb, mask=nmask)


@triton.jit
def _bwd_kernel(
    a_ptr, h0_ptr, gb_ptr, ga_ptr, outb_ptr, outa_ptr, carry_b_ptr, carry_a_ptr,
    da_ptr, db_ptr, dh0_ptr, sum_p_ptr,
    T, N, NC, CHUNK,
    sa_b, sa_t, sa_n, sa_i, sa_j, sh_b, sh_n, sh_i, sh_j,
    K: tl.constexpr, V: tl.constexpr, BN: tl.constexpr,
    HAS_H0: tl.constexpr, HAS_GA: tl.constexpr, HAS_CARRY: tl.constexpr, SUMMARY: tl.constexpr,
):
    pid = tl.program_id(0)
    bi, ci = pid // NC, pid % NC
    n = tl.program_id(1) * BN + tl.arange(0, BN)
    ki, kj, vj = tl.arange(0, K), tl.arange(0, K), tl.arange(0, V)
    nmask = (n < N)[:, None, None]
    off_kk = _offsets(n, ki, kj, K * K, K, 1)
    off_kv = _offsets(n, ki, vj, K * V, V, 1)
    eye = tl.where(ki[None, :, None] == kj[None, None, :], 1.0, 0.0) + tl.zeros((BN, K, K), tl.float32)
    side = (bi * NC + ci) * N

    gb = tl.zeros((BN, K, V), tl.float32)
    ga = tl.zeros((BN, K, K), tl.float32)
    prod = eye
    if HAS_CARRY:
        gb = tl.load(carry_b_ptr + side * K * V + off_kv, mask=nmask, other=0.0)
        if HAS_GA:
            ga = tl.load(carry_a_ptr + side * K * K + off_kk, mask=nmask, other=0.0)

    a_rel_t = _offsets(n, ki, kj, sa_n, sa_j, sa_i)  # A^T
    for j in range(0, CHUNK):
        t = ci * CHUNK + CHUNK - 1 - j  # descending time
        m = nmask & (t < T)
        c = tl.load(a_ptr + bi * sa_b + (t + 1) * sa_t + a_rel_t, mask=m & (t + 1 < T), other=0.0).to(tl.float32)
        row = (bi * T + t) * N
        u = tl.load(gb_ptr + row * K * V + off_kv, mask=m, other=0.0).to(tl.float32)
        gb = tl.where(m, _mm(c, gb) + u, gb)
        if HAS_GA:
            ua = tl.load(ga_ptr + row * K * K + off_kk, mask=m, other=0.0).to(tl.float32)
            ga = tl.where(m, _mm(c, ga) + ua, ga)
        if SUMMARY:
            prod = tl.where(m, _mm(c, prod), prod)
        else:
            first = t == 0
            prev_b = tl.load(outb_ptr + (row - N) * K * V + off_kv, mask=m & (t > 0), other=0.0).to(tl.float32)
            if HAS_H0:
                h0 = tl.load(h0_ptr + bi * sh_b + _offsets(n, ki, vj, sh_n, sh_i, sh_j), mask=m & first, other=0.0)
                prev_b += h0.to(tl.float32)
            da = _mm_t(gb, prev_b)
            if HAS_GA:
                prev_a = tl.load(outa_ptr + (row - N) * K * K + off_kk, mask=m & (t > 0), other=0.0).to(tl.float32)
                da += _mm_t(ga, tl.where(first, eye, prev_a))
            tl.store(da_ptr + row * K * K + off_kk, da.to(da_ptr.dtype.element_ty), mask=m)
            tl.store(db_ptr + row * K * V + off_kv, gb.to(db_ptr.dtype.element_ty), mask=m)
    if SUMMARY:
        tl.store(sum_p_ptr + side * K * K + off_kk, prod, mask=nmask)
        tl.store(carry_b_ptr + side * K * V + off_kv, gb, mask=nmask)
        if HAS_GA:
            tl.store(carry_a_ptr + side * K * K + off_kk, ga, mask=nmask)
    elif HAS_H0:
        if ci == 0:  # dL/dh_0 = A_1^T G^_1
            a0t = tl.load(a_ptr + bi * sa_b + a_rel_t, mask=nmask, other=0.0).to(tl.float32)
            tl.store(dh0_ptr + bi * N * K * V + off_kv, _mm(a0t, gb).to(dh0_ptr.dtype.element_ty), mask=nmask)


# Launch knobs of the block kernels on the GPU (scripts/tune_scans.py sweeps them):
# elements of the per-step (BN, K, K, max(K, V)) product, shortest T-chunk, warps per program.
# H200 sweep (experiments/logs/2026-11-30-h200-tune-scans-run7.json): one block per program
# and 2 warps take matrix_affine_scan (k=8) large fwd from 13.8 to 5.1 ms.
TUNING = {"product_elems": 512, "min_chunk": 32, "num_warps": 2}


def _block_lanes(N: int, K: int, V: int) -> int:
    """Blocks per program: keep the (BN, K, K, max(K, V)) product near TUNING's size."""
    return max(1, min(triton.next_power_of_2(N), 32, TUNING["product_elems"] // (K * K * max(K, V))))


def _warps(device) -> int:
    return TUNING["num_warps"] if on_gpu(device) else 1


def _geometry(A, V):
    B, T, N, K, _ = A.shape
    bn = _block_lanes(N, K, V)
    min_chunk = TUNING["min_chunk"] if on_gpu(A.device) else 4
    nc = num_chunks(B * triton.cdiv(N, bn), T, min_chunk, A.device, family="affine")
    chunk = triton.cdiv(T, nc)
    return bn, triton.cdiv(T, chunk), chunk


def _s(x, dims=5):
    return tuple(x.stride()) if x is not None else (0,) * dims


def _forward(A, Bm, h0, track_a: bool, chunked: bool = True):
    """(Abar or None, Bbar or h) of the block recurrence."""
    B, T, N, K, _ = A.shape
    V = Bm.shape[-1]
    bn, nc, chunk = _geometry(A, V) if chunked else (_block_lanes(N, K, V), 1, T)
    out_b = torch.empty((B, T, N, K, V), device=A.device, dtype=A.dtype)
    out_a = torch.empty((B, T, N, K, K), device=A.device, dtype=A.dtype) if track_a else out_b
    grid = (B * nc, triton.cdiv(N, bn))
    consts = dict(K=K, V=V, BN=bn, HAS_H0=h0 is not None)
    carry_a = carry_b = None
    if nc > 1:
        sum_a = torch.empty((B, nc, N, K, K), device=A.device, dtype=torch.float32)
        sum_b = torch.empty((B, nc, N, K, V), device=A.device, dtype=torch.float32)
        wrap_triton(_fwd_kernel)[grid](
            A, Bm, h0, None, None, sum_a, sum_b, T, N, nc, chunk, *_s(A), *_s(Bm), *_s(h0, 4),
            HAS_CARRY=False, TRACK_A=True, SUMMARY=True, num_warps=_warps(A.device), **consts,
        )
        h_init = h0.float() if h0 is not None else torch.zeros_like(sum_b[:, 0])
        run_a, run_b = _forward(sum_a, sum_b, h_init, track_a=track_a, chunked=False)
        carry_b = torch.cat([h_init.unsqueeze(1), run_b[:, :-1]], dim=1)
        if track_a:
            eye = torch.eye(K, device=A.device).expand(B, 1, N, K, K)
            carry_a = torch.cat([eye, run_a[:, :-1]], dim=1)
    wrap_triton(_fwd_kernel)[grid](
        A, Bm, h0, carry_a, carry_b, out_a, out_b, T, N, nc, chunk, *_s(A), *_s(Bm), *_s(h0, 4),
        HAS_CARRY=nc > 1, TRACK_A=track_a, SUMMARY=False, num_warps=_warps(A.device), **consts,
    )
    return (out_a if track_a else None), out_b


def _backward(A, h0, gb, ga, out_b, out_a):
    """(dA, dB, dh0) of the block recurrence from the saved outputs."""
    B, T, N, K, _ = A.shape
    V = gb.shape[-1]
    bn, nc, chunk = _geometry(A, V)
    gb = gb.contiguous()
    ga = ga.contiguous() if ga is not None else None
    dA = torch.empty((B, T, N, K, K), device=A.device, dtype=A.dtype)
    dB = torch.empty((B, T, N, K, V), device=A.device, dtype=A.dtype)
    dh0 = torch.empty((B, N, K, V), device=A.device, dtype=A.dtype) if h0 is not None else None
    grid = (B * nc, triton.cdiv(N, bn))
    consts = dict(K=K, V=V, BN=bn, HAS_H0=h0 is not None, HAS_GA=ga is not None)
    strides = (*_s(A), *_s(h0, 4))
    carry_b = carry_a = None
    if nc > 1:
        sum_p = torch.empty((B, nc, N, K, K), device=A.device, dtype=torch.float32)
        sum_b = torch.empty((B, nc, N, K, V), device=A.device, dtype=torch.float32)
        sum_a = torch.empty_like(sum_p) if ga is not None else None
        wrap_triton(_bwd_kernel)[grid](
            A, h0, gb, ga, out_b, out_a, sum_b, sum_a, None, None, None, sum_p,
            T, N, nc, chunk, *strides, HAS_CARRY=False, SUMMARY=True, num_warps=_warps(A.device), **consts,
        )
        carry_b = _reverse_carry(sum_p, sum_b)
        carry_a = _reverse_carry(sum_p, sum_a) if ga is not None else None
    wrap_triton(_bwd_kernel)[grid](
        A, h0, gb, ga, out_b, out_a, carry_b, carry_a, dA, dB, dh0, None,
        T, N, nc, chunk, *strides, HAS_CARRY=nc > 1, SUMMARY=False, num_warps=_warps(A.device), **consts,
    )
    return dA, dB, dh0


def _reverse_carry(prod, state):
    """Carry-in of each chunk for the reverse-time recurrence, from chunk summaries."""
    _, run = _forward(prod.flip(1), state.flip(1), None, track_a=False, chunked=False)
    return torch.cat([torch.zeros_like(run[:, :1]), run[:, :-1]], dim=1).flip(1).contiguous()


affine_scan = prefix_scan_op(
    "affine_scan",
    lambda A, B, h0, track_a: _forward(A, B, h0, track_a=track_a),
    lambda A, h0, Abar, out, g_Abar, g_out: _backward(A, h0, g_out, g_Abar, out, Abar if g_Abar is not None else None),
)
