"""More than 2^31 elements, every kernel family, forward and backward (GPU only; the device
script runs them): sampled columns, the ones at the largest offsets among them, against a
sequential float64 loop. An offset computed in 32 bits there faults or reads elsewhere."""
import math
import random

import pytest
import torch

import scankit
from oracles import affine_loop

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (and ~80 GiB)")
BIG = 2**31


@pytest.fixture(autouse=True)
def triton_mode(monkeypatch):
    monkeypatch.setenv("MINGRU_SCAN", "triton")
    torch.cuda.empty_cache()
    yield
    torch.cuda.empty_cache()


def picks(B, D, seed):
    """(batch, column) samples: the last of both (the largest offsets), the first, one at random."""
    rng = random.Random(seed)
    return [(B - 1, D - 1), (0, 0), (rng.randrange(B), rng.randrange(D))]


def col(x, bi, d):
    """x[bi, :, d] as float64 Python numbers."""
    return x[bi, :, d].double().cpu().tolist()


def close(got, want, rtol, scale=0.0):
    """got ~ want to rtol of the column's largest value, or of ``scale``: the same sum over |terms|
    where the value is a sum that cancels (its fp32 rounding scales with the terms, not the sum)."""
    got, want = torch.tensor(got, dtype=torch.float64), torch.tensor(want, dtype=torch.float64)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, rtol=rtol, atol=rtol * max(scale, want.abs().max().item()))


def linear_loop(a, b, h0=0.0):
    h, hs = h0, []
    for x, y in zip(a, b):
        h = x * h + y
        hs.append(h)
    return hs


def linear_grads(a, hs, g, h0=0.0):
    """(da, db, dh0) of h_t = a_t h_{t-1} + b_t for the cotangent g, by the reverse loop."""
    T, ghat = len(a), 0.0
    da, db = [0.0] * T, [0.0] * T
    for t in range(T - 1, -1, -1):
        ghat = g[t] + (a[t + 1] * ghat if t + 1 < T else 0.0)
        db[t], da[t] = ghat, ghat * (hs[t - 1] if t else h0)
    return da, db, a[0] * ghat


@pytest.mark.parametrize("shape,with_prefix", [((1, 2**21, 1025), True), ((520, 4096, 1024), False)],
                         ids=["B=1-lookback-prefix", "walking-states"])
def test_linear_scan(shape, with_prefix, seed):
    B, T, D = shape
    assert B * T * D > BIG
    gen = torch.Generator("cuda").manual_seed(seed)
    a = torch.empty(shape, device="cuda").uniform_(0.9, 1.0, generator=gen).requires_grad_()
    b = torch.randn(shape, device="cuda", generator=gen).requires_grad_()
    h0 = None if with_prefix else torch.randn(B, D, device="cuda", generator=gen).requires_grad_()
    out = scankit.linear_scan(a, b, h0=h0, return_prefix=with_prefix)
    outs = out if with_prefix else (out,)
    cots = [torch.randn(o.shape, device="cuda", generator=gen) for o in outs]
    leaves = [a, b] + ([h0] if h0 is not None else [])
    grads = torch.autograd.grad(outs, leaves, cots)
    for bi, d in picks(B, D, seed):
        ac, bc = col(a, bi, d), col(b, bi, d)
        start = 0.0 if h0 is None else h0[bi, d].item()
        hs = linear_loop(ac, bc, start)
        close(col(outs[-1], bi, d), hs, 1e-4)
        da, db, dh0 = linear_grads(ac, hs, col(cots[-1], bi, d), start)
        if with_prefix:  # A_t = a_1 .. a_t, its grad through the same reverse loop (h_0 = 1, b = 0)
            prods = linear_loop(ac, [0.0] * T, 1.0)
            close(col(outs[0], bi, d), prods, 1e-4)
            da2, _, _ = linear_grads(ac, prods, col(cots[0], bi, d), 1.0)
            da = [x + y for x, y in zip(da, da2)]
        close(col(grads[0], bi, d), da, 1e-4)
        close(col(grads[1], bi, d), db, 1e-4)
        if h0 is not None:
            close([grads[2][bi, d].item()], [dh0], 1e-4)


