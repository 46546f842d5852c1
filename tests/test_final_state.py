"""Final states (``return_final_state=True``; mixers' ``return_state``): h_T against the
float64 loop with its gradient, and chunked prefill: scanning a sequence in pieces, each from
the last piece's h_T, equals one call, for every op (eager and kernels) and every mixer."""
import pytest
import torch

import scankit
from scankit.mixers import MIXERS
from oracles import log_loop, states

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
PIECES = {1: [1], 2: [1, 1], 13: [1, 5, 7], 257: [100, 1, 156]}


def _inputs(op, B, T, g, dtype=torch.float32):
    r = lambda *s: torch.rand(*s, generator=g, dtype=torch.float64).to(dtype)  # noqa: E731
    if op == "linear_scan":
        return (r(B, T, 5) * 0.5 + 0.5, r(B, T, 5) - 0.5), r(B, 5) - 0.5
    if op == "matrix_scan":
        return (r(B, T, 3, 2, 2) * 0.7, r(B, T, 3, 2) - 0.5), r(B, 3, 2)
    if op == "matrix_affine_scan":
        return (r(B, T, 2, 4, 4) * 0.45, r(B, T, 2, 4, 2) - 0.5), r(B, 2, 4, 2)
    return (-r(B, T, 5) * 2, torch.randn(B, T, 5, generator=g, dtype=torch.float64).to(dtype)), torch.randn(
        B, 5, generator=g, dtype=torch.float64).to(dtype)


def _call(op, xs, h0, **kw):
    if op == "parallel_scan_log":
        return scankit.parallel_scan_log(*xs, log_h0=h0, **kw)
    return getattr(scankit, op)(*xs, h0=h0, return_prefix=False, **kw)


def _oracle(op, xs, h0):
    if op == "parallel_scan_log":
        return log_loop(xs[0], torch.cat([h0.unsqueeze(1), xs[1]], dim=1))
    return states(op, list(xs), h0)


OPS_ = ["parallel_scan_log", "linear_scan", "matrix_scan", "matrix_affine_scan"]


# the eager references in float64 (the log op's fp32 reference drifts with T: ops.py), the kernels in fp32
DTYPE = {"eager": torch.float64, "triton": torch.float32}


