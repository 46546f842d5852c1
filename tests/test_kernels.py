"""Triton kernels against the float64 oracles (CPU: through TRITON_INTERPRET=1).

Every test counts kernel launches, so an eager fallback cannot pass as a kernel.
"""
import math

import pytest
import torch

import scankit
from benchmarks.harness.cases import KERNEL_KV, OPS
from conftest import record_launches
from oracles import oracle, states

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
gpu = pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA device")


@pytest.fixture
def launches(monkeypatch):
    """MINGRU_SCAN=triton, and a list that records every Triton kernel launch (its name)."""
    return record_launches(monkeypatch, lambda name, meta: name)


def as_tuple(x):
    return x if isinstance(x, tuple) else (x,)


def check(op_name, xs, atol, rtol, grad_atol, grad_rtol=0.0, launches=None):
    """Forward and input grads (random cotangents) against the float64 oracle."""
    xs = [x.detach().requires_grad_(True) for x in xs]
    ref_in = [x.detach().double().cpu().requires_grad_(True) for x in xs]
    out = as_tuple(OPS[op_name].fn(*xs))
    ref = as_tuple(oracle(op_name, ref_in))
    assert launches, "no Triton kernel was launched"
    weights = [torch.randn(r.shape, dtype=torch.float64) for r in ref]
    for o, r in zip(out, ref):
        assert o.dtype == xs[0].dtype and o.device == xs[0].device
        torch.testing.assert_close(o.detach().cpu().double(), r.detach(), atol=atol, rtol=rtol)
    grads = torch.autograd.grad(sum((o * w.to(o)).sum() for o, w in zip(out, weights)), xs)
    ref_grads = torch.autograd.grad(sum((r * w).sum() for r, w in zip(ref, weights)), ref_in)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g.cpu().double(), r, atol=grad_atol, rtol=grad_rtol)


def check_states(op_name, xs, h0_shape=None, strided=False):
    """The state-only form (h from h0 when ``h0_shape`` is given) and its input grads,
    h0's included, against the float64 oracle; ``strided``: time-major views as inputs."""
    if strided:
        xs = [x.transpose(0, 1).contiguous().transpose(0, 1) for x in xs]
    xs = [x.detach().requires_grad_() for x in xs]
    ref_in = [x.detach().double().cpu().requires_grad_() for x in xs]
    h0 = torch.randn(h0_shape, device=xs[0].device).requires_grad_() if h0_shape else None
    h0_ref = h0.detach().double().cpu().requires_grad_() if h0_shape else None
    h = OPS[op_name].fn(*xs, h0=h0, return_prefix=False)
    ref = states(op_name, ref_in, h0_ref)
    torch.testing.assert_close(h.detach().cpu().double(), ref.detach(), atol=1e-5, rtol=1e-5)
    w = torch.randn(ref.shape, dtype=torch.float64)
    leaves, ref_leaves = xs + ([h0] if h0_shape else []), ref_in + ([h0_ref] if h0_shape else [])
    for g, r in zip(torch.autograd.grad((h * w.to(h)).sum(), leaves), torch.autograd.grad((ref * w).sum(), ref_leaves)):
        torch.testing.assert_close(g.cpu().double(), r, atol=1e-4, rtol=1e-5)


OPS_SMALL = {"parallel_scan_log": dict(B=2, D=5), "linear_scan": dict(B=2, D=5), "linear_scan_state": dict(B=2, D=5),
             "matrix_scan": dict(B=2, n=3),
             "matrix_affine_scan": dict(B=2, n=2, k=4, v=2)}
DIMS = {
    "parallel_scan_log": [dict(B=2, D=5), dict(B=3, D=130)],
    "linear_scan": [dict(B=2, D=5), dict(B=3, D=130)],
    "matrix_scan": [dict(B=2, n=3), dict(B=1, n=9)],
}


@pytest.mark.parametrize("T", [1, 13, 40])
@pytest.mark.parametrize("case", [(op, i) for op in DIMS for i in range(2)], ids=str)
def test_elementwise_and_matrix_ops(case, T, seed, launches):
    op_name, i = case
    xs = OPS[op_name].inputs(dict(DIMS[op_name][i], T=T), device=DEVICE, seed=seed)
    check(op_name, xs, 1e-5, 1e-5, 1e-4, 1e-5, launches)


@pytest.mark.parametrize("T", [1, 13, 40])
@pytest.mark.parametrize("v", KERNEL_KV)
@pytest.mark.parametrize("k", KERNEL_KV)
def test_matrix_affine_envelope(k, v, T, seed, launches):
    xs = OPS["matrix_affine_scan"].inputs(dict(B=2, T=T, n=3 if k < 16 else 1, k=k, v=v), device=DEVICE, seed=seed)
    check("matrix_affine_scan", xs, 1e-5, 1e-5, 1e-4, 1e-5, launches)


@pytest.mark.parametrize("T", [1, 13, 40])
@pytest.mark.parametrize("k,v", [(3, 1), (3, 3), (5, 2), (6, 16), (7, 5), (12, 1), (1, 3), (16, 9)])
def test_matrix_affine_blocks_not_powers_of_two(k, v, T, seed, launches):
    """k or v not a power of two: the generic kernels pad their tiles (zeros in, never stored),
    the k = 3 backward runs in lane blocks. Prefix form, then states from h0 on strided inputs,
    forward and grads against the float64 oracle; T = 40 chunks (the interpreter's geometry)."""
    xs = OPS["matrix_affine_scan"].inputs(dict(B=2, T=T, n=3, k=k, v=v), device=DEVICE, seed=seed)
    check("matrix_affine_scan", xs, 1e-5, 1e-5, 1e-4, 1e-5, launches)
    launches.clear()
    check_states("matrix_affine_scan", xs, (2, 3, k, v), strided=True)
    assert "_fwd_kernel" in launches and launches[-1] == ("_bwdk_kernel" if k == 3 else "_bwd_kernel"), launches


