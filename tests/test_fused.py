"""Angle-fused rotation kernel (Givens / Rotation mixers) vs the generic eager path."""
import copy

import pytest
import torch

import scankit

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def fused_launches(monkeypatch):
    """Record the kernels each mixer call launches ('module.kernel')."""
    from scankit.triton import common

    seen = []
    launch = common.launch

    def counting(kernel, grid, *args, **meta):
        seen.append(f"{kernel.fn.__module__.rsplit('.', 1)[-1]}.{kernel.fn.__name__}")
        return launch(kernel, grid, *args, **meta)

    monkeypatch.setattr(common, "launch", counting)
    return seen


def grads_close(pairs):
    """Each fp32 grad against its float64 reference, both absent or both close: the grads are
    fp32 sums over B x T tokens, so the absolute error scales with the grad's largest entry (a
    bias grad of ~300 was 1.1e-4 off, 3e-7 of its largest, and failed a flat 1e-4 on the H100)."""
    for got, want in pairs:
        assert (got is None) == (want is None)
        if got is not None:
            torch.testing.assert_close(got.double(), want, atol=1e-5 * max(1.0, want.abs().max().item()), rtol=1e-4)


CASES = [
    ("givens k=2 R=1", lambda **kw: scankit.GivensMinGRU(5, 6, block_size=2, rounds=1, **kw)),
    ("givens k=4 R=2", lambda **kw: scankit.GivensMinGRU(5, 12, block_size=4, rounds=2, **kw)),
    ("givens k=8 R=3", lambda **kw: scankit.GivensMinGRU(5, 16, block_size=8, rounds=3, **kw)),
    ("givens k=16 R=2", lambda **kw: scankit.GivensMinGRU(5, 16, block_size=16, rounds=2, **kw)),
    ("rotation", lambda **kw: scankit.RotationMinGRU(5, 6, **kw)),
    ("rotation snap", lambda **kw: scankit.RotationMinGRU(5, 6, snap=(2, 3, 4, 6), **kw)),
]


@pytest.mark.parametrize("once", ["rule", "pair-once"])
@pytest.mark.parametrize("T", [1, 13, 40])
@pytest.mark.parametrize("variant", ["plain", "decay+delta_t+h_0"])
@pytest.mark.parametrize("name,make", CASES, ids=[c[0] for c in CASES])
def test_fused_matches_generic(name, make, variant, T, once, seed, monkeypatch, fused_launches):
    """Values and every grad against the generic path in float64; T = 13 and 40 are T-chunked
    in the interpreter (summary passes, carries folded from the chunks before / after). A
    round's cos / sin as ``givens._pair_once`` decides (per row at these widths in the
    interpreter), and taken once a pair in every pass (forced)."""
    from scankit.triton import givens

    if once == "pair-once":
        monkeypatch.setitem(givens.PAIR_ONCE, "pairs_per_thread", 0)
    torch.manual_seed(seed)
    decay = variant != "plain"
    mixer = make(decay=decay).to(DEVICE)
    with torch.no_grad():
        for p in mixer.parameters():
            p.uniform_(-0.5, 0.5)  # a non-zero learned h0 and decay too
    ref = copy.deepcopy(mixer).double()
    B = 3
    x = torch.randn(B, T, 5, device=DEVICE, requires_grad=True)
    dt = torch.rand(B, T, device=DEVICE) * 2 if decay else None
    h0 = torch.randn(B, mixer.hidden_size, device=DEVICE, requires_grad=True) if decay else None

    monkeypatch.setenv("MINGRU_SCAN", "triton")
    out = mixer(x, h_0=h0, delta_t=dt)
    chunked = givens._geometry(B, T, mixer.n, mixer.k, x.device)[1] > 1
    assert chunked == (T > 1) or DEVICE == "cuda"
    summary = ["givens._fwd_summary_kernel"] if chunked else []
    assert fused_launches == summary + ["givens._fwd_kernel"], fused_launches
    monkeypatch.setenv("MINGRU_SCAN", "eager")
    x_ref = x.detach().double().requires_grad_()
    h0_ref = h0.detach().double().requires_grad_() if h0 is not None else None
    expected = ref(x_ref, h_0=h0_ref, delta_t=None if dt is None else dt.double())
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)

    w = torch.randn(expected.shape, dtype=torch.float64, device=DEVICE)
    (out * w.float()).sum().backward()
    (expected * w).sum().backward()
    assert "givens._bwd_kernel" in fused_launches and not any(k.startswith("affine") for k in fused_launches)
    assert ("givens._bwd_summary_kernel" in fused_launches) == chunked, fused_launches
    pairs = [(x.grad, x_ref.grad)] + ([(h0.grad, h0_ref.grad)] if h0 is not None else [])
    pairs += [(p.grad, q.grad) for p, q in zip(mixer.parameters(), ref.parameters())]
    grads_close(pairs)  # the learned h0 gets no grad when h_0 is given


