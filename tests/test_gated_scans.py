"""``mingru_scan`` / ``signed_mingru_scan``: the minGRU recurrences from their pre-activations,
the gate math inside the linear kernels (forward and backward), against float64 step loops;
the MinGRU and SignedMinGRU mixers on them."""
import copy
import functools

import pytest
import torch

import scankit
from benchmarks.harness.cases import HALF_FWD, HALF_GRAD
from benchmarks.harness.launches import Launches
from conftest import record_launches
from oracles import mingru_loop, signed_loop

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SCANS = {"_fwd_kernel", "_bwd_kernel", "_fwd_lookback_kernel", "_bwd_lookback_kernel"}
# gate -> (the op, its operand blocks n (proj is (B, T, n D)), the float64 oracle)
GATED = {
    "mingru": (scankit.mingru_scan, 2, mingru_loop),
    "signed": (scankit.signed_mingru_scan, 3, signed_loop),
    "coupled": (functools.partial(scankit.signed_mingru_scan, coupled=True), 3,
                functools.partial(signed_loop, coupled=True)),
}


@pytest.fixture
def launches(monkeypatch):
    """MINGRU_SCAN=triton; the (kernel name, GATE) of every Triton launch."""
    return record_launches(monkeypatch, lambda name, meta: (name, meta.get("GATE")))


def pre_activations(gate, B, T, D, seed, dtype=torch.float32, scale=2.0):
    """(B, T, n D): wide enough that gates saturate and v takes both branches of g; the first
    operand's first column near 0 (tanh's series there)."""
    g = torch.Generator().manual_seed(seed)
    p = torch.randn(B, T, GATED[gate][1] * D, generator=g) * scale
    p[..., 0] *= 0.05
    return p.to(device=DEVICE, dtype=dtype)


def check(gate, p, h0, h_atol=1e-5, grad_atol=1e-4, gates=None):
    """Forward and grads (of proj and h0, random cotangents) against the float64 loop."""
    op, _, loop = GATED[gate]
    leaves = [p.requires_grad_()] + ([h0.requires_grad_()] if h0 is not None else [])
    refs = [x.detach().double().cpu().requires_grad_() for x in leaves]
    h = op(p, h0=h0)
    ref = loop(refs[0], refs[1] if h0 is not None else None)
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


def h0_for(gate, B, D, dtype=torch.float32):
    """A random h0: positive for minGRU, either sign for the signed gates."""
    h0 = torch.rand(B, D, device=DEVICE) * 2
    return (h0 if gate == "mingru" else h0 - 1).to(dtype)


@pytest.mark.parametrize("B,T,D", [(2, 1, 5), (2, 13, 5), (3, 70, 40), (1, 257, 33)])
@pytest.mark.parametrize("with_h0", [False, True])
@pytest.mark.parametrize("gate", list(GATED))
def test_kernels_against_the_loop(gate, B, D, T, with_h0, seed, launches):
    """Each gate through the linear kernels, forward and backward: one pass, and (B = 1: 2
    programs, T = 257 split) the single-pass look-back; D = 40 leaves the second column tile
    partly masked."""
    check(gate, pre_activations(gate, B, T, D, seed), h0_for(gate, B, D) if with_h0 else None)
    kernels = {name for name, _ in launches}
    assert kernels and kernels <= SCANS and all(g for _, g in launches), launches
    if B == 1 and DEVICE == "cpu":
        assert "_fwd_lookback_kernel" in kernels and "_bwd_lookback_kernel" in kernels, launches


@pytest.mark.parametrize("gate", list(GATED))
def test_every_look_back_setting(gate, seed, lookback, launches):
    """Each gate on every look-back setting (``lookback``): the T-chunked summary passes ("off"),
    look-back everywhere, look-backs composing aggregates; B = 1, T = 150 (10 CPU tiles)."""
    check(gate, pre_activations(gate, 1, 150, 33, seed), h0_for(gate, 1, 33))
    kernels = {name for name, _ in launches}
    assert all(g for _, g in launches) and (lookback == "off") == ("_fwd_lookback_kernel" not in kernels), launches
    if lookback == "off" and DEVICE == "cpu":
        assert [k for k, _ in launches].count("_fwd_kernel") >= 2, launches  # summary + main pass


@pytest.mark.parametrize("gate", list(GATED))
def test_saturated_gates_and_large_values(gate, seed, launches):
    """Pre-activations at +-40 (sigmoid 0 or 1, tanh +-1 exactly in fp32), v up to +-1e4: no NaN,
    the states of the loop, finite grads."""
    n = GATED[gate][1]
    p = pre_activations(gate, 2, 40, 7, seed)
    p[:, ::3, :(n - 1) * 7] = 40.0
    p[:, 1::3, :(n - 1) * 7] = -40.0
    p[:, :, (n - 1) * 7:] *= 5e3
    h0 = h0_for(gate, 2, 7)
    leaves = [p.requires_grad_(), h0.requires_grad_()]
    h = GATED[gate][0](p, h0=h0)
    ref = GATED[gate][2](p.detach().double().cpu(), h0.detach().double().cpu())
    torch.testing.assert_close(h.detach().cpu().double(), ref, atol=1e-3 * ref.abs().max().item(), rtol=1e-5)
    assert all(torch.isfinite(g).all() for g in torch.autograd.grad(h.sum(), leaves))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("gate", list(GATED))