@pytest.mark.parametrize("shape", [(260, 4096, 1024), (1, 2**20, 1025)], ids=["walking", "B=1-lookback"])
def test_mingru_scan(shape, seed):
    """minGRU's gated scan where gate_hidden (B, T, 2D) passes 2^31 elements though h does not:
    the gradient's (B, T, 2D) offsets (2 x h's) need the int64 specialization."""
    B, T, D = shape
    assert B * T * 2 * D > BIG > B * T * D
    gen = torch.Generator("cuda").manual_seed(seed)
    p = (torch.randn(B, T, 2 * D, device="cuda", generator=gen) * 2).requires_grad_()
    h0 = torch.rand(B, D, device="cuda", generator=gen).requires_grad_()
    h = scankit.mingru_scan(p, h0=h0)
    g = torch.randn(h.shape, device="cuda", generator=gen)
    dp, dh0 = torch.autograd.grad(h, (p, h0), g)
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    for bi, d in picks(B, D, seed):
        k, v = col(p, bi, d), col(p, bi, D + d)
        a = [sig(-x) for x in k]
        gv = [x + 0.5 if x >= 0 else sig(x) for x in v]
        hs = linear_loop(a, [sig(x) * y for x, y in zip(k, gv)], h0[bi, d].item())
        close(col(h, bi, d), hs, 1e-4)
        da, db, want_dh0 = linear_grads(a, hs, col(g, bi, d), h0[bi, d].item())
        close(col(dp, bi, d), [sig(x) * sig(-x) * (y * z - w) for x, y, z, w in zip(k, db, gv, da)], 1e-4)
        close(col(dp, bi, D + d), [y * sig(x) * (1.0 if u >= 0 else sig(u) * sig(-u)) for x, y, u in zip(k, db, v)],
              1e-4)
        terms = linear_grads(a, hs, [abs(x) for x in col(g, bi, d)], h0[bi, d].item())[2]  # a > 0: |terms| summed
        close([dh0[bi, d].item()], [want_dh0], 1e-4, scale=terms)


def test_parallel_scan_log_bf16(seed):
    """(2, 2^20, 1024) bf16, the chunked path with its log-space carries."""
    B, T, D = 2, 2**20, 1024
    gen = torch.Generator("cuda").manual_seed(seed)
    lc = torch.empty(B, T, D, device="cuda").uniform_(0.9, 1.0, generator=gen).log_().bfloat16().requires_grad_()
    lv = torch.randn(B, T + 1, D, device="cuda", generator=gen).bfloat16().requires_grad_()
    h = scankit.parallel_scan_log(lc, lv)
    g = torch.randn(h.shape, device="cuda", generator=gen).bfloat16()
    dlc, dlv = torch.autograd.grad(h, (lc, lv), g)
    for bi, d in picks(B, D, seed):
        a = [math.exp(x) for x in col(lc, bi, d)]
        bv = [math.exp(x) for x in col(lv, bi, d)]
        hs = linear_loop(a, bv[1:], bv[0])
        close(col(h, bi, d), hs, 1e-2)
        da, db, dh0 = linear_grads(a, hs, col(g, bi, d), bv[0])
        close(col(dlc, bi, d), [x * y for x, y in zip(da, a)], 3e-2)  # d/dlog a = a d/da
        close(col(dlv, bi, d), [dh0 * bv[0]] + [x * y for x, y in zip(db, bv[1:])], 3e-2)


def test_matrix_scan_2x2(seed):
    """(1, 2^21, 260) blocks: 2.2e9 elements of M, the 2x2 kernels, chunked."""
    B, T, n = 1, 2**21, 260
    assert B * T * n * 4 > BIG
    gen = torch.Generator("cuda").manual_seed(seed)
    theta = torch.empty(B, T, n, device="cuda").uniform_(-math.pi, math.pi, generator=gen)
    scale = torch.empty(B, T, n, device="cuda").uniform_(0.9, 1.0, generator=gen)
    M = torch.stack([torch.stack([theta.cos(), -theta.sin() * scale], -1),
                     torch.stack([theta.sin(), theta.cos() * scale], -1)], -2)
    del theta, scale
    M.requires_grad_()
    b = torch.randn(B, T, n, 2, device="cuda", generator=gen).requires_grad_()
    h = scankit.matrix_scan(M, b, return_prefix=False)
    g = torch.randn(h.shape, device="cuda", generator=gen)
    dM, db = torch.autograd.grad(h, (M, b), g)
    for _, j in picks(B, n, seed)[::2]:
        m = M[0, :, j].double().cpu().reshape(T, 4).tolist()
        bb, gg = b[0, :, j].double().cpu().tolist(), g[0, :, j].double().cpu().tolist()
        x0 = x1 = 0.0
        hs = []
        for (m00, m01, m10, m11), (b0, b1) in zip(m, bb):
            x0, x1 = m00 * x0 + m01 * x1 + b0, m10 * x0 + m11 * x1 + b1
            hs.append((x0, x1))
        close(h[0, :, j].double().cpu().tolist(), hs, 1e-4)
        q0 = q1 = 0.0
        dms, dbs = [None] * T, [None] * T
        for t in range(T - 1, -1, -1):  # G_t = g_t + M_{t+1}^T G_{t+1}; dM_t = G_t h_{t-1}^T; db_t = G_t
            if t + 1 < T:
                m00, m01, m10, m11 = m[t + 1]
                q0, q1 = m00 * q0 + m10 * q1, m01 * q0 + m11 * q1
            q0, q1 = q0 + gg[t][0], q1 + gg[t][1]
            p0, p1 = hs[t - 1] if t else (0.0, 0.0)
            dms[t], dbs[t] = (q0 * p0, q0 * p1, q1 * p0, q1 * p1), (q0, q1)
        close(dM[0, :, j].double().cpu().reshape(T, 4).tolist(), dms, 1e-4)
        close(db[0, :, j].double().cpu().tolist(), dbs, 1e-4)