@pytest.mark.parametrize("op_name,dims", [("linear_scan", dict(B=2, D=7)), ("matrix_scan", dict(B=2, n=3)),
                                          ("matrix_affine_scan", dict(B=2, n=2, k=4, v=2))])
@pytest.mark.parametrize("with_h0", [False, True])
def test_state_only_form_with_h0(op_name, dims, with_h0, seed, launches):
    xs = OPS[op_name].inputs(dict(dims, T=40), device=DEVICE, seed=seed)
    h0_shape = as_tuple(oracle(op_name, [x.double().cpu() for x in xs]))[1][:, 0].shape if with_h0 else None
    check_states(op_name, xs, h0_shape)
    assert launches


@pytest.mark.parametrize("op_name,dims", [("parallel_scan_log", dict(B=3, D=6)), ("linear_scan", dict(B=3, D=6)),
                                          ("matrix_scan", dict(B=3, n=2)), ("matrix_affine_scan", dict(B=3, n=2, k=4, v=2))])
def test_non_contiguous_inputs(op_name, dims, seed, launches):
    """Inputs that are transposed views (batch and time swapped in memory)."""
    xs = OPS[op_name].inputs(dict(dims, T=13), device=DEVICE, seed=seed)
    views = [x.transpose(0, 1).contiguous().transpose(0, 1) for x in xs]
    assert not any(v.is_contiguous() for v in views)
    check(op_name, views, 1e-5, 1e-5, 1e-4, 1e-5, launches)


def test_log_op_extremes_stay_finite(seed, launches):
    """log values from -80 to +20 and decays from 1e-6 to 1: finite and accurate."""
    gen = torch.Generator().manual_seed(seed)
    B, T, D = 2, 40, 6
    log_coeffs = torch.empty(B, T, D).uniform_(math.log(1e-6), 0.0, generator=gen)
    log_coeffs[:, ::7] = 0.0  # decay exactly 1
    log_values = torch.empty(B, T + 1, D).uniform_(-80.0, 20.0, generator=gen)
    log_values[:, :, 0] = -80.0
    log_values[:, :, 1] = 20.0
    xs = [log_coeffs.to(DEVICE), log_values.to(DEVICE)]
    for x in xs:
        x.requires_grad_()
    h = scankit.parallel_scan_log(*xs)
    ref_in = [x.detach().double().cpu().requires_grad_() for x in xs]
    ref = oracle("parallel_scan_log", ref_in)
    assert torch.isfinite(h).all()
    torch.testing.assert_close(h.detach().cpu().double(), ref.detach(), atol=0, rtol=1e-5)
    grads = torch.autograd.grad(h.sum(), xs)
    ref_grads = torch.autograd.grad(ref.sum(), ref_in)
    for g, r in zip(grads, ref_grads):
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g.cpu().double(), r, atol=1e-6, rtol=1e-4)
    assert launches


def wide_range_log_inputs(B, T, D, gen, spread=60.0):
    """Log-op inputs whose states follow a random path h_t = exp(l_t), l_t uniform in
    [-spread, spread]: each step decays the last state by exp(-delta) and adds the rest, so
    log coefficients run up to ~2 spread (exp() of them far outside fp32) right next to
    strong decays, while every h is finite and positive."""
    ell = torch.empty(B, T + 1, D, dtype=torch.float64).uniform_(-spread, spread, generator=gen)
    if T >= 2 and D >= 2:  # the extremes planted, not left to the draw: a rise of 2 spread, a fall of 2 spread
        ell[:, 0, 0], ell[:, 1, 0] = -spread, spread
        ell[:, 1, 1], ell[:, 2, 1] = spread, -spread
    delta = torch.empty(B, T, D, dtype=torch.float64).uniform_(0.01, 5.0, generator=gen)
    log_coeffs = ell[:, 1:] - ell[:, :-1] - delta
    log_values = torch.cat([ell[:, :1], ell[:, 1:] + torch.log1p(-torch.exp(-delta))], dim=1)
    return log_coeffs.float(), log_values.float()


@pytest.mark.parametrize("T", [1, 13, 150])
def test_log_op_beyond_fp32_exp_range(T, seed, launches):
    """exp(log_coeffs) up to e^120 next to decays of e^-120, states from e^-60 to e^60:
    h and the grads (of a loss on log h) to fp32 rounding of the float64 oracle's."""
    gen = torch.Generator().manual_seed(seed)
    xs = [x.to(DEVICE).requires_grad_() for x in wide_range_log_inputs(2, T, 5, gen)]
    assert xs[0].max() > 89 and xs[0].min() < -89 or T < 13  # exp() of them overflows / underflows fp32
    ref_in = [x.detach().double().cpu().requires_grad_() for x in xs]
    h, ref = scankit.parallel_scan_log(*xs), oracle("parallel_scan_log", ref_in)
    torch.testing.assert_close(h.detach().cpu().double(), ref.detach(), atol=0, rtol=2e-5)
    w = torch.randn(ref.shape, dtype=torch.float64, generator=gen)
    grads = torch.autograd.grad((h.log() * w.to(h)).sum(), xs)
    ref_grads = torch.autograd.grad((ref.log() * w).sum(), ref_in)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g.cpu().double(), r, atol=2e-5 * r.abs().max().item(), rtol=1e-4)
    assert launches


