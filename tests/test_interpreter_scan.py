"""The suite's interpreter scan (``scankit.triton.interpret.column_scan``) gives bit-for-bit what the
interpreter's own per-element scan gives, on the kernels' combine, forward and reversed, on
tiles and on single rows, with masked-out (1, 0) elements as the look-back feeds it."""
import os

import pytest
import torch
import triton
import triton.language as tl

from scankit.triton.elementwise import _combine

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the interpreter's scan")


@triton.jit
def _scan(a_ptr, b_ptr, out_a, out_b, T: tl.constexpr, D: tl.constexpr, REV: tl.constexpr, ROW: tl.constexpr):
    if ROW:  # one column: a 1-D scan
        t = tl.arange(0, T)
        ra, rb = tl.associative_scan((tl.load(a_ptr + t * D), tl.load(b_ptr + t * D)), 0, _combine, reverse=REV)
        tl.store(out_a + t * D, ra)
        tl.store(out_b + t * D, rb)
    else:
        off = tl.arange(0, T)[:, None] * D + tl.arange(0, D)[None, :]
        ra, rb = tl.associative_scan((tl.load(a_ptr + off), tl.load(b_ptr + off)), 0, _combine, reverse=REV)
        tl.store(out_a + off, ra)
        tl.store(out_b + off, rb)


@pytest.mark.parametrize("row", [False, True])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("T,D", [(16, 32), (4, 8), (1, 16)])
def test_column_scan_is_the_interpreters_scan_bit_for_bit(T, D, reverse, row, seed, monkeypatch):
    from triton.runtime import interpreter

    from scankit.triton import interpret

    if not interpret.ORIGINAL:
        pytest.skip("this triton's interpreter has no ScanOps.generic_scan")
    g = torch.Generator().manual_seed(seed)
    a, b = torch.rand(T, D, generator=g) * 2, torch.randn(T, D, generator=g) * 100
    a[torch.rand(T, D, generator=g) < 0.2], b[torch.rand(T, D, generator=g) < 0.2] = 1.0, 0.0
    results = []
    for impl in (interpret.ORIGINAL[0], interpret.column_scan):
        monkeypatch.setattr(interpreter.ScanOps, "generic_scan", impl)
        out = torch.full_like(a, float("nan")), torch.full_like(b, float("nan"))
        _scan[(1,)](a, b, *out, T=T, D=D, REV=reverse, ROW=row)
        results.append(out)
    (want_a, want_b), (got_a, got_b) = results
    cols = slice(0, 1) if row else slice(None)
    assert not want_a[:, cols].isnan().any() and not want_b[:, cols].isnan().any()
    assert torch.equal(got_a[:, cols], want_a[:, cols]) and torch.equal(got_b[:, cols], want_b[:, cols])
    if row and D > 1:  # the row form wrote its one column only
        assert got_a[:, 1:].isnan().all() and got_b[:, 1:].isnan().all()
    direction = range(T - 1, -1, -1) if reverse else range(T)
    ha, hb = torch.ones(D, dtype=torch.float64), torch.zeros(D, dtype=torch.float64)
    for t in direction:  # and both are the left fold of the float64 loop, to float32 rounding
        ha, hb = ha * a[t].double(), a[t].double() * hb + b[t].double()
        torch.testing.assert_close(got_a[t, cols].double(), ha[cols], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got_b[t, cols].double(), hb[cols], rtol=1e-5, atol=1e-3)