def test_half_precision(gate, dtype, seed, launches):
    """Half inputs, fp32 inside: within the half gates of the loop on the rounded inputs."""
    check(gate, pre_activations(gate, 3, 37, 24, seed, dtype=dtype), h0_for(gate, 3, 24, dtype),
          gates=(HALF_FWD, HALF_GRAD))


@pytest.mark.parametrize("gate", list(GATED))
def test_strided_inputs(gate, seed, launches):
    """proj as a time-major view, and as columns of a wider projection: the kernels read strides."""
    n = GATED[gate][1]
    p = pre_activations(gate, 3, 29, 12, seed)
    check(gate, p.transpose(0, 1).contiguous().transpose(0, 1).detach(), None)
    wide = pre_activations(gate, 3, 29, 20, seed + 1)[..., 5:5 + n * 12].detach()
    assert not wide.is_contiguous()
    check(gate, wide, h0_for(gate, 3, 12))


@pytest.mark.parametrize("gate", list(GATED))
def test_eager_references_against_the_loop(gate, seed, scan_mode):
    """The eager paths (minGRU: its log terms through ``parallel_scan_log``; signed: its terms
    through ``linear_scan``), float64, with h0 and without."""
    scan_mode("eager")
    op, _, loop = GATED[gate]
    p = pre_activations(gate, 2, 33, 6, seed).double()
    for h0 in (None, h0_for(gate, 2, 6, torch.float64)):
        torch.testing.assert_close(op(p, h0=h0), loop(p, h0).to(p.device), atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("cuts", [(1,), (13, 14), (100,)])
@pytest.mark.parametrize("gate", list(GATED))
def test_final_state_continues_in_pieces(gate, cuts, seed, kernel_mode):
    """Scanning in pieces, each from the last piece's final state, equals one call (the eager
    paths in float64: the log op's fp32 running sums drift by ~1e-5 over 130 steps)."""
    op = GATED[gate][0]
    dtype = torch.float64 if kernel_mode == "eager" else torch.float32
    p = pre_activations(gate, 2, 130, 9, seed, dtype=dtype)
    h0 = h0_for(gate, 2, 9, dtype)
    whole, last = op(p, h0=h0, return_final_state=True)
    torch.testing.assert_close(last, whole[:, -1])
    pieces, h = [], h0
    for lo, hi in zip((0, *cuts), (*cuts, 130)):
        out, h = op(p[:, lo:hi], h0=h, return_final_state=True)
        pieces.append(out)
    torch.testing.assert_close(torch.cat(pieces, 1), whole, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(h, last, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("call,bad,match", [
    ("mingru", lambda p, h0: (p[..., :-1], None), r"gate_hidden must have shape \(B, T, 2D\)"),
    ("mingru", lambda p, h0: (p[0], None), "gate_hidden must be 3-D"),
    ("mingru", lambda p, h0: (p[:, :0], None), "T >= 1"),
    ("mingru", lambda p, h0: (p.int(), None), "gate_hidden must be float"),
    ("mingru", lambda p, h0: (p, h0[:, :3]), r"h0 must have shape \(B, D\) = \(2, 4\)"),
    ("mingru", lambda p, h0: (p, h0.double()), "h0 must have the dtype of gate_hidden"),
    ("mingru", lambda p, h0: (p, -h0), "h0 must be >= 0"),
    ("signed", lambda p, h0: (p[..., :7], None), r"proj must have shape \(B, T, 3D\)"),
    ("signed", lambda p, h0: (p[..., :6], h0), r"h0 must have shape \(B, D\) = \(2, 2\)"),
])
def test_bad_arguments_are_named(call, bad, match, kernel_mode, monkeypatch):
    monkeypatch.setenv("SCANKIT_CHECK_VALUES", "1")  # h0's sign is read back from a GPU only when asked
    op = GATED[call][0]
    p, h0 = bad(torch.randn(2, 5, 12 if call == "signed" else 8, device=DEVICE), torch.rand(2, 4, device=DEVICE) + 0.1)
    with pytest.raises((TypeError, ValueError), match=match):
        op(p, h0=h0)
    with pytest.raises(TypeError, match="return_final_state must be True or False"):
        op(torch.randn(2, 5, 12, device=DEVICE), return_final_state=1)
    with pytest.raises(TypeError, match="coupled must be True or False"):
        scankit.signed_mingru_scan(torch.randn(2, 5, 12, device=DEVICE), coupled=None)


@pytest.mark.parametrize("gate", list(GATED))
def test_launches_one_kernel_each_way(gate, seed, monkeypatch):
    """One launch forward and one backward, no glue (a wide call: one pass each way; h0 = 0, as
    a given minGRU h0's values are checked on the CPU)."""
    monkeypatch.setenv("MINGRU_SCAN", "triton")
    p = pre_activations(gate, 4, 13, 64, seed).requires_grad_()
    h = GATED[gate][0](p)
    g = torch.randn_like(h)
    torch.autograd.backward(h, g)
    p.grad = None
    with Launches() as counted:
        torch.autograd.backward(GATED[gate][0](p), g)
    assert counted.kernels == ["_fwd_kernel", "_bwd_kernel"] and not counted.glue, (counted.kernels, counted.glue)


# The mixers on the fused ops ------------------------------------------------------------

MIXERS = {
    "mingru": lambda: scankit.MinGRU(5, 24),
    "signed": lambda: scankit.SignedMinGRU(5, 24),
    "coupled": lambda: scankit.SignedMinGRU(5, 24, coupled=True),
}


@pytest.mark.parametrize("name", list(MIXERS))
def test_mixers_take_the_fused_kernels(name, seed, launches, monkeypatch):
    """MinGRU / SignedMinGRU without decay: one gated forward and backward kernel, the same
    outputs and parameter grads as the eager path (float64) within fp32."""
    torch.manual_seed(seed)
    mixer = MIXERS[name]().to(DEVICE)
    ref = copy.deepcopy(mixer).double()
    x = torch.randn(3, 41, 5, device=DEVICE, requires_grad=True)
    h0 = (torch.rand(3, 24, device=DEVICE) + 0.1).requires_grad_()
    out = mixer(x, h_0=h0)
    (out * torch.linspace(0, 1, 41, device=DEVICE)[:, None]).sum().backward()
    assert {k for k, _ in launches} <= SCANS and all(g for _, g in launches) and len(launches) >= 2, launches
    monkeypatch.setenv("MINGRU_SCAN", "eager")
    x_ref, h0_ref = (t.detach().double().requires_grad_() for t in (x, h0))
    expected = ref(x_ref, h_0=h0_ref)
    (expected * torch.linspace(0, 1, 41, device=DEVICE, dtype=torch.float64)[:, None]).sum().backward()
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)
    for got, want in [(x.grad, x_ref.grad), (h0.grad, h0_ref.grad)] + [
            (p.grad, q.grad) for p, q in zip(mixer.parameters(), ref.parameters())]:
        torch.testing.assert_close(got.double(), want, atol=1e-4, rtol=1e-4)


def test_decay_or_packing_keeps_the_unfused_scans(seed, launches):
    """Decay and packed sequences are not fused: the terms, then parallel_scan_log / linear_scan."""
    torch.manual_seed(seed)
    x, dt, cu = torch.randn(1, 9, 5, device=DEVICE), torch.rand(1, 9, device=DEVICE), torch.tensor([0, 4, 9])
    scankit.MinGRU(5, 6, decay=True).to(DEVICE)(x, delta_t=dt)
    scankit.MinGRU(5, 6).to(DEVICE)(x, cu_seqlens=cu)
    assert {k for k, _ in launches} == {"_log_fwd_kernel"}, launches
    launches.clear()
    scankit.SignedMinGRU(5, 6, decay=True).to(DEVICE)(x, delta_t=dt)
    scankit.SignedMinGRU(5, 6).to(DEVICE)(x, cu_seqlens=cu)
    assert launches and not any(g for _, g in launches), launches
    for mixer in (scankit.MinGRU(5, 6), scankit.SignedMinGRU(5, 6)):
        with pytest.raises(ValueError, match="delta_t was given but this mixer was built with decay=False"):
            mixer.to(DEVICE)(x, delta_t=dt)


@pytest.mark.parametrize("name", ["mingru", "signed"])
def test_layer_step_launches_less(name, seed, monkeypatch):
    """A layer's training step: the fused kernels replace the gate math's glue (the activations
    and products of the terms, forward and backward)."""
    monkeypatch.setenv("MINGRU_SCAN", "triton")
    torch.manual_seed(seed)
    layer = (scankit.MinGRU if name == "mingru" else scankit.SignedMinGRU)(16, 32).to(DEVICE)
    x = torch.randn(4, 13, 16, device=DEVICE)

    def step(fused):
        layer.zero_grad(set_to_none=True)
        with Launches() as counted:
            if fused:
                out = layer(x)
            elif name == "mingru":  # the same layer through its terms (what it ran before the fused ops)
                log_a, log_b = layer._log_terms(layer.to_gate_hidden(x), x, None)
                out = scankit.parallel_scan_log(log_a, log_b, log_h0=layer.initial_state(4, x).log())
            else:
                out = scankit.linear_scan(*layer._terms(layer.proj(x), x, None), return_prefix=False)
            out.square().sum().backward()
        return counted

    fused, unfused = step(True), step(False)
    assert fused.kernels == ["_fwd_kernel", "_bwd_kernel"], fused.kernels
    fewer = {"mingru": 25, "signed": 8}[name]  # counted on the CPU: 42 -> 13 and 17 -> 9 glue launches
    assert len(fused.glue) + fewer <= len(unfused.glue), (fused.glue, unfused.glue)