@pytest.mark.parametrize("T", [13, 150])
def test_log_op_states_past_fp32_come_back(T, seed, launches):
    """States that leave fp32's range (e^100: inf as fp32 values, e^-100: 0) and return:
    inf and 0 where the float64 oracle is out of fp32's range, accurate everywhere else."""
    gen = torch.Generator().manual_seed(seed)
    log_coeffs, log_values = (x.to(DEVICE) for x in wide_range_log_inputs(2, T, 5, gen, spread=100.0))
    h = scankit.parallel_scan_log(log_coeffs, log_values).cpu().double()
    ref = oracle("parallel_scan_log", [log_coeffs.cpu().double(), log_values.cpu().double()])
    big, small = ref > torch.finfo(torch.float32).max, ref < torch.finfo(torch.float32).tiny
    assert big.any() and small.any() and (~big & ~small).any() or T < 150
    assert torch.isinf(h[big]).all() and (h[small] <= torch.finfo(torch.float32).tiny).all()
    torch.testing.assert_close(h[~big & ~small], ref[~big & ~small], atol=0, rtol=2e-5)
    assert launches


def test_log_op_zero_states(seed, launches):
    """h_0 = 0 (log h_0 = -inf) and inputs b = 0 (log b = -inf), a whole column of them too:
    exact zeros where the oracle has them, finite grads that match it."""
    gen = torch.Generator().manual_seed(seed)
    B, T, D = 2, 40, 5
    log_coeffs = torch.empty(B, T, D).uniform_(math.log(0.5), 0.0, generator=gen)
    log_values = torch.randn(B, T + 1, D, generator=gen)
    log_values[:, 0] = float("-inf")
    log_values[:, 1:6] = float("-inf")
    log_values[:, :, 2] = float("-inf")  # column 2 stays 0
    xs = [log_coeffs.to(DEVICE).requires_grad_(), log_values.to(DEVICE).requires_grad_()]
    ref_in = [x.detach().double().cpu().requires_grad_() for x in xs]
    h, ref = scankit.parallel_scan_log(*xs), oracle("parallel_scan_log", ref_in)
    assert (h[:, :5] == 0).all() and (h[:, :, 2] == 0).all()
    torch.testing.assert_close(h.detach().cpu().double(), ref.detach(), atol=0, rtol=1e-5)
    w = torch.randn(ref.shape, dtype=torch.float64, generator=gen)
    grads = torch.autograd.grad((h * w.to(h)).sum(), xs)
    ref_grads = torch.autograd.grad((ref * w).sum(), ref_in)
    for g, r in zip(grads, ref_grads):
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g.cpu().double(), torch.nan_to_num(r, nan=0.0), atol=1e-5, rtol=1e-4)
    assert launches


@pytest.mark.parametrize("dtype,tol", [(torch.float16, 5e-3)] + ([(torch.bfloat16, 3e-2)] if DEVICE == "cuda" else []))
@pytest.mark.parametrize("op_name,dims", [("parallel_scan_log", dict(B=2, D=5)), ("linear_scan", dict(B=2, D=5)),
                                          ("matrix_scan", dict(B=2, n=3)), ("matrix_affine_scan", dict(B=2, n=2, k=8, v=2))])
def test_half_precision(op_name, dims, dtype, tol, seed, launches):
    """Half inputs accumulate in fp32 and come back in their dtype: error = output rounding."""
    xs = OPS[op_name].inputs(dict(dims, T=40), device=DEVICE, dtype=dtype, seed=seed)
    out, ref = as_tuple(OPS[op_name].fn(*xs)), as_tuple(oracle(op_name, [x.cpu() for x in xs]))
    for o, r in zip(out, ref):
        assert o.dtype == dtype
        torch.testing.assert_close(o.cpu().double(), r, atol=tol, rtol=tol)
    assert launches


OUTSIDE = [
    ("matrix_affine_scan", lambda: OPS["matrix_affine_scan"].inputs(dict(B=2, T=5, n=1, k=17, v=1), device=DEVICE)),
    ("matrix_affine_scan", lambda: OPS["matrix_affine_scan"].inputs(dict(B=2, T=5, n=1, k=2, v=32), device=DEVICE)),
    ("linear_scan", lambda: OPS["linear_scan"].inputs(dict(B=2, T=5, D=3), device=DEVICE, dtype=torch.float64)),
]


@pytest.mark.parametrize("op_name,make", OUTSIDE)
def test_outside_envelope_triton_mode_raises(op_name, make, launches):
    with pytest.raises(RuntimeError, match=f"MINGRU_SCAN=triton but the {op_name} kernel cannot run"):
        OPS[op_name].fn(*make())
    assert not launches


@pytest.mark.parametrize("op_name,make", OUTSIDE)
def test_outside_envelope_kernel_signals_fallback(op_name, make):
    import scankit.triton as kernels

    with pytest.raises(scankit.ScanFallback):
        getattr(kernels, op_name)(*make())


