"""``mingru_scan``: minGRU's recurrence from its pre-activations, the gate math inside the linear
kernels (forward and backward), against a float64 step loop; the MinGRU mixer on it."""
import copy

import pytest
import torch

import scankit
from benchmarks.harness.cases import HALF_FWD, HALF_GRAD
from benchmarks.harness.launches import Launches
from oracles import mingru_loop

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SCANS = {"_fwd_kernel", "_bwd_kernel", "_fwd_lookback_kernel", "_bwd_lookback_kernel"}


@pytest.fixture
def launches(monkeypatch):
    """MINGRU_SCAN=triton; the (kernel name, GATE flag) of every Triton launch."""
    from scankit.triton import common

    monkeypatch.setenv("MINGRU_SCAN", "triton")
    seen = []
    launch = common.launch

    def recording(kernel, grid, *args, **meta):
        seen.append((kernel.fn.__name__, meta.get("GATE")))
        return launch(kernel, grid, *args, **meta)

    monkeypatch.setattr(common, "launch", recording)
    return seen


def pre_activations(B, T, D, seed, dtype=torch.float32, scale=2.0):
    """[k | v] (B, T, 2D): wide enough that gates saturate and v takes both branches of g."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, T, 2 * D, generator=g) * scale).to(device=DEVICE, dtype=dtype)


def check(p, h0, h_atol=1e-5, grad_atol=1e-4, gates=None):
    """Forward and grads (of gate_hidden and h0, random cotangents) against the float64 loop."""
    leaves = [p.requires_grad_()] + ([h0.requires_grad_()] if h0 is not None else [])
    refs = [x.detach().double().cpu().requires_grad_() for x in leaves]
    h = scankit.mingru_scan(p, h0=h0)
    ref = mingru_loop(refs[0], refs[1] if h0 is not None else None)
    assert h.shape == ref.shape and h.dtype == p.dtype and h.device == p.device
    w = torch.randn(ref.shape, dtype=torch.float64)
    grads = torch.autograd.grad((h * w.to(h)).sum(), leaves)
    ref_grads = torch.autograd.grad((ref * w).sum(), refs)
    if gates is None:
        torch.testing.assert_close(h.detach().cpu().double(), ref.detach(), atol=h_atol, rtol=1e-5)
        for g, r in zip(grads, ref_grads):
            assert g.shape == r.shape
            torch.testing.assert_close(g.cpu().double(), r, atol=grad_atol, rtol=1e-5)
    else:  # half precision: the gates scale with the values
        assert gates[0].passes(h.detach().cpu(), ref.detach()), gates[0].margin(h.detach().cpu(), ref.detach())
        for g, r in zip(grads, ref_grads):
            assert gates[1].passes(g.cpu(), r), gates[1].margin(g.cpu(), r)


@pytest.mark.parametrize("B,T,D", [(2, 1, 5), (2, 13, 5), (3, 70, 40), (1, 257, 33)])
@pytest.mark.parametrize("with_h0", [False, True])
def test_kernels_against_the_loop(B, D, T, with_h0, seed, lookback, launches):
    """Every path of the linear kernels with the gate: one pass, T-chunked summaries (look-back
    off; B = 1 is 2 programs, split at T = 257), single-pass look-back, forward and backward;
    D = 40 leaves the second column tile partly masked."""
    h0 = torch.rand(B, D, device=DEVICE) * 2 if with_h0 else None
    check(pre_activations(B, T, D, seed), h0)
    kernels = {name for name, _ in launches}
    assert kernels and kernels <= SCANS and all(gate for _, gate in launches), launches
    if B == 1 and T == 257 and DEVICE == "cpu":
        assert (lookback == "off") == ("_fwd_lookback_kernel" not in kernels), launches


def test_saturated_gates_and_large_values(seed, launches):
    """k = +-40 (z = 0 or 1 exactly in fp32), v up to +-1e4: no NaN, the states and grads of the loop."""
    p = pre_activations(2, 40, 7, seed)
    p[:, ::3, :7] = 40.0
    p[:, 1::3, :7] = -40.0
    p[:, :, 7:] *= 5e3
    h0 = torch.rand(2, 7, device=DEVICE)
    leaves = [p.requires_grad_(), h0.requires_grad_()]
    h = scankit.mingru_scan(p, h0=h0)
    ref = mingru_loop(p.detach().double().cpu(), h0.detach().double().cpu())
    torch.testing.assert_close(h.detach().cpu().double(), ref, atol=1e-3, rtol=1e-5)
    grads = torch.autograd.grad(h.sum(), leaves)
    assert all(torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision(dtype, seed, launches):
    """Half inputs, fp32 inside: within the half gates of the loop on the rounded inputs."""
    check(pre_activations(3, 37, 24, seed, dtype=dtype), torch.rand(3, 24, device=DEVICE).to(dtype),
          gates=(HALF_FWD, HALF_GRAD))


def test_strided_inputs(seed, launches):
    """gate_hidden as a time-major view, and as columns of a wider projection: the kernels read strides."""
    p = pre_activations(3, 29, 12, seed)
    check(p.transpose(0, 1).contiguous().transpose(0, 1).detach(), None)
    wide = pre_activations(3, 29, 20, seed + 1)[..., 5:5 + 24].detach()
    assert not wide.is_contiguous()
    check(wide, torch.rand(3, 12, device=DEVICE))


def test_eager_reference_against_the_loop(seed, scan_mode):
    """The eager path (the log terms through ``parallel_scan_log``), float64, with h0 and without."""
    scan_mode("eager")
    p = pre_activations(2, 33, 6, seed).double()
    for h0 in (None, torch.rand(2, 6, device=DEVICE, dtype=torch.float64)):
        torch.testing.assert_close(scankit.mingru_scan(p, h0=h0), mingru_loop(p, h0).to(p.device), atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("cuts", [(1,), (13, 14), (100,)])
def test_final_state_continues_in_pieces(cuts, seed, kernel_mode):
    """Scanning in pieces, each from the last piece's final state, equals one call (the eager
    path in float64: its fp32 log-space running sums drift by ~1e-5 over 130 steps)."""
    dtype = torch.float64 if kernel_mode == "eager" else torch.float32
    p = pre_activations(2, 130, 9, seed, dtype=dtype)
    h0 = torch.rand(2, 9, device=DEVICE, dtype=dtype)
    whole, last = scankit.mingru_scan(p, h0=h0, return_final_state=True)
    torch.testing.assert_close(last, whole[:, -1])
    pieces, h = [], h0
    for lo, hi in zip((0, *cuts), (*cuts, 130)):
        out, h = scankit.mingru_scan(p[:, lo:hi], h0=h, return_final_state=True)
        pieces.append(out)
    torch.testing.assert_close(torch.cat(pieces, 1), whole, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(h, last, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("bad,match", [
    (lambda p, h0: (p[..., :-1], None), r"gate_hidden must have shape \(B, T, 2D\)"),
    (lambda p, h0: (p[0], None), "gate_hidden must be 3-D"),
    (lambda p, h0: (p[:, :0], None), "T >= 1"),
    (lambda p, h0: (p.int(), None), "gate_hidden must be float"),
    (lambda p, h0: (p, h0[:, :3]), r"h0 must have shape \(B, D\) = \(2, 4\)"),
    (lambda p, h0: (p, h0.double()), "h0 must have the dtype of gate_hidden"),
    (lambda p, h0: (p, -h0), "h0 must be >= 0"),
])
def test_bad_arguments_are_named(bad, match, kernel_mode):
    p, h0 = bad(torch.randn(2, 5, 8), torch.rand(2, 4) + 0.1)
    with pytest.raises((TypeError, ValueError), match=match):
        scankit.mingru_scan(p, h0=h0)
    with pytest.raises(TypeError, match="return_final_state must be True or False"):
        scankit.mingru_scan(torch.randn(2, 5, 8), return_final_state=1)


def test_launches_one_kernel_each_way(seed, monkeypatch):
    """One launch forward and one backward, no glue (a wide call: one pass each way; h0 = 0, as
    a given h0's values are checked on the CPU)."""
    monkeypatch.setenv("MINGRU_SCAN", "triton")
    p = pre_activations(4, 13, 64, seed).requires_grad_()
    h = scankit.mingru_scan(p)
    g = torch.randn_like(h)
    torch.autograd.backward(h, g)
    p.grad = None
    with Launches() as counted:
        torch.autograd.backward(scankit.mingru_scan(p), g)
    assert counted.kernels == ["_fwd_kernel", "_bwd_kernel"] and not counted.glue, (counted.kernels, counted.glue)


# The MinGRU mixer on the fused op ------------------------------------------------------

def test_mingru_mixer_takes_the_fused_kernel(seed, launches, monkeypatch):
    """MinGRU without decay: one gated forward and backward kernel, the same outputs and
    parameter grads as the eager path (float64) within fp32."""
    torch.manual_seed(seed)
    mixer = scankit.MinGRU(5, 24).to(DEVICE)
    ref = copy.deepcopy(mixer).double()
    x = torch.randn(3, 41, 5, device=DEVICE, requires_grad=True)
    h0 = (torch.rand(3, 24, device=DEVICE) + 0.1).requires_grad_()
    out = mixer(x, h_0=h0)
    (out * torch.linspace(0, 1, 41, device=DEVICE)[:, None]).sum().backward()
    assert {name for name, _ in launches} <= SCANS and all(gate for _, gate in launches) and len(launches) >= 2
    monkeypatch.setenv("MINGRU_SCAN", "eager")
    x_ref, h0_ref = (t.detach().double().requires_grad_() for t in (x, h0))
    expected = ref(x_ref, h_0=h0_ref)
    (expected * torch.linspace(0, 1, 41, device=DEVICE, dtype=torch.float64)[:, None]).sum().backward()
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)
    for got, want in [(x.grad, x_ref.grad), (h0.grad, h0_ref.grad)] + [
            (p.grad, q.grad) for p, q in zip(mixer.parameters(), ref.parameters())]:
        torch.testing.assert_close(got.double(), want, atol=1e-4, rtol=1e-4)


