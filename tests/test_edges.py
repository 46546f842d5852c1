"""Edges of the input space: empty tensors, T = 1, launch grids, value checks that must
not stop the host."""
import pytest
import torch

import scankit
from benchmarks.harness.cases import OPS

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
gpu = pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA device")
MODES = ["eager", "triton"]
EMPTY = {  # dims with a zero-sized batch or width
    "parallel_scan_log": [dict(B=2, T=5, D=0), dict(B=0, T=5, D=3)],
    "linear_scan": [dict(B=2, T=5, D=0), dict(B=0, T=5, D=3)],
    "linear_scan_state": [dict(B=2, T=5, D=0)],
    "matrix_scan": [dict(B=2, T=5, n=0), dict(B=0, T=300, n=2)],
    "matrix_affine_scan": [dict(B=2, T=5, n=0, k=4, v=2), dict(B=0, T=5, n=1, k=4, v=2)],
}


def as_tuple(x):
    return x if isinstance(x, tuple) else (x,)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", [(op, i) for op in EMPTY for i in range(len(EMPTY[op]))], ids=str)
def test_empty_inputs_give_empty_outputs_and_grads(case, mode, scan_mode):
    op_name, i = case
    scan_mode(mode)
    op = OPS[op_name]
    xs = [x.requires_grad_() for x in op.inputs(EMPTY[op_name][i], device=DEVICE)]
    outs = as_tuple(op.fn(*xs))
    want = as_tuple(op.eager(*[x.detach() for x in xs]))
    assert [o.shape for o in outs] == [w.shape for w in want] and all(o.numel() == 0 for o in outs)
    grads = torch.autograd.grad(sum(o.sum() for o in outs), xs, allow_unused=True)
    assert all(g is None or (g.shape == x.shape and g.numel() == 0) for g, x in zip(grads, xs))


@pytest.mark.parametrize("mode", MODES)
def test_empty_state_only_with_h0(mode, scan_mode):
    scan_mode(mode)
    a, b, h0 = torch.rand(3, 7, 0, device=DEVICE), torch.rand(3, 7, 0, device=DEVICE), torch.rand(3, 0, device=DEVICE)
    h0.requires_grad_()
    h = scankit.linear_scan(a, b, h0=h0, return_prefix=False)
    assert h.shape == (3, 7, 0)
    assert torch.autograd.grad(h.sum(), h0)[0].shape == (3, 0)


@pytest.mark.parametrize("op_name", ["linear_scan", "matrix_scan", "matrix_affine_scan", "parallel_scan_log"])
def test_eager_outputs_never_alias_inputs_at_T1(op_name, scan_mode):
    """T = 1 needs no combining step: the outputs must still be fresh tensors (writing to
    them must not change the inputs)."""
    scan_mode("eager")
    op = OPS[op_name]
    dims = dict(dict(B=2, D=3) if "matrix" not in op_name else dict(B=2, n=2), T=1)
    if op_name == "matrix_affine_scan":
        dims.update(k=2, v=1)
    xs = op.inputs(dims, device=DEVICE)
    before = [x.clone() for x in xs]
    for out in as_tuple(op.fn(*xs)):
        assert not any(out.untyped_storage().data_ptr() == x.untyped_storage().data_ptr() for x in xs)
        out.add_(1.0)
    assert all(torch.equal(x, y) for x, y in zip(xs, before))


def launch_grids(monkeypatch):
    """Run every kernel family fwd+bwd; return [(module.kernel, grid as launched)]."""
    from scankit.triton import common

    grids = []

    def recording(kernel, grid, *args, **meta):
        grids.append((f"{kernel.fn.__module__.rsplit('.', 1)[-1]}.{kernel.fn.__name__}", grid, meta))
        return launch(kernel, grid, *args, **meta)

    launch = common.launch
    monkeypatch.setattr(common, "launch", recording)
    return grids


CASES = [("parallel_scan_log", dict(B=3, T=150, D=40)), ("linear_scan", dict(B=1, T=150, D=5)),
         # matrix_scan: the 2x2 kernels (the GPU takes them from T = 256, the interpreter at any T)
         ("linear_scan_state", dict(B=3, T=40, D=40)), ("matrix_scan", dict(B=3, T=300 if DEVICE == "cuda" else 40, n=20)),
         ("matrix_affine_scan", dict(B=3, T=40, n=5, k=4, v=2)),  # the lane-block backward
         ("matrix_affine_scan", dict(B=3, T=40, n=5, k=8, v=1))]  # the generic block kernels
FAMILIES = {"elementwise._fwd_kernel", "elementwise._log_fwd_kernel", "elementwise._log_bwd_kernel",
            "elementwise._fwd_lookback_kernel", "elementwise._bwd_lookback_kernel", "elementwise._bwd_kernel",
            "affine._fwd_kernel", "affine._bwd2_kernel", "affine._bwdk_kernel", "givens._fwd_kernel", "givens._bwd_kernel",
            "givens._fwd_summary_kernel", "givens._bwd_summary_kernel"}