@gpu
@pytest.mark.parametrize("op_name,make", OUTSIDE)
def test_outside_envelope_auto_warns_once_and_runs_eager(op_name, make, monkeypatch):
    from scankit import dispatch

    monkeypatch.setenv("MINGRU_SCAN", "auto")
    monkeypatch.setattr(dispatch, "_warned", set())
    xs = make()
    with pytest.warns(RuntimeWarning, match="falls back to the eager reference"):
        out = OPS[op_name].fn(*xs)
    for o, r in zip(as_tuple(out), as_tuple(oracle(op_name, [x.cpu() for x in xs]))):
        torch.testing.assert_close(o.cpu().double(), r, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("op_name", list(OPS))
def test_eager_calls_launch_triton_directly(op_name, monkeypatch):
    """Outside torch.compile every launch is an eager call's (``common.direct``): no custom-op
    dispatch (whose layers cost ~0.25 ms of host time per call on the GPU) and the shared
    look-back status buffer."""
    from scankit.triton import common

    paths = []
    launch = common.launch

    def recording(kernel, grid, *args, **meta):
        paths.append(getattr(common._launching, "direct", False))
        return launch(kernel, grid, *args, **meta)

    monkeypatch.setenv("MINGRU_SCAN", "triton")
    monkeypatch.setattr(common, "launch", recording)
    xs = [x.requires_grad_() for x in OPS[op_name].inputs(dict(OPS_SMALL[op_name], T=9), device=DEVICE)]
    out = OPS[op_name].fn(*xs)
    torch.autograd.grad(sum(o.float().sum() for o in as_tuple(out)), xs)
    assert paths and all(paths), paths


@pytest.fixture
def two_by_two(monkeypatch):
    """The 2x2 kernels switched on at every T (the default from T = 256 on a GPU)."""
    from scankit.triton import affine

    monkeypatch.setitem(affine.TWO_BY_TWO, "enabled", True)
    monkeypatch.setitem(affine.TWO_BY_TWO, "min_t", 0)


@pytest.mark.parametrize("T", [1, 13, 40])
@pytest.mark.parametrize("with_prefix", [True, False])
def test_matrix_scan_generic_kernels(T, with_prefix, seed, monkeypatch, launches):
    """matrix_scan through the generic block kernels (the 2x2 ones switched off)."""
    from scankit.triton import affine

    monkeypatch.setitem(affine.TWO_BY_TWO, "enabled", False)
    xs = OPS["matrix_scan"].inputs(dict(B=2, n=3, T=T), device=DEVICE, seed=seed)
    if with_prefix:
        check("matrix_scan", xs, 1e-5, 1e-5, 1e-4, 1e-5, launches)
    else:
        check_states("matrix_scan", xs, (2, 3, 2))
    assert {"_fwd_kernel", "_bwd_kernel"} <= set(launches) and not {"_fwd2_kernel", "_bwd2_kernel"} & set(launches)


@pytest.mark.parametrize("T", [1, 13, 40])
@pytest.mark.parametrize("op_name,dims", [("matrix_scan", dict(B=2, n=3)), ("matrix_scan", dict(B=1, n=9)),
                                          ("matrix_affine_scan", dict(B=2, n=2, k=2, v=1))])
def test_two_by_two_forward(op_name, dims, T, seed, two_by_two, launches):
    xs = OPS[op_name].inputs(dict(dims, T=T), device=DEVICE, seed=seed)
    check(op_name, xs, 1e-5, 1e-5, 1e-4, 1e-5, launches)
    assert "_bwd2_kernel" in launches and "_bwd_kernel" not in launches, launches
    launches.clear()
    with torch.no_grad():
        OPS[op_name].fn(*xs)
    assert set(launches) == {"_fwd2_kernel"}, launches  # the whole forward, carries included


@pytest.mark.parametrize("with_h0", [False, True])
def test_two_by_two_state_only_with_h0_and_strided_inputs(with_h0, seed, two_by_two, launches):
    xs = OPS["matrix_scan"].inputs(dict(B=2, n=3, T=40), device=DEVICE, seed=seed)
    check_states("matrix_scan", xs, (2, 3, 2) if with_h0 else None, strided=True)
    assert {"_fwd2_kernel", "_bwd2_kernel"} <= set(launches), launches


@pytest.mark.parametrize("T", [1, 13, 40])
@pytest.mark.parametrize("k,v", [(4, 1), (4, 2), (4, 16), (8, 1), (8, 2)])
def test_lane_blocks(k, v, T, seed, launches, monkeypatch):
    """k x k backwards whose lane values fit (``affine.LANE_BLOCKS``) run in lane blocks, T chunked
    into several summaries at T = 40 (the interpreter's geometry); k = 4, v = 16 and k = 8 with
    the running product's grad do not fit (generic). k = 8 runs in lanes only with "max_k"
    raised (production keeps it generic: slower). Every forward runs in the generic kernels."""
    from scankit.triton import affine

    monkeypatch.setitem(affine.LANE_BLOCKS, "max_k", max(k, affine.LANE_BLOCKS["max_k"]))
    xs = OPS["matrix_affine_scan"].inputs(dict(B=2, n=3, k=k, v=v, T=T), device=DEVICE, seed=seed)
    check("matrix_affine_scan", xs, 1e-5, 1e-5, 1e-4, 1e-5, launches)
    backward = "_bwdk_kernel" if affine._lane_blocks(xs[0], v, True) else "_bwd_kernel"
    assert {"_fwd_kernel", backward} <= set(launches), launches
    assert (k, v) not in ((4, 1), (4, 2)) or backward == "_bwdk_kernel"
    launches.clear()
    check_states("matrix_affine_scan", xs, (2, 3, k, v), strided=True)
    backward = "_bwdk_kernel" if affine._lane_blocks(xs[0], v, False) else "_bwd_kernel"
    assert {"_fwd_kernel", backward} <= set(launches), launches
    assert (k, v) != (8, 1) or backward == "_bwdk_kernel"  # the states-only k = 8 (GivensMinGRU's blocks)


@pytest.mark.parametrize("k,v", [(4, 1), (16, 1), (8, 16), (8, 1)])
def test_lane_blocks_production_bounds(k, v, seed, launches):
    """Production's choice (``affine.LANE_BLOCKS``): k = 4's backward in lane blocks; past "max_k"
    or "max_values", the generic kernels; every forward generic. Against the oracle."""
    xs = OPS["matrix_affine_scan"].inputs(dict(B=1, n=2, k=k, v=v, T=13), device=DEVICE, seed=seed)
    check_states("matrix_affine_scan", xs, (1, 2, k, v))
    backward = "_bwdk_kernel" if k == 4 else "_bwd_kernel"
    assert {"_fwd_kernel", backward} <= set(launches), launches
    assert {"_bwd_kernel", "_bwdk_kernel"} - {backward} & set(launches) == set(), launches


def _relaid(x, layout):
    """x's values in another memory layout: "contiguous"; "blocks transposed" (each 2x2 block
    column-major); "padded" (one unused element after each block); "offset by 1" (a view 1
    element into its storage)."""
    if layout == "blocks transposed":  # 2x2 blocks only
        return x.transpose(-1, -2).contiguous().transpose(-1, -2)
    if layout == "padded":
        wide = torch.zeros(*x.shape[:-1], x.shape[-1] + 1, dtype=x.dtype, device=x.device)
        wide[..., :x.shape[-1]] = x
        return wide[..., :x.shape[-1]]
    if layout == "offset by 1":
        flat = torch.zeros(x.numel() + 1, dtype=x.dtype, device=x.device)
        flat[1:] = x.reshape(-1)
        return flat[1:].view(x.shape)
    return x.contiguous()


@pytest.mark.parametrize("layout", ["contiguous", "blocks transposed", "padded", "offset by 1"])
def test_two_by_two_blocks_in_any_layout(layout, seed, two_by_two, monkeypatch):
    """The 2x2 kernels read each lane's block with one wide load where the blocks are
    row-major contiguous with aligned rows (VEC), element by element otherwise: values and
    grads against the float64 loop either way, and VEC exactly where the layout allows it."""
    from conftest import record_launches

    seen = record_launches(monkeypatch, lambda name, meta: (name, meta.get("VEC")))
    M, x = OPS["matrix_scan"].inputs(dict(B=2, n=3, T=13), device=DEVICE, seed=seed)
    M = _relaid(M, layout)
    x = _relaid(x, layout) if layout != "blocks transposed" else x
    if layout == "blocks transposed":
        assert M.stride()[-2:] == (1, 2)
    check("matrix_scan", [M, x], 1e-5, 1e-5, 1e-4, 1e-5, seen)
    vec = {v for name, v in seen if name in ("_fwd2_kernel", "_bwd2_kernel")}
    assert vec == {layout == "contiguous"}, seen


@pytest.mark.parametrize("T", [1, 13, 150])
@pytest.mark.parametrize("op_name,dims", [("linear_scan", dict(B=1, D=33)), ("linear_scan_state", dict(B=2, D=5))])
def test_lookback_kernels(op_name, dims, T, seed, lookback, launches):
    xs = OPS[op_name].inputs(dict(dims, T=T), device=DEVICE, seed=seed)
    check(op_name, xs, 1e-5, 1e-5, 1e-4, 1e-5, launches)
    if lookback == "off":  # the chunked summary passes (CPU: T = 150 is 10 tiles, split)
        assert not {"_fwd_lookback_kernel", "_bwd_lookback_kernel"} & set(launches), launches
        if T == 150 and DEVICE == "cpu":
            assert launches.count("_fwd_kernel") >= 2 and launches.count("_bwd_kernel") >= 2, launches
    elif lookback == "always" or (T == 150 and DEVICE == "cpu"):  # "chunked": where T is split
        assert {"_fwd_lookback_kernel", "_bwd_lookback_kernel"} <= set(launches), launches
        assert not {"_fwd_kernel", "_bwd_kernel"} & set(launches), launches  # no summary passes


@pytest.mark.parametrize("T", [13, 150])
def test_log_op_runs_chunked_whatever_the_look_back_setting(T, seed, lookback, launches):
    """The log op carries its state in log space: a summary pass, then the main pass, whose
    programs fold the summaries before them into their carry-in (its backward's fold is a
    linear one), whatever the linear op's look-back setting."""
    xs = OPS["parallel_scan_log"].inputs(dict(B=2, D=5, T=T), device=DEVICE, seed=seed)
    check("parallel_scan_log", xs, 1e-5, 1e-5, 1e-4, 1e-5, launches)
    assert "_log_bwd_kernel" in launches and "_bwd_lookback_kernel" not in launches, launches
    launches.clear()
    with torch.no_grad():
        OPS["parallel_scan_log"].fn(*xs)
    from scankit.triton import elementwise

    split = elementwise._geometry(xs[0], True, "fwd")[4] > 1  # chunked: summary pass, main pass
    assert launches == ["_log_fwd_kernel"] * (2 if split else 1), launches
    assert split or T == 13 or DEVICE == "cuda"  # the interpreter's 4 programs split T = 150


@pytest.mark.parametrize("with_h0", [False, True])
def test_lookback_state_only_with_h0_and_strided_inputs(with_h0, seed, lookback, launches):
    xs = OPS["linear_scan"].inputs(dict(B=2, D=7, T=70), device=DEVICE, seed=seed)
    check_states("linear_scan", xs, (2, 7) if with_h0 else None, strided=True)
    if lookback == "always":  # "chunked": a GPU walks 70 rows in one chunk
        assert "_fwd_lookback_kernel" in launches
    elif lookback == "off":
        assert "_fwd_lookback_kernel" not in launches


def test_lookback_status_words_are_reused_across_calls(seed, launches, monkeypatch):
    """Back-to-back look-back calls of different sizes share one status buffer (no memset per
    call): each call's words carry its epoch, so the words an earlier or larger call left
    never pass for a predecessor's (on a GPU a tile reads them before its predecessor
    publishes). Every call against the oracle; the ticket word after each: count 0, the next
    epoch; at EPOCHS calls the host zeroes the buffer and the epochs start over."""
    from scankit.triton import common

    monkeypatch.setitem(common.LOOKBACK, "linear", "always")
    monkeypatch.setattr(common, "EPOCHS", 4)
    monkeypatch.setattr(common, "_STATUS", {})
    sizes = [dict(B=2, D=40, T=300), dict(B=1, D=5, T=13), dict(B=3, D=9, T=150), dict(B=1, D=33, T=257)] * 2
    first_round = None
    for i, dims in enumerate(sizes):
        xs = OPS["linear_scan"].inputs(dims, device=DEVICE, seed=seed + i)
        check("linear_scan", xs, 1e-5, 1e-5, 1e-4, 1e-5, launches)  # a forward and a backward
        (buf, calls), = common._STATUS.values()  # calls: since the buffer was made (it grows, zeroed)
        assert buf[0].item() == ((calls % 4) << 32), (i, calls, hex(buf[0].item()))  # count 0, epoch calls mod 4
        first_round = first_round or (buf.data_ptr() if i == 3 else None)
    assert buf.data_ptr() == first_round, "the second round reuses the first round's buffer"
    assert calls > 4, "the epochs came round: the host zeroed the buffer"
    assert launches.count("_fwd_lookback_kernel") == len(sizes) == launches.count("_bwd_lookback_kernel")


def test_captured_and_traced_lookback_calls_get_their_own_zeroed_words(monkeypatch):
    """Outside the direct (eager) path, a look-back call's words are its own, zeroed: a CUDA
    graph replays its fill, and a trace never holds the shared buffer."""
    from scankit.triton import common

    monkeypatch.setattr(common, "_STATUS", {})
    words = common.status_words(torch.device("cpu"), 10)
    assert words.shape == (11,) and not words.any() and common._STATUS == {}
    with common.direct():
        shared = common.status_words(torch.device("cpu"), 10)
        assert common.status_words(torch.device("cpu"), 4).data_ptr() == shared.data_ptr()
        assert common.status_words(torch.device("cpu"), 100).numel() == 101  # grown, zeroed


@pytest.mark.parametrize("T", [1, 13, 150, 257])
@pytest.mark.parametrize("layout", ["contiguous", "time-major", "broadcast-h0"])
def test_log_op_with_log_h0_apart(T, layout, seed, launches):
    """``parallel_scan_log(log_coeffs, log_values, log_h0=)`` (values (B, T, D), h_0 apart)
    against the float64 loop over the concatenated slot form, grads of all three included:
    the kernels read h_0 and write its grad apart instead of slot 0 (chunked at T = 150, 257
    on the CPU, B = 1 there), with strided inputs and a broadcast (stride-0) log_h0."""
    B, D = (1, 7) if T > 100 else (3, 5)
    g = torch.Generator().manual_seed(seed)
    lc = -torch.rand(B, T, D, generator=g) * 2
    lv = torch.randn(B, T, D, generator=g)
    lh0 = torch.randn(1 if layout == "broadcast-h0" else B, D, generator=g).expand(B, D)
    if layout == "time-major":
        lc, lv = (x.transpose(0, 1).contiguous().transpose(0, 1) for x in (lc, lv))
    xs = [x.to(DEVICE).requires_grad_() for x in (lc, lv)]
    h0 = lh0.to(DEVICE) if layout == "broadcast-h0" else lh0.to(DEVICE).requires_grad_()
    ref_in = [x.detach().double().requires_grad_() for x in (lc, lv, lh0)]
    h = scankit.parallel_scan_log(*xs, log_h0=h0)
    ref = oracle("parallel_scan_log", [ref_in[0], torch.cat([ref_in[2].unsqueeze(1), ref_in[1]], dim=1)])
    assert launches and "_log_fwd_kernel" in launches
    torch.testing.assert_close(h.detach().cpu().double(), ref.detach(), atol=1e-5, rtol=1e-5)
    w = torch.randn(ref.shape, dtype=torch.float64, generator=g)
    leaves = xs + ([h0] if h0.requires_grad else [])
    grads = torch.autograd.grad((h * w.to(h)).sum(), leaves)
    ref_grads = torch.autograd.grad((ref * w).sum(), ref_in[:len(leaves)])
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got.cpu().double(), want, atol=1e-4, rtol=1e-5)
    # the same numbers as the slot-0 form, and no concatenation here
    slot = scankit.parallel_scan_log(xs[0].detach(), torch.cat([h0.detach().unsqueeze(1), xs[1].detach()], dim=1))
    torch.testing.assert_close(h.detach(), slot, atol=0, rtol=0)