def test_mingru_with_decay_or_packing_keeps_the_log_scan(seed, launches):
    """Decay and packed sequences are not fused: the log terms, then parallel_scan_log."""
    torch.manual_seed(seed)
    x = torch.randn(1, 9, 5, device=DEVICE)
    scankit.MinGRU(5, 6, decay=True).to(DEVICE)(x, delta_t=torch.rand(1, 9, device=DEVICE))
    scankit.MinGRU(5, 6).to(DEVICE)(x, cu_seqlens=torch.tensor([0, 4, 9]))
    assert {name for name, _ in launches} == {"_log_fwd_kernel"}, launches
    with pytest.raises(ValueError, match="delta_t was given but this mixer was built with decay=False"):
        scankit.MinGRU(5, 6).to(DEVICE)(x, delta_t=torch.rand(1, 9, device=DEVICE))


def test_mingru_layer_step_launches_less(seed, monkeypatch):
    """A MinGRU layer's training step: the fused kernels replace the gate math's glue (every
    softplus, where, log and add of the log terms, forward and backward)."""
    monkeypatch.setenv("MINGRU_SCAN", "triton")
    torch.manual_seed(seed)
    layer = scankit.MinGRU(16, 32).to(DEVICE)
    x = torch.randn(4, 13, 16, device=DEVICE)

    def step(fused):
        layer.zero_grad(set_to_none=True)
        with Launches() as counted:
            if fused:
                out = layer(x)
            else:  # the same layer through its log terms (what it ran before the fused op)
                log_a, log_b = layer._log_terms(x, None)
                out = scankit.parallel_scan_log(log_a, log_b, log_h0=layer.initial_state(4, x).log())
            out.square().sum().backward()
        return counted

    fused, unfused = step(True), step(False)
    assert fused.kernels == ["_fwd_kernel", "_bwd_kernel"], fused.kernels
    assert len(fused.glue) + 10 <= len(unfused.glue), (fused.glue, unfused.glue)