def run_every_family(seed):
    outs = []
    for op_name, dims in CASES:
        xs = [x.requires_grad_() for x in OPS[op_name].inputs(dims, device=DEVICE, seed=seed)]
        o = as_tuple(OPS[op_name].fn(*xs))
        outs.append((o, torch.autograd.grad(sum(t.sum() for t in o), xs)))
    torch.manual_seed(seed)
    mixer = scankit.GivensMinGRU(5, 16, block_size=8, rounds=2).to(DEVICE)
    h = mixer(torch.randn(3, 1300 if DEVICE == "cuda" else 9, 5, device=DEVICE))  # T-chunked (summary passes)
    outs.append(((h,), torch.autograd.grad(h.sum(), list(mixer.parameters()))))
    return outs


def test_launch_grids_within_cuda_limits(seed, monkeypatch):
    """x below 2^31, y (block tiles) at most 65,535: a 2-D grid past it is folded into x."""
    from scankit.triton import common

    monkeypatch.setenv("MINGRU_SCAN", "triton")
    grids = launch_grids(monkeypatch)
    run_every_family(seed)
    assert FAMILIES <= {name for name, _, _ in grids}, {name for name, _, _ in grids}
    assert all(g[0] < 2**31 and (len(g) == 1 or g[1] <= common.GRID_Y) for _, g, _ in grids), grids


def test_folded_grids_compute_the_same(seed, monkeypatch):
    """Every family with its 2-D grid folded into x (as past 65,535 block tiles): same results."""
    from scankit.triton import common

    monkeypatch.setenv("MINGRU_SCAN", "triton")
    want = run_every_family(seed)
    monkeypatch.setattr(common, "GRID_Y", 1)
    grids = launch_grids(monkeypatch)
    got = run_every_family(seed)
    assert any(len(g) == 2 and g[1] > 1 for _, g, _ in grids)  # grids that were folded
    for (o1, g1), (o2, g2) in zip(want, got):
        for x, y in zip(o1 + g1, o2 + g2):
            torch.testing.assert_close(x, y, rtol=0, atol=0)


@gpu
@pytest.mark.parametrize("op_name", list(OPS))
def test_batch_beyond_the_grid_y_limit(op_name, monkeypatch):
    """B = 70,000 at small T and width (the grid's y and z dimensions stop at 65,535)."""
    monkeypatch.setenv("MINGRU_SCAN", "triton")
    op = OPS[op_name]
    dims = dict(B=70_000, T=3, D=2) if "matrix" not in op_name else dict(B=70_000, T=3, n=1)
    if op_name == "matrix_affine_scan":
        dims.update(k=2, v=1)
    xs = [x.requires_grad_() for x in op.inputs(dims, device=DEVICE)]
    outs = as_tuple(op.fn(*xs))
    grads = torch.autograd.grad(sum(o.sum() for o in outs), xs)
    monkeypatch.setenv("MINGRU_SCAN", "eager")
    ref_in = [x.detach().requires_grad_() for x in xs]
    refs = as_tuple(op.fn(*ref_in))
    for o, r in zip(outs, refs):
        torch.testing.assert_close(o, r, atol=1e-5, rtol=1e-5)
    for g, r in zip(grads, torch.autograd.grad(sum(r.sum() for r in refs), ref_in)):
        torch.testing.assert_close(g, r, atol=1e-4, rtol=1e-4)


def test_mingru_h0_must_be_positive_on_the_cpu():
    m = scankit.MinGRU(4, 6)
    with pytest.raises(ValueError, match="h_0 must be > 0"):
        m(torch.randn(2, 3, 4), h_0=torch.zeros(2, 6))


@gpu
def test_mingru_h0_check_never_synchronises(monkeypatch):
    """On a GPU the positivity check would stop the host for the device at every call: it
    runs only with SCANKIT_CHECK_VALUES=1."""
    m = scankit.MinGRU(4, 6).cuda()
    x, h0 = torch.randn(2, 3, 4, device="cuda"), torch.rand(2, 6, device="cuda") + 0.1
    m(x, h_0=h0)  # warm (the kernels' first call compiles)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        m(x, h_0=h0)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    monkeypatch.setenv("SCANKIT_CHECK_VALUES", "1")
    with pytest.raises(ValueError, match="h_0 must be > 0"):
        m(x, h_0=-h0)


@gpu
def test_step_with_a_number_delta_t_never_synchronises():
    """``step(x_t, h, delta_t=0.5)``: the number is filled on the device, not copied there
    from the host (which waits for the GPU), and equals the tensor form."""
    m = scankit.SignedMinGRU(4, 6, decay=True).cuda()
    x, h = torch.randn(3, 4, device="cuda"), torch.randn(3, 6, device="cuda")
    want = m.step(x, h, delta_t=torch.full((3,), 0.5, device="cuda"))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = m.step(x, h, delta_t=0.5)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.testing.assert_close(got, want)