def _reverse_check(op_name, xs, h0, out, atol=1e-5, grad_atol=1e-4):
    """A reversed call's states (and prefix) and input grads against the float64 loop run backwards."""
    from oracles import affine_loop, log_loop

    leaves = [x for x in (*xs, h0) if x is not None]
    ref_leaves = [x.detach().double().cpu().requires_grad_() for x in leaves]
    ref_h0 = ref_leaves[-1] if h0 is not None else None
    if op_name == "parallel_scan_log":
        ref = (log_loop(ref_leaves[0], torch.cat([ref_h0.unsqueeze(1), ref_leaves[1]], dim=1), reverse=True),)
    else:
        A, Bc, h = affine_loop(ref_leaves[0], ref_leaves[1], h0=ref_h0, elementwise=True, reverse=True)
        ref = (A, Bc) if h0 is None else (h,)
    out = as_tuple(out)
    for o, r in zip(out, ref):
        torch.testing.assert_close(o.detach().cpu().double(), r.detach(), atol=atol, rtol=1e-5)
    w = [torch.randn(r.shape, dtype=torch.float64) for r in ref]
    grads = torch.autograd.grad(sum((o * x.to(o)).sum() for o, x in zip(out, w)), leaves)
    ref_grads = torch.autograd.grad(sum((r * x).sum() for r, x in zip(ref, w)), ref_leaves)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g.cpu().double(), r, atol=grad_atol, rtol=1e-5)