@pytest.mark.parametrize("T", sorted(PIECES))
@pytest.mark.parametrize("op", OPS_)
def test_final_state_and_its_gradient(op, T, kernel_mode, seed):
    g = torch.Generator().manual_seed(seed)
    xs, h0 = _inputs(op, 2, T, g, DTYPE[kernel_mode])
    leaves = [x.to(DEVICE).requires_grad_() for x in (*xs, h0)]
    h, last = _call(op, leaves[:-1], leaves[-1], return_final_state=True)
    ref_leaves = [x.detach().double().cpu().requires_grad_() for x in leaves]
    ref = _oracle(op, ref_leaves[:-1], ref_leaves[-1])
    assert last.shape == ref[:, -1].shape and last.data_ptr() != h.data_ptr()  # its own tensor
    torch.testing.assert_close(last.detach().cpu().double(), ref[:, -1].detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(h.detach().cpu().double(), ref.detach(), atol=1e-5, rtol=1e-5)
    w, w_last = torch.randn(ref.shape, generator=g, dtype=torch.float64), torch.randn(ref[:, -1].shape, generator=g,
                                                                                       dtype=torch.float64)
    loss = (h * w.to(h)).sum() + (last * w_last.to(last)).sum()   # d(final) and dh0 both reach the inputs
    ref_loss = (ref * w).sum() + (ref[:, -1] * w_last).sum()
    for got, want in zip(torch.autograd.grad(loss, leaves), torch.autograd.grad(ref_loss, ref_leaves)):
        torch.testing.assert_close(got.cpu().double(), want, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("op", OPS_)
def test_prefix_form_final_state_is_the_solution_from_zero(op, kernel_mode, seed):
    if op == "parallel_scan_log":
        pytest.skip("the log op has no prefix form")
    g = torch.Generator().manual_seed(seed)
    xs, _ = _inputs(op, 2, 13, g)
    xs = [x.to(DEVICE) for x in xs]
    A, Bc, last = getattr(scankit, op)(*xs, return_final_state=True)
    torch.testing.assert_close(last, Bc[:, -1], atol=0, rtol=0)
    assert getattr(scankit, op)(*xs, return_final_state=False)[1].shape == Bc.shape


@pytest.mark.parametrize("T", [13, 257])
@pytest.mark.parametrize("op", OPS_)
def test_chunked_prefill_equals_one_call(op, T, kernel_mode, seed):
    g = torch.Generator().manual_seed(seed)
    xs, h0 = _inputs(op, 2, T, g, DTYPE[kernel_mode])
    xs, h0 = [x.to(DEVICE) for x in xs], h0.to(DEVICE)
    whole = _call(op, xs, h0)
    parts, h, t = [], h0, 0
    for n in PIECES[T]:
        piece, h = _call(op, [x[:, t:t + n] for x in xs], h, return_final_state=True)
        if op == "parallel_scan_log":
            h = h.log()
        parts.append(piece)
        t += n
    torch.testing.assert_close(torch.cat(parts, dim=1), whole, atol=1e-5, rtol=1e-5)


MIXER_NAMES = sorted(MIXERS)


@pytest.mark.parametrize("decay", [False, True])
@pytest.mark.parametrize("name", MIXER_NAMES)
def test_mixer_prefill_in_pieces_then_step(name, decay, scan_mode, seed):
    """A mixer's output is its state sequence: its last step is the h_0 that continues it."""
    scan_mode("eager")
    torch.manual_seed(seed)
    m = MIXERS[name](5, 8, decay=decay).double()
    x = torch.randn(2, 21, 5, dtype=torch.float64)
    dt = torch.rand(2, 21, dtype=torch.float64) * 2 if decay else None
    sl = lambda a, b: None if dt is None else dt[:, a:b]  # noqa: E731
    whole = m(x, delta_t=dt)
    first = m(x[:, :8], delta_t=sl(0, 8))
    second = m(x[:, 8:20], first[:, -1], delta_t=sl(8, 20))
    torch.testing.assert_close(torch.cat([first, second], dim=1), whole[:, :20])
    nxt = m.step(x[:, 20], second[:, -1], None if dt is None else dt[:, 20])
    torch.testing.assert_close(nxt, whole[:, 20])


def test_stack_returns_the_states_that_continue_it(scan_mode, seed):
    scan_mode("eager")
    torch.manual_seed(seed)
    stack = scankit.MinGRUStack(8, depth=3, mixer=["mingru", "rotation", "signed"]).double()
    x = torch.randn(2, 17, 8, dtype=torch.float64)
    whole, states_all = stack(x, return_state=True)
    assert torch.equal(whole, stack(x)) and len(states_all) == 3
    first, states_ = stack(x[:, :9], return_state=True)
    second, states_ = stack(x[:, 9:16], states_, return_state=True)
    torch.testing.assert_close(torch.cat([first, second], dim=1), whole[:, :16])
    y, _ = stack.step(x[:, 16], states_)
    torch.testing.assert_close(y, whole[:, 16])
    with pytest.raises(ValueError, match="h_0 must be a list of 3 per-layer states; got 2"):
        stack(x, states_[:2])


LAYOUTS = {"parallel_scan_log": 3, "linear_scan": 3, "matrix_scan": 5, "matrix_affine_scan": 5}


@pytest.mark.parametrize("dim", [0, 2, -1])
@pytest.mark.parametrize("op", OPS_)
def test_any_time_dim_equals_moving_it_to_1(op, dim, kernel_mode, seed):
    """``dim=``: inputs with time elsewhere (time-major, (B, D, T)) give the dim-1 call's
    outputs with time moved the same way, grads included; no copy of the inputs is needed."""
    if dim == -1 and LAYOUTS[op] == 5:
        pytest.skip("dim -1 of a block op is a block dim (its own test)")
    g = torch.Generator().manual_seed(seed)
    xs, h0 = _inputs(op, 2, 13, g, DTYPE[kernel_mode])
    d = dim % LAYOUTS[op]
    moved = [x.to(DEVICE).movedim(1, d).contiguous().requires_grad_() for x in xs]   # time at d in memory
    h0 = h0.to(DEVICE)
    h, last = _call(op, moved, h0, return_final_state=True, dim=dim)
    ref_in = [x.detach().movedim(d, 1).requires_grad_() for x in moved]
    ref_h, ref_last = _call(op, ref_in, h0, return_final_state=True)
    torch.testing.assert_close(h, ref_h.movedim(1, d))
    torch.testing.assert_close(last, ref_last)
    w = torch.randn(h.shape, generator=g, dtype=torch.float64).to(h)
    for got, want in zip(torch.autograd.grad((h * w).sum(), moved),
                         torch.autograd.grad((ref_h * w.movedim(d, 1)).sum(), ref_in)):
        torch.testing.assert_close(got, want.movedim(1, d))


def test_bad_dim_is_named(scan_mode):
    scan_mode("eager")
    a = torch.rand(2, 3, 4)
    with pytest.raises(ValueError, match=r"dim must pick one of the first three dims .* \(2, 3, 4\); got dim=3"):
        scankit.linear_scan(a, a, dim=3)
    with pytest.raises(ValueError, match=r"dim=-1"):
        scankit.matrix_scan(torch.rand(2, 3, 4, 2, 2), torch.rand(2, 3, 4, 2), dim=-1)
    with pytest.raises(TypeError, match="dim must be an int; got float"):
        scankit.linear_scan(a, a, dim=1.0)
    with pytest.raises(ValueError, match=r"b must have shape .*\(the shapes with dim=2 moved to 1\)"):
        scankit.linear_scan(a, torch.rand(2, 3, 5), dim=2)


def test_dim_takes_any_integer_but_not_a_bool(scan_mode):
    import numpy as np

    scan_mode("eager")
    a = torch.rand(2, 4, 3)
    want = scankit.linear_scan(a, a, dim=2)
    for dim in (np.int64(2), torch.tensor(-1), 2):
        assert all(torch.equal(x, y) for x, y in zip(scankit.linear_scan(a, a, dim=dim), want))
    with pytest.raises(TypeError, match="dim must be an int; got bool"):
        scankit.linear_scan(a, a, dim=True)
