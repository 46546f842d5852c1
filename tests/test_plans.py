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
    calls = [lambda: _fwdbwd(scankit.linear_scan, a, b, h0=h0, return_prefix=False),
             lambda: _fwdbwd(scankit.linear_scan, a, b),
             lambda: _fwdbwd(scankit.parallel_scan_log, -a, torch.randn(2, T + 1, 16)),
             lambda: _fwdbwd(scankit.mingru_scan, torch.randn(2, T, 32))]
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