@pytest.mark.parametrize("T", [1, 13, 150])
@pytest.mark.parametrize("form", ["prefix", "states"])
def test_reverse_walks_time_backwards_in_the_kernels(form, T, seed, lookback, launches):
    """reverse=True in the elementwise kernels on every path (one pass, chunked summaries,
    look-back; strided inputs): against the backwards float64 loop, grads included, and no
    copy of the inputs or outputs (only the scan's own kernels launch)."""
    g = torch.Generator().manual_seed(seed)
    a = (torch.rand(2, T, 33, generator=g) * 0.5 + 0.5).transpose(0, 1).contiguous().transpose(0, 1)
    b = torch.rand(2, T, 33, generator=g) - 0.5
    xs = [x.to(DEVICE).requires_grad_() for x in (a, b)]
    h0 = (torch.rand(2, 33, generator=g) - 0.5).to(DEVICE).requires_grad_() if form == "states" else None
    out = scankit.linear_scan(*xs, h0=h0, return_prefix=form == "prefix", reverse=True)
    _reverse_check("linear_scan", xs, h0, out)
    assert set(launches) <= {"_fwd_kernel", "_bwd_kernel", "_fwd_lookback_kernel", "_bwd_lookback_kernel"}, launches


@pytest.mark.parametrize("T", [1, 13, 150])
def test_reverse_log_op_in_the_kernels(T, seed, lookback, launches):
    g = torch.Generator().manual_seed(seed)
    lc, lv, lh0 = (-torch.rand(2, T, 5, generator=g) * 2, torch.randn(2, T, 5, generator=g),
                   torch.randn(2, 5, generator=g))
    xs = [x.to(DEVICE).requires_grad_() for x in (lc, lv)]
    lh0 = lh0.to(DEVICE).requires_grad_()
    _reverse_check("parallel_scan_log", xs, lh0, scankit.parallel_scan_log(*xs, log_h0=lh0, reverse=True))
    assert set(launches) <= {"_log_fwd_kernel", "_log_bwd_kernel"}, launches


