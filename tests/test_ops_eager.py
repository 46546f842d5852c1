"""The four ops (eager) against the sequential float64 oracles."""
import pytest
import torch

import scankit
from benchmarks.harness.cases import OPS
from oracles import oracle, states

TS = (1, 2, 13, 64, 100)
SMALL_DIMS = {
    "parallel_scan_log": dict(B=3, D=5),
    "linear_scan": dict(B=3, D=5),
    "linear_scan_state": dict(B=3, D=5),
    "matrix_scan": dict(B=2, n=3),
    "matrix_affine_scan": dict(B=2, n=2, k=3, v=2),
}


def close(out, ref, atol, rtol):
    torch.testing.assert_close(out.double(), ref.double(), atol=atol, rtol=rtol)


def as_tuple(x):
    return x if isinstance(x, tuple) else (x,)


@pytest.mark.parametrize("T", TS)
@pytest.mark.parametrize("op_name", list(OPS))
def test_forward_matches_oracle(op_name, T, seed, scan_mode):
    scan_mode("eager")
    op = OPS[op_name]
    xs = op.inputs(dict(SMALL_DIMS[op_name], T=T), dtype=torch.float64, seed=seed)
    for out, ref in zip(as_tuple(op.fn(*xs)), as_tuple(oracle(op_name, xs))):
        assert out.dtype == torch.float64
        close(out, ref, 1e-10, 1e-10)


@pytest.mark.parametrize("kv", [(1, 1), (2, 5), (5, 3), (16, 1), (7, 7)])
def test_matrix_affine_any_k_v(kv, seed, scan_mode):
    scan_mode("eager")
    k, v = kv
    op = OPS["matrix_affine_scan"]
    xs = op.inputs(dict(B=2, T=13, n=2, k=k, v=v), dtype=torch.float64, seed=seed)
    for out, ref in zip(op.fn(*xs), oracle(op.name, xs)):
        close(out, ref, 1e-10, 1e-10)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2), (torch.float16, 4e-3)])
@pytest.mark.parametrize("op_name", list(OPS))
def test_low_precision_within_tolerance(op_name, dtype, tol, seed, scan_mode):
    """Low-precision inputs accumulate in float32 and return their own dtype: the error
    against float64 on the same (rounded) inputs is the output rounding, bounded by tol."""
    scan_mode("eager")
    op = OPS[op_name]
    xs = op.inputs(dict(SMALL_DIMS[op_name], T=64), dtype=dtype, seed=seed)
    for out, ref in zip(as_tuple(op.fn(*xs)), as_tuple(oracle(op_name, xs))):
        assert out.dtype == dtype
        close(out, ref, tol, tol)


@pytest.mark.parametrize("op_name", list(OPS))
def test_gradcheck(op_name, seed, scan_mode):
    scan_mode("eager")
    op = OPS[op_name]
    for T in (1, 6):
        xs = op.inputs(dict(SMALL_DIMS[op_name], T=T), dtype=torch.float64, seed=seed, requires_grad=True)
        assert torch.autograd.gradcheck(op.fn, xs)


@pytest.mark.parametrize("with_h0", [False, True])
@pytest.mark.parametrize("op_name", ["linear_scan", "matrix_scan", "matrix_affine_scan"])
def test_state_only_form(op_name, with_h0, seed, scan_mode):
    scan_mode("eager")
    op = OPS[op_name]
    xs = op.inputs(dict(SMALL_DIMS[op_name], T=13), dtype=torch.float64, seed=seed)
    h0 = torch.randn(oracle(op_name, xs)[1][:, 0].shape, dtype=torch.float64) if with_h0 else None
    h = op.fn(*xs, h0=h0, return_prefix=False)
    close(h, states(op_name, xs, h0), 1e-10, 1e-10)
    if with_h0:
        h0.requires_grad_(True)
        assert torch.autograd.gradcheck(lambda *z: op.fn(*z[:2], h0=z[2], return_prefix=False),
                                        tuple(x.requires_grad_() for x in xs) + (h0,))


def test_log_op_matches_linear_op_on_positive_inputs(seed, scan_mode):
    """Two different algorithms (log-space Heinsen vs doubling) agree on the same recurrence."""
    scan_mode("eager")
    lc, lv = OPS["parallel_scan_log"].inputs(dict(B=2, T=100, D=4), dtype=torch.float64, seed=seed)
    h = scankit.linear_scan(lc.exp(), lv[:, 1:].exp(), h0=lv[:, 0].exp(), return_prefix=False)
    close(scankit.parallel_scan_log(lc, lv), h, 1e-10, 1e-10)


def test_early_steps_still_matter(scan_mode):
    """The builders' decays stay near 1: h_0 still moves h_T after 100 steps (so an
    off-by-one in the carry cannot hide)."""
    scan_mode("eager")
    op = OPS["linear_scan"]
    a, b = op.inputs(dict(B=2, T=100, D=4), dtype=torch.float64)
    A, _ = op.fn(a, b)
    assert A[:, -1].abs().min() > 1e-6