@pytest.mark.parametrize("name,make", [CASES[2], CASES[5]], ids=[CASES[2][0], CASES[5][0]])
def test_fused_forward_matches_step(name, make, seed, monkeypatch):
    torch.manual_seed(seed)
    mixer = make(decay=True).to(DEVICE)
    x, dt = torch.randn(2, 13, 5, device=DEVICE), torch.rand(2, 13, device=DEVICE)
    monkeypatch.setenv("MINGRU_SCAN", "triton")
    h_fused = mixer(x, delta_t=dt)
    h, hs = None, []
    for t in range(13):
        h = mixer.step(x[:, t], h, dt[:, t])
        hs.append(h)
    torch.testing.assert_close(h_fused, torch.stack(hs, 1), atol=1e-5, rtol=1e-5)


def test_outside_fused_envelope(monkeypatch, fused_launches):
    """k = 6 is outside the fused kernel: triton mode refuses, the kernel signals fallback."""
    import scankit.triton as kernels

    mixer = scankit.GivensMinGRU(5, 12, block_size=6, rounds=2)
    monkeypatch.setenv("MINGRU_SCAN", "triton")
    with pytest.raises(RuntimeError, match="GivensMinGRU kernel cannot run"):
        mixer.to(DEVICE)(torch.randn(2, 3, 5, device=DEVICE))
    with pytest.raises(scankit.ScanFallback, match="k in"):
        kernels.rotation_scan(torch.zeros(1, 2, 1, 1, 3, device=DEVICE), torch.zeros(1, 2, 1, 6, device=DEVICE))


def _pretend_gpu(monkeypatch, sms):
    from scankit.triton import common

    monkeypatch.setattr(common, "on_gpu", lambda device: True)
    monkeypatch.setattr(common, "_sm_count", lambda index: sms)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)


