"""The call-form cells (benchmarks.bench_scans.CallForms) time the work they name: the
time-last layout gives the dense call's states, moved; the per-sequence loop gives the packed
call's; every form's workload runs forward and backward."""
import pytest
import torch

from benchmarks.harness import grid, suite


@pytest.mark.parametrize("op", grid.FORM_OPS)
def test_call_form_workloads_compute_the_same_states(op, scan_mode):
    scan_mode("triton")
    dims = suite._form_dims(op, "cpu")
    state = lambda form: suite._form_workload(op, form, "fwd", dims, "cpu")()  # noqa: E731
    dense, packed, looped = state("dense"), state("packed"), state("looped")
    torch.testing.assert_close(state("time_last").movedim(2, 1), dense, rtol=1e-5, atol=1e-6)
    assert len(looped) == len(suite.packed_lengths(dims["T"], 3))
    torch.testing.assert_close(torch.cat(looped, dim=1), packed, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(packed, dense)  # the packed sequences restart: a different computation


@pytest.mark.parametrize("form", grid.FORMS)
def test_every_call_form_runs_forward_and_backward(form, scan_mode):
    scan_mode("triton")
    for op in grid.FORM_OPS:
        grads = suite._form_workload(op, form, "fwdbwd", suite._form_dims(op, "cpu"), "cpu")()
        assert all(g is not None and torch.isfinite(g).all() for g in grads), (op, form)