@pytest.mark.parametrize("T", [13, 150])
def test_reverse_log_op_beyond_fp32_exp_range(T, seed, launches):
    """The row-by-row log-space redo (growing coefficients, e^+-120) walking time backwards:
    equal to the forward kernels on the time-reversed inputs (themselves checked against the
    float64 loop in test_log_op_beyond_fp32_exp_range), values and grads."""
    gen = torch.Generator().manual_seed(seed)
    lc, lv = wide_range_log_inputs(2, T, 5, gen)
    # reversed in time, these are the same extremes: scan them from the end
    xs = [lc.flip(1).to(DEVICE).requires_grad_(), lv[:, 1:].flip(1).to(DEVICE).requires_grad_()]
    lh0 = lv[:, 0].to(DEVICE).requires_grad_()
    h = scankit.parallel_scan_log(*xs, log_h0=lh0, reverse=True)
    want = scankit.parallel_scan_log(lc.to(DEVICE), lv.to(DEVICE)).flip(1)
    torch.testing.assert_close(h.detach(), want, atol=0, rtol=2e-5)
    w = torch.randn(h.shape, generator=gen).to(DEVICE)
    got = torch.autograd.grad((h.log() * w).sum(), [*xs, lh0])
    fwd_in = [lc.to(DEVICE).requires_grad_(), lv.to(DEVICE).requires_grad_()]
    ref = torch.autograd.grad((scankit.parallel_scan_log(*fwd_in).flip(1).log() * w).sum(), fwd_in)
    torch.testing.assert_close(got[0], ref[0].flip(1), atol=2e-5 * ref[0].abs().max().item(), rtol=1e-4)
    torch.testing.assert_close(got[1], ref[1][:, 1:].flip(1), atol=2e-5 * ref[1].abs().max().item(), rtol=1e-4)
    torch.testing.assert_close(got[2], ref[1][:, 0], atol=2e-5 * ref[1].abs().max().item(), rtol=1e-4)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("op_name", ["linear_scan_state", "parallel_scan_log"])
