"""Kernel launches per call, glue included (tests/launches.py), against issue 15's budget: at
most 2 per forward and 3 per forward + backward, for every op and form, in both shape classes
of the kernels: "wide" (the (batch x tiles) programs fill the device: one pass) and "narrow"
(B = 1, one tile across, long T: the T-chunked or look-back path). In the interpreter the
device is "filled" at 4 programs (common.target_programs), so these small shapes take the
paths the H200 takes at lab/large and longT/vlong. The paths over budget today are strict
xfails: when one comes within budget its xfail fails, and the entry goes."""
import pytest
import torch

from benchmarks.harness.cases import OPS
from benchmarks.harness.launches import Launches

FWD_BUDGET, FWDBWD_BUDGET = 2, 3
DIMS = {  # shape class -> op -> dims
    "wide": {"parallel_scan_log": dict(B=4, T=13, D=64), "linear_scan": dict(B=4, T=13, D=64),
             "linear_scan_state": dict(B=4, T=13, D=64), "matrix_scan": dict(B=4, T=13, n=16),
             "matrix_affine_scan": dict(B=4, T=13, n=4, k=4, v=2)},
    "narrow": {"parallel_scan_log": dict(B=1, T=67, D=32), "linear_scan": dict(B=1, T=67, D=32),
               "linear_scan_state": dict(B=1, T=67, D=32), "matrix_scan": dict(B=1, T=67, n=2),
               "matrix_affine_scan": dict(B=1, T=67, n=1, k=4, v=2)},
}
# (op, class, direction): what is over budget today (counted in session 8: kernels + glue)
OVER = {
    ("parallel_scan_log", "narrow", "fwdbwd"): "a summary and a main pass each way: 4 kernels",
    ("matrix_scan", "narrow", "fwdbwd"): "a summary and a main pass each way: 4 kernels",
    ("matrix_affine_scan", "narrow", "fwdbwd"): "a summary and a main pass each way: 4 kernels",
}
CASES = [pytest.param(op, shape_class, direction, marks=pytest.mark.xfail(
             (op, shape_class, direction) in OVER, reason=f"issue 15: {OVER.get((op, shape_class, direction))}",
             strict=True))
         for shape_class in DIMS for op in OPS for direction in ("fwd", "fwdbwd")]


def _outputs(out):
    return out if isinstance(out, tuple) else (out,)


@pytest.mark.parametrize("op_name,shape_class,direction", CASES)
@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's shape classes (a GPU fills at ~4 programs per SM)")
def test_launches_per_call_within_budget(op_name, shape_class, direction, monkeypatch, seed):
    monkeypatch.setenv("MINGRU_SCAN", "triton")
    device = "cpu"
    op = OPS[op_name]
    xs = op.inputs(DIMS[shape_class][op_name], device=device, seed=seed, requires_grad=direction == "fwdbwd")
    # one call first, outside the count, as a training step's earlier steps are: it makes the
    # cotangents, and the look-back kernels' status buffer (once per process and stream)
    outs = _outputs(op.fn(*xs))
    grads = [torch.randn_like(o) for o in outs]
    if direction == "fwdbwd":
        torch.autograd.backward(outs, grads)
        for x in xs:  # a fresh step's leaves: no accumulation into .grad (an add_) in the count
            if isinstance(x, torch.Tensor):
                x.grad = None
    with Launches() as counted:
        if direction == "fwd":
            with torch.no_grad():
                op.fn(*xs)
        else:
            torch.autograd.backward(_outputs(op.fn(*xs)), grads)
    assert counted.kernels, "no Triton kernel launched: the call fell back to eager"
    budget = FWD_BUDGET if direction == "fwd" else FWDBWD_BUDGET
    assert counted.total <= budget, f"{counted.total} launches > {budget}: kernels {counted.kernels}, glue {counted.glue}"


def test_the_counter_sees_glue_and_kernels(monkeypatch):
    """The instrument itself: a cat, a flip and a fill count; views and allocations do not."""
    x = torch.randn(3, 4)
    with Launches() as counted:
        y = torch.empty(3, 4)
        x.view(4, 3).t()
        torch.cat([x, y]).flip(0)
        torch.zeros(2)
    assert counted.kernels == [] and len(counted.glue) == 3, counted.glue



def _counted_step(call, xs, grads, **kwargs):
    for x in xs:  # a fresh step's leaves: no accumulation into .grad (an add_) in the count
        x.grad = None
    with Launches() as counted:
        torch.autograd.backward(_outputs(call(*xs, **kwargs)), grads)
    return counted


@pytest.mark.parametrize("shape_class", list(DIMS))
@pytest.mark.parametrize("op_name", list(OPS))
@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's shape classes (a GPU fills at ~4 programs per SM)")
def test_a_reversed_call_launches_what_the_dense_call_does(op_name, shape_class, monkeypatch, seed):
    """reverse=True walks time backwards inside the kernels: the same kernels and glue as the
    dense call, no flip copies, forward and backward (issue 18); the log op in its slot-0 form
    (log h_0 read in place as the scan from the end's initial state)."""
    monkeypatch.setenv("MINGRU_SCAN", "triton")
    op = OPS[op_name]
    xs = op.inputs(DIMS[shape_class][op_name], device="cpu", seed=seed, requires_grad=True)
    call = op.fn
    grads = [torch.randn_like(o) for o in _outputs(call(*xs))]
    for kwargs in ({}, dict(reverse=True)):  # warm: cotangents, status buffers
        torch.autograd.backward(_outputs(call(*xs, **kwargs)), grads)
    dense, reverse = _counted_step(call, xs, grads), _counted_step(call, xs, grads, reverse=True)
    assert dense.kernels and sorted(reverse.kernels) == sorted(dense.kernels), (dense.kernels, reverse.kernels)
    assert sorted(reverse.glue) == sorted(dense.glue), (dense.glue, reverse.glue)