def test_matrix_affine_scan_8x8(seed):
    """(2, 2^17, 130, 8, 8): 2.2e9 elements of A, the generic k x k kernels."""
    import numpy as np

    B, T, n, k = 2, 2**17, 130, 8
    assert B * T * n * k * k > BIG
    gen = torch.Generator("cuda").manual_seed(seed)
    A = torch.randn(B, T, n, k, k, device="cuda", generator=gen).mul_(0.15 / math.sqrt(k))
    A.diagonal(dim1=-2, dim2=-1).add_(0.5)  # norm below 0.8: a contraction, as trained transitions are
    A.requires_grad_()
    Bm = torch.randn(B, T, n, k, 1, device="cuda", generator=gen).requires_grad_()
    h = scankit.matrix_affine_scan(A, Bm, return_prefix=False)
    g = torch.randn(h.shape, device="cuda", generator=gen)
    dA, dB = torch.autograd.grad(h, (A, Bm), g)
    for bi, j in picks(B, n, seed)[:2]:
        a = A[bi, :, j].detach().double().cpu().numpy()
        bb, gg = (x[bi, :, j, :, 0].detach().double().cpu().numpy() for x in (Bm, g))
        hs, x = np.zeros((T, k)), np.zeros(k)
        for t in range(T):
            x = a[t] @ x + bb[t]
            hs[t] = x
        close(h[bi, :, j, :, 0].double().cpu().tolist(), hs.tolist(), 1e-4)
        das, dbs, q = np.zeros((T, k, k)), np.zeros((T, k)), np.zeros(k)
        for t in range(T - 1, -1, -1):  # G_t = g_t + A_{t+1}^T G_{t+1}; dA_t = G_t h_{t-1}^T; dB_t = G_t
            q = gg[t] + (a[t + 1].T @ q if t + 1 < T else 0.0)
            das[t], dbs[t] = np.outer(q, hs[t - 1] if t else np.zeros(k)), q
        close(dA[bi, :, j].double().cpu().reshape(T, -1).tolist(), das.reshape(T, -1).tolist(), 1e-4)
        close(dB[bi, :, j, :, 0].double().cpu().tolist(), dbs.tolist(), 1e-4)


def test_rotation_scan_fused(seed):
    """The angle-fused Givens kernel (k = 8, 2 rounds, decay, h_0) on (64, 4096, 1025) blocks."""
    from scankit.mixers import givens_matrix
    from scankit.triton import rotation_scan

    B, T, n, k, R = 64, 4096, 1025, 8, 2
    assert B * T * n * k > BIG
    gen = torch.Generator("cuda").manual_seed(seed)
    angles = (torch.rand(B, T, n, R, k // 2, device="cuda", generator=gen) * 6.3 - 3.15).requires_grad_()
    b = torch.randn(B, T, n, k, device="cuda", generator=gen).requires_grad_()
    gamma = torch.empty(B, T, n, device="cuda").uniform_(0.9, 1.0, generator=gen).requires_grad_()
    h0 = torch.randn(B, n, k, device="cuda", generator=gen).requires_grad_()
    h = rotation_scan(angles, b, gamma=gamma, h0=h0)
    g = torch.randn(h.shape, device="cuda", generator=gen)
    grads = torch.autograd.grad(h, (angles, b, gamma, h0), g)
    for bi, j in picks(B, n, seed):
        lane = [x[bi:bi + 1, :, j].double().cpu().requires_grad_() for x in (angles, b, gamma)]
        start = h0[bi:bi + 1, j].double().cpu().requires_grad_()
        M = givens_matrix(lane[0], k) * lane[2][..., None, None]
        ref = affine_loop(M.unsqueeze(2), lane[1][:, :, None, :, None], start[:, None, :, None])[2][:, :, 0, :, 0]
        torch.testing.assert_close(h[bi:bi + 1, :, j].double().cpu(), ref.detach(), rtol=1e-4, atol=1e-4)
        ref_grads = torch.autograd.grad(ref, lane + [start], g[bi:bi + 1, :, j].double().cpu())
        for got, want in zip((grads[0][bi:bi + 1, :, j], grads[1][bi:bi + 1, :, j], grads[2][bi:bi + 1, :, j],
                              grads[3][bi:bi + 1, j]), ref_grads):
            torch.testing.assert_close(got.double().cpu(), want, rtol=1e-4, atol=1e-4 * want.abs().max().item())
