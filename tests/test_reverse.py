"""``reverse=True`` on every op: h_t = a_t h_{t+1} + b_t from the end (h0 = h_{T+1}), against
the float64 loop run backwards, gradients included, eager and kernels; the final state is h_1,
and a reversed sequence scanned in pieces from its end, each from the last piece's final
state, equals one call."""
import pytest
import torch

import scankit
from oracles import affine_loop, log_loop, states
from test_final_state import DEVICE, DTYPE, OPS_, _call, _inputs

PIECES = {13: [5, 1, 7], 257: [156, 1, 100]}  # from the end


def _oracle(op, xs, h0):
    if op == "parallel_scan_log":
        return log_loop(xs[0], torch.cat([h0.unsqueeze(1), xs[1]], dim=1), reverse=True)
    if op == "linear_scan":
        return affine_loop(*xs, h0=h0, elementwise=True, reverse=True)[2]
    if op == "matrix_scan":
        return affine_loop(xs[0], xs[1].unsqueeze(-1), h0.unsqueeze(-1), reverse=True)[2].squeeze(-1)
    return affine_loop(*xs, h0=h0, reverse=True)[2]


@pytest.mark.parametrize("T", [1, 2, 13, 257])
@pytest.mark.parametrize("op", OPS_)
def test_reverse_states_final_state_and_gradients(op, T, kernel_mode, seed):
    g = torch.Generator().manual_seed(seed)
    xs, h0 = _inputs(op, 2, T, g, DTYPE[kernel_mode])
    leaves = [x.to(DEVICE).requires_grad_() for x in (*xs, h0)]
    h, first = _call(op, leaves[:-1], leaves[-1], return_final_state=True, reverse=True)
    ref_leaves = [x.detach().double().cpu().requires_grad_() for x in leaves]
    ref = _oracle(op, ref_leaves[:-1], ref_leaves[-1])
    torch.testing.assert_close(h.detach().cpu().double(), ref.detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(first.detach().cpu().double(), ref[:, 0].detach(), atol=1e-5, rtol=1e-5)
    if T > 1:  # the forward scan of the same inputs is another answer
        forward = (log_loop(xs[0], torch.cat([h0.unsqueeze(1), xs[1]], dim=1)) if op == "parallel_scan_log"
                   else states(op, list(xs), h0))
        assert not torch.allclose(h.detach().cpu().double(), forward.double(), atol=1e-3)
    w, w_first = (torch.randn(t.shape, generator=g, dtype=torch.float64) for t in (ref, ref[:, 0]))
    loss = (h * w.to(h)).sum() + (first * w_first.to(first)).sum()
    ref_loss = (ref * w).sum() + (ref[:, 0] * w_first).sum()
    for got, want in zip(torch.autograd.grad(loss, leaves), torch.autograd.grad(ref_loss, ref_leaves)):
        torch.testing.assert_close(got.cpu().double(), want, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("op", ["linear_scan", "matrix_scan", "matrix_affine_scan"])
def test_reverse_prefix_form_is_the_suffix_product_and_the_solution_from_zero(op, kernel_mode, seed):
    g = torch.Generator().manual_seed(seed)
    xs, _ = _inputs(op, 2, 13, g, DTYPE[kernel_mode])
    leaves = [x.to(DEVICE).requires_grad_() for x in xs]
    A, Bc = getattr(scankit, op)(*leaves, reverse=True)
    ref_leaves = [x.detach().double().cpu().requires_grad_() for x in leaves]
    if op == "matrix_scan":
        ref_A, ref_B, _ = affine_loop(ref_leaves[0], ref_leaves[1].unsqueeze(-1), reverse=True)
        ref_B = ref_B.squeeze(-1)
    else:
        ref_A, ref_B, _ = affine_loop(*ref_leaves, elementwise=op == "linear_scan", reverse=True)
    torch.testing.assert_close(A.detach().cpu().double(), ref_A.detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(Bc.detach().cpu().double(), ref_B.detach(), atol=1e-5, rtol=1e-5)
    wa, wb = (torch.randn(t.shape, generator=g, dtype=torch.float64) for t in (ref_A, ref_B))
    got = torch.autograd.grad((A * wa.to(A)).sum() + (Bc * wb.to(Bc)).sum(), leaves)
    want = torch.autograd.grad((ref_A * wa).sum() + (ref_B * wb).sum(), ref_leaves)
    for x, y in zip(got, want):
        torch.testing.assert_close(x.cpu().double(), y, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("B,T", [(2, 1), (2, 13), (1, 257)])
def test_reverse_log_slot_form_reads_slot_0_as_the_initial_state(B, T, kernel_mode, seed):
    """Slot 0 of log_values is log h_0 = log h_{T+1} of the scan from the end, read in place by
    the kernels (no split, no gradient assembled into a copy): states and gradients against the
    float64 loop and against the same scan with log_h0 passed apart."""
    g = torch.Generator().manual_seed(seed)
    (lc, lv), lh0 = _inputs("parallel_scan_log", B, T, g, DTYPE[kernel_mode])
    slot_values = torch.cat([lh0.unsqueeze(1), lv], dim=1)
    lc, slot_values = lc.to(DEVICE).requires_grad_(), slot_values.to(DEVICE).requires_grad_()
    slot = scankit.parallel_scan_log(lc, slot_values, reverse=True)
    apart = scankit.parallel_scan_log(lc, slot_values[:, 1:], log_h0=slot_values[:, 0], reverse=True)
    torch.testing.assert_close(slot, apart, atol=0, rtol=0)
    lc64, lv64 = (x.detach().cpu().double().requires_grad_() for x in (lc, slot_values))
    ref = log_loop(lc64, lv64, reverse=True)
    torch.testing.assert_close(slot.detach().cpu().double(), ref.detach(), atol=1e-5, rtol=1e-5)
    cot = torch.randn(ref.shape, generator=g, dtype=torch.float64)
    got = torch.autograd.grad(slot, (lc, slot_values), cot.to(slot.dtype).to(DEVICE))
    want = torch.autograd.grad(ref, (lc64, lv64), cot)
    for x, y in zip(got, want):
        torch.testing.assert_close(x.cpu().double(), y, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("T", sorted(PIECES))
@pytest.mark.parametrize("op", OPS_)
def test_reverse_in_pieces_from_the_end_equals_one_call(op, T, kernel_mode, seed):
    g = torch.Generator().manual_seed(seed)
    xs, h0 = _inputs(op, 2, T, g, DTYPE[kernel_mode])
    xs, h0 = [x.to(DEVICE) for x in xs], h0.to(DEVICE)
    whole = _call(op, xs, h0, reverse=True)
    parts, h, end = [], h0, T
    for n in PIECES[T]:
        piece, h = _call(op, [x[:, end - n:end] for x in xs], h, return_final_state=True, reverse=True)
        if op == "parallel_scan_log":
            h = h.log()
        parts.insert(0, piece)
        end -= n
    torch.testing.assert_close(torch.cat(parts, dim=1), whole, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("op", ["parallel_scan_log", "linear_scan"])
def test_reverse_along_another_dim(op, kernel_mode, seed):
    g = torch.Generator().manual_seed(seed)
    xs, h0 = _inputs(op, 2, 13, g, DTYPE[kernel_mode])
    moved = [x.to(DEVICE).movedim(1, 2).contiguous() for x in xs]  # (B, D, T)
    h0 = h0.to(DEVICE)
    got = _call(op, moved, h0, reverse=True, dim=-1)
    want = _call(op, [x.movedim(2, 1) for x in moved], h0, reverse=True)
    torch.testing.assert_close(got, want.movedim(1, 2))


def test_reverse_must_be_a_bool(scan_mode):
    scan_mode("eager")
    a = torch.rand(2, 3, 4)
    for op, args in (("linear_scan", (a, a)), ("parallel_scan_log", (a, torch.rand(2, 4, 4))),
                     ("matrix_scan", (torch.rand(2, 3, 1, 2, 2), torch.rand(2, 3, 1, 2))),
                     ("matrix_affine_scan", (torch.rand(2, 3, 1, 2, 2), torch.rand(2, 3, 1, 2, 1)))):
        with pytest.raises(TypeError, match="reverse must be True or False; got 1"):
            getattr(scankit, op)(*args, reverse=1)
