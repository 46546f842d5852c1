"""Launch plans (``common.planned``): a repeated call reuses its plan, a knob change or another
shape class makes a new one, and no plan keeps a tensor of the call that made it alive."""
import pytest
import torch

from scankit.triton import common

import scankit


def _tensors_held(fn, seen=None) -> list:
    """Shapes of the real tensors in ``fn``'s closures, nested functions' included."""
    seen = set() if seen is None else seen
    if id(fn) in seen:
        return []
    seen.add(id(fn))
    found = []
    for cell in getattr(fn, "__closure__", None) or ():
        value = cell.cell_contents
        if isinstance(value, torch.Tensor) and value.device.type != "meta":
            found.append(tuple(value.shape))
        elif callable(value):
            found += _tensors_held(value, seen)
    return found


def _fwdbwd(op, *xs, **kwargs):
    xs = [x.detach().requires_grad_() for x in xs]
    kwargs = {k: v.detach().requires_grad_() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    out = op(*xs, **kwargs)
    out = out if isinstance(out, tuple) else (out,)
    torch.autograd.grad(out, xs, [torch.randn_like(o) for o in out])


@pytest.mark.parametrize("T", [1, 13, 257])
def test_plans_are_reused_and_hold_no_tensors(T, monkeypatch):
    monkeypatch.setenv("MINGRU_SCAN", "triton")
    a, b, h0 = torch.rand(2, T, 16), torch.randn(2, T, 16), torch.randn(2, 16)
    M, m = torch.randn(2, T, 3, 2, 2) * 0.5, torch.randn(2, T, 3, 2)
    A4, B4, h4 = torch.randn(2, T, 3, 4, 4) * 0.3, torch.randn(2, T, 3, 4, 1), torch.randn(2, 3, 4, 1)
    A8, B8 = torch.randn(2, T, 2, 8, 8) * 0.2, torch.randn(2, T, 2, 8, 2)
    calls = [lambda: _fwdbwd(scankit.linear_scan, a, b, h0=h0, return_prefix=False),
             lambda: _fwdbwd(scankit.linear_scan, a, b),
             lambda: _fwdbwd(scankit.parallel_scan_log, -a, torch.randn(2, T + 1, 16)),
             lambda: _fwdbwd(scankit.mingru_scan, torch.randn(2, T, 32)),
             lambda: _fwdbwd(scankit.matrix_scan, M, m),  # the 2x2 kernels
             lambda: _fwdbwd(scankit.matrix_affine_scan, A4, B4, h0=h4, return_prefix=False),  # lane backward
             lambda: _fwdbwd(scankit.matrix_affine_scan, A8, B8)]  # the generic block kernels
    for call in calls:
        call()
    made = dict(common._PLANS)
    assert made, "no launch plan was made"
    for call in calls:
        call()
    assert common._PLANS == made, "a repeated call made a new plan"
    assert all(not _tensors_held(plan) for plan in made.values())


def test_a_knob_change_or_another_shape_makes_a_new_plan(monkeypatch):
    monkeypatch.setenv("MINGRU_SCAN", "triton")
    a, b = torch.rand(2, 13, 16), torch.randn(2, 13, 16)
    want = scankit.linear_scan(a, b, return_prefix=False)
    assert len(common._PLANS) == 1
    monkeypatch.setitem(common.LOOKBACK, "linear", "always")  # another path for the same inputs
    torch.testing.assert_close(scankit.linear_scan(a, b, return_prefix=False), want)
    assert len(common._PLANS) == 2
    scankit.linear_scan(a[:, :7], b[:, :7], return_prefix=False)
    scankit.linear_scan(a[:, :, 1:], b[:, :, 1:], return_prefix=False)  # strides and a 4-byte offset
    assert len(common._PLANS) == 4


def test_block_plans_follow_the_blocks_layout(monkeypatch):
    """The 2x2 kernels' wide loads depend on where each block starts: an input one element into
    its storage gets a plan of its own (narrow loads) and the same states as the contiguous one."""
    monkeypatch.setenv("MINGRU_SCAN", "triton")
    M, b = torch.randn(2, 13, 3, 2, 2) * 0.5, torch.randn(2, 13, 3, 2)
    want = scankit.matrix_scan(M, b, return_prefix=False)
    assert len(common._PLANS) == 1
    shifted = torch.empty(1 + M.numel())[1:].view(M.shape).copy_(M)  # storage offset 1: not block-aligned
    torch.testing.assert_close(scankit.matrix_scan(shifted, b, return_prefix=False), want, rtol=0, atol=0)
    assert len(common._PLANS) == 2


def test_rotation_plans_are_reused_and_hold_no_tensors(monkeypatch):
    """The angle-fused rotation kernels (a Givens mixer's step) are planned as the others."""
    monkeypatch.setenv("MINGRU_SCAN", "triton")
    seen, launch = [], common.launch
    monkeypatch.setattr(common, "launch", lambda k, grid, *a, **m: (seen.append(k.fn.__module__), launch(k, grid, *a, **m))[1])
    torch.manual_seed(0)
    mixer = scankit.GivensMinGRU(5, 16, block_size=8, rounds=2)
    x = torch.randn(3, 9, 5)

    def step():
        h = mixer(x)
        torch.autograd.grad(h.sum(), list(mixer.parameters()))
    step()
    from scankit.triton import givens

    chunked = givens._geometry(3, 9, mixer.n, mixer.k, x.device)[1] > 1  # summary passes too (the interpreter's geometry)
    assert seen.count("scankit.triton.givens") == (4 if chunked else 2) and common._PLANS, seen
    made = dict(common._PLANS)
    step()
    assert common._PLANS == made, "a repeated call made a new plan"
    assert all(not _tensors_held(plan) for plan in made.values())