def test_packed_resets_in_the_kernels(op_name, reverse, seed, lookback, launches):
    """cu_seqlens on the elementwise kernels, every look-back setting: the kernels restart their
    carry at each sequence's first step (int8 flags, no copy of the coefficients), forward and
    backward, against the float64 loop over each sequence alone."""
    from test_packed import _per_sequence

    g = torch.Generator().manual_seed(seed)
    sizes = [1, 70, 2, 77]  # 150 steps: chunked / look-back on the interpreter's 4 programs
    T = sum(sizes)
    cu = torch.tensor([0, 1, 71, 73, 150], device=DEVICE)
    if op_name == "parallel_scan_log":
        xs = [-torch.rand(1, T, 5, generator=g) * 2, torch.randn(1, T, 5, generator=g)]
        h0 = torch.randn(4, 5, generator=g)
    else:
        xs = [torch.rand(1, T, 5, generator=g) * 0.5 + 0.5, torch.rand(1, T, 5, generator=g) - 0.5]
        h0 = torch.rand(4, 5, generator=g) - 0.5
    leaves = [x.to(DEVICE).requires_grad_() for x in (*xs, h0)]
    if op_name == "parallel_scan_log":
        h = scankit.parallel_scan_log(*leaves[:2], log_h0=leaves[2], cu_seqlens=cu, reverse=reverse)
    else:
        h = scankit.linear_scan(*leaves[:2], h0=leaves[2], return_prefix=False, cu_seqlens=cu, reverse=reverse)
    ref_leaves = [x.detach().double().cpu().requires_grad_() for x in leaves]
    ref = _per_sequence("linear_scan" if op_name == "linear_scan_state" else op_name, ref_leaves[:2], ref_leaves[2],
                        sizes, reverse)
    torch.testing.assert_close(h.detach().cpu().double(), ref.detach(), atol=1e-5, rtol=1e-5)
    w = torch.randn(ref.shape, dtype=torch.float64, generator=g)
    for got, want in zip(torch.autograd.grad((h * w.to(h)).sum(), leaves), torch.autograd.grad((ref * w).sum(), ref_leaves)):
        torch.testing.assert_close(got.cpu().double(), want, atol=1e-4, rtol=1e-5)
    scans = {"_fwd_kernel", "_bwd_kernel", "_fwd_lookback_kernel", "_bwd_lookback_kernel", "_log_fwd_kernel",
             "_log_bwd_kernel"}
    assert launches and set(launches) <= scans, launches


@pytest.mark.parametrize("reverse", [False, True])
def test_packed_log_op_beyond_fp32_exp_range(reverse, seed, launches):
    """Packed sequences through the log op's row-by-row log-space redo (growing coefficients,
    e^+-120): each sequence started from the dense trajectory's state there gives the dense
    call's states (test_log_op_beyond_fp32_exp_range checks those against the float64 loop),
    and the grads of a loss on log h equal each sequence's own call's."""
    gen = torch.Generator().manual_seed(seed)
    lc, lv = (x.to(DEVICE) for x in wide_range_log_inputs(1, 150, 5, gen))
    if reverse:  # the same trajectory, scanned from the end
        lc, lv = lc.flip(1), torch.cat([lv[:, :1], lv[:, 1:].flip(1)], dim=1)
    dense = scankit.parallel_scan_log(lc, lv[:, 1:], log_h0=lv[:, 0], reverse=reverse)
    sizes = [40, 1, 109]
    bounds = [0, 40, 41, 150]
    # each sequence's initial state: the dense state just before it (in scan order)
    firsts = [e for e in bounds[1:]] if reverse else bounds[:-1]
    lh0 = torch.stack([lv[0, 0] if (f == 150 if reverse else f == 0) else dense[0, f if reverse else f - 1].log()
                       for f in firsts])
    cu = torch.tensor(bounds, device=DEVICE)
    leaves = [x.detach().clone().requires_grad_() for x in (lc, lv[:, 1:], lh0)]
    h = scankit.parallel_scan_log(*leaves[:2], log_h0=leaves[2], cu_seqlens=cu, reverse=reverse)
    torch.testing.assert_close(h, dense, atol=0, rtol=2e-5)
    own = [x.detach().clone().requires_grad_() for x in (lc, lv[:, 1:], lh0)]
    want = torch.cat([scankit.parallel_scan_log(own[0][:, a:b], own[1][:, a:b], log_h0=own[2][n:n + 1], reverse=reverse)
                      for n, (a, b) in enumerate(zip(bounds, bounds[1:]))], dim=1)
    w = torch.randn(h.shape, generator=gen).to(DEVICE)
    for got, ref in zip(torch.autograd.grad((h.log() * w).sum(), leaves),
                        torch.autograd.grad((want.log() * w).sum(), own)):
        torch.testing.assert_close(got, ref, atol=2e-5 * ref.abs().max().item(), rtol=1e-4)
    assert sizes == [b - a for a, b in zip(bounds, bounds[1:])]
