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


CASES = [
    ("givens k=2 R=1", lambda **kw: scankit.GivensMinGRU(5, 6, block_size=2, rounds=1, **kw)),
    ("givens k=4 R=2", lambda **kw: scankit.GivensMinGRU(5, 12, block_size=4, rounds=2, **kw)),
    ("givens k=8 R=3", lambda **kw: scankit.GivensMinGRU(5, 16, block_size=8, rounds=3, **kw)),
    ("givens k=16 R=2", lambda **kw: scankit.GivensMinGRU(5, 16, block_size=16, rounds=2, **kw)),
    ("rotation", lambda **kw: scankit.RotationMinGRU(5, 6, **kw)),
    ("rotation snap", lambda **kw: scankit.RotationMinGRU(5, 6, snap=(2, 3, 4, 6), **kw)),
]


@pytest.mark.parametrize("T", [1, 13])
@pytest.mark.parametrize("variant", ["plain", "decay+delta_t+h_0"])
@pytest.mark.parametrize("name,make", CASES, ids=[c[0] for c in CASES])
def test_fused_matches_generic(name, make, variant, T, seed, monkeypatch, fused_launches):
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
    assert fused_launches == ["givens._fwd_kernel"], fused_launches
    monkeypatch.setenv("MINGRU_SCAN", "eager")
    x_ref = x.detach().double().requires_grad_()
    h0_ref = h0.detach().double().requires_grad_() if h0 is not None else None
    expected = ref(x_ref, h_0=h0_ref, delta_t=None if dt is None else dt.double())
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)

    w = torch.randn(expected.shape, dtype=torch.float64, device=DEVICE)
    (out * w.float()).sum().backward()
    (expected * w).sum().backward()
    assert "givens._bwd_kernel" in fused_launches and not any(k.startswith("affine") for k in fused_launches)
    pairs = [(x.grad, x_ref.grad)] + ([(h0.grad, h0_ref.grad)] if h0 is not None else [])
    pairs += [(p.grad, q.grad) for p, q in zip(mixer.parameters(), ref.parameters())]
    for got, want in pairs:
        assert (got is None) == (want is None)  # the learned h0 gets no grad when h_0 is given
        if got is not None:
            torch.testing.assert_close(got.double(), want, atol=1e-4, rtol=1e-4)


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