@pytest.mark.parametrize("B,T,d,k,chunks", [
    (1, 65536, 1024, 8, (100, None)),  # a B = 1 prefill (vlong): 128 lanes, chunked
    (1, 65536, 1024, 16, (100, None)),  # k = 16: 64 lanes
    (1, 65536, 1024, 2, (100, None)),  # RotationMinGRU's 2x2 blocks: 512 lanes
    (32, 4096, 1024, 8, (4, 16)),      # large: the lanes fill a quarter of the device, a few chunks
    (32, 4096, 1024, 2, (4, 16)),
    (16, 2048, 512, 8, (10, None)),    # fewer lanes: more chunks
    (1, 300, 1024, 8, (9, 9)),         # short T: chunks of at least min_chunk (32) steps
    (1, 100, 1024, 2, (3, 3)),
    (1, 80, 1024, 8, (1, 1)),          # fewer than min_chunks (3) such chunks: one walk
    (128, 4096, 1024, 2, (1, 1)),      # the lanes fill half the device: one walk
])
def test_rotation_chunks_on_the_gpu(B, T, d, k, chunks, monkeypatch):
    """The GPU's geometry (132 SMs): T chunked into chunks of at least CHUNKS["min_chunk"] steps
    until the programs fill the device, and only into at least CHUNKS["min_chunks"] of them
    (a summary pass and a main pass of T / chunks steps each against one walk of T), so long T
    at small batch is chunked and lanes that fill the device keep one walk; the chunks cover T,
    and a chunked launch's programs stay within the 32 blocks an SM holds at once (one wave).
    A chunked program takes the lanes of the pair-once path (k = 8: 16, not 64 // k) and, with
    them, per_sm shrinks so an SM holds the same elements as at 64 // k lanes."""
    from scankit.triton import givens
    from scankit.triton.common import next_pow2

    _pretend_gpu(monkeypatch, 132)
    bn, nc, chunk = givens._geometry(B, T, d // k, k, torch.device("cuda", 0))
    low, high = chunks
    assert nc >= low and (high is None or nc <= high), (bn, nc, chunk)
    assert (nc - 1) * chunk < T <= nc * chunk, (bn, nc, chunk)
    if nc > 1:
        assert nc >= givens.CHUNKS["min_chunks"] and chunk >= givens.CHUNKS["min_chunk"], (bn, nc, chunk)
        assert B * -(-d // k // bn) * nc <= 32 * 132, (bn, nc, chunk)
        assert givens._pair_once(bn, k) or bn == next_pow2(d // k), (bn, nc, chunk)


@pytest.mark.parametrize("make,lanes", [
    (lambda: scankit.RotationMinGRU(5, 4, decay=True), 2),
    # n = 16 blocks of 8: 16 lanes a program (the pair-once path's), 48 programs per SM-count x per_sm
    (lambda: scankit.GivensMinGRU(5, 128, block_size=8, rounds=3, decay=True), 16),
], ids=["rotation k=2", "givens k=8"])
def test_rotation_chunked_with_the_gpu_geometry(make, lanes, seed, monkeypatch, fused_launches):
    """A B = 1 RotationMinGRU / GivensMinGRU (decay, h_0) at T = 520 on a pretend 4-SM GPU: the
    GPU's geometry chunks T (16 chunks of 33 steps: 96 programs (Givens k = 8: 48 of twice the
    lanes) per SM-count x per_sm, cut at min_chunk 32); values and grads against the generic path
    in float64."""
    from scankit.triton import givens

    torch.manual_seed(seed)
    mixer = make().to(DEVICE)
    with torch.no_grad():
        for p in mixer.parameters():
            p.uniform_(-0.5, 0.5)
    ref = copy.deepcopy(mixer).double()
    x = torch.randn(1, 520, 5, device=DEVICE, requires_grad=True)
    dt = torch.rand(1, 520, device=DEVICE) * 2
    h0 = torch.randn(1, mixer.n * mixer.k, device=DEVICE, requires_grad=True)
    _pretend_gpu(monkeypatch, 4)
    assert givens._geometry(1, 520, mixer.n, mixer.k, x.device) == (lanes, 16, 33)
    monkeypatch.setenv("MINGRU_SCAN", "triton")
    out = mixer(x, h_0=h0, delta_t=dt)
    w = torch.randn(out.shape, dtype=torch.float64, device=DEVICE)
    (out * w.float()).sum().backward()
    assert fused_launches[:2] == ["givens._fwd_summary_kernel", "givens._fwd_kernel"], fused_launches
    assert "givens._bwd_summary_kernel" in fused_launches, fused_launches
    monkeypatch.setenv("MINGRU_SCAN", "eager")
    x_ref, h0_ref = x.detach().double().requires_grad_(), h0.detach().double().requires_grad_()
    expected = ref(x_ref, h_0=h0_ref, delta_t=dt.double())
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)
    (expected * w).sum().backward()
    grads_close([(x.grad, x_ref.grad), (h0.grad, h0_ref.grad)]
                + [(p.grad, q.grad) for p, q in zip(mixer.parameters(), ref.parameters())])
