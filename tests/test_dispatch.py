"""MINGRU_SCAN resolution: modes, errors, warn-once fallback."""
import warnings

import pytest
import torch

import scankit
from scankit import dispatch


def test_bogus_mode_is_a_value_error(scan_mode):
    scan_mode("fast")
    with pytest.raises(ValueError, match="MINGRU_SCAN must be one of auto, eager, triton; got 'fast'"):
        scankit.linear_scan(torch.randn(2, 3, 4), torch.randn(2, 3, 4))


def test_mode_is_read_on_every_call(scan_mode):
    a, b = torch.randn(2, 3, 4), torch.randn(2, 3, 4)
    scan_mode("eager")
    scankit.linear_scan(a, b)
    scan_mode("nonsense")
    with pytest.raises(ValueError):
        scankit.linear_scan(a, b)


def test_auto_on_cpu_runs_eager_without_touching_kernels(scan_mode, monkeypatch):
    scan_mode("auto")

    def boom():
        raise AssertionError("auto on CPU must not load the kernels")

    monkeypatch.setattr(dispatch, "load_kernels", boom)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scankit.linear_scan(torch.randn(2, 3, 4), torch.randn(2, 3, 4))


def test_triton_on_cpu_without_interpreter_raises(scan_mode, monkeypatch):
    scan_mode("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        scankit.linear_scan(torch.randn(2, 3, 4), torch.randn(2, 3, 4))


class _FakeDevice:
    type = "cuda"


def _fallback_kernels():
    class K:
        @staticmethod
        def linear_scan(*args, **kwargs):
            raise dispatch.ScanFallback("outside the envelope")

    return K


def test_auto_fallback_warns_once_per_process(scan_mode, monkeypatch):
    scan_mode("auto")
    monkeypatch.setattr(dispatch, "load_kernels", _fallback_kernels)
    monkeypatch.setattr(dispatch, "_warned", set())
    calls = []
    run = lambda: dispatch.run("linear_scan", _FakeDevice, lambda: calls.append(1) or "eager",  # noqa: E731
                               lambda k: k.linear_scan())
    with pytest.warns(RuntimeWarning, match="linear_scan falls back to the eager reference"):
        assert run() == "eager"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert run() == "eager"
    assert len(calls) == 2


def test_triton_mode_refuses_fallback(scan_mode, monkeypatch):
    scan_mode("triton")
    monkeypatch.setattr(dispatch, "load_kernels", _fallback_kernels)
    with pytest.raises(RuntimeError, match="MINGRU_SCAN=triton but the linear_scan kernel cannot run"):
        dispatch.run("linear_scan", _FakeDevice, lambda: "eager", lambda k: k.linear_scan())


def test_missing_triton_falls_back_under_auto(scan_mode, monkeypatch):
    scan_mode("auto")

    def no_triton():
        raise ModuleNotFoundError("No module named 'triton'", name="triton")

    monkeypatch.setattr(dispatch, "load_kernels", no_triton)
    monkeypatch.setattr(dispatch, "_warned", set())
    with pytest.warns(RuntimeWarning, match="No module named 'triton'"):
        assert dispatch.run("linear_scan", _FakeDevice, lambda: "eager", lambda k: "kernel") == "eager"


def test_unrelated_import_error_is_not_swallowed(scan_mode, monkeypatch):
    scan_mode("auto")
    monkeypatch.setattr(dispatch, "load_kernels", lambda: None)

    def broken(k):
        raise ModuleNotFoundError("No module named 'numpyy'", name="numpyy")

    with pytest.raises(ModuleNotFoundError):
        dispatch.run("linear_scan", _FakeDevice, lambda: "eager", broken)


def test_import_scankit_never_imports_triton():
    import subprocess
    import sys

    code = "import sys, scankit; scankit.MinGRU(4, 4); assert 'triton' not in sys.modules, 'triton imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.skipif(not (torch.cuda.is_available() or dispatch.interpreting()), reason="needs the kernels")
def test_kernel_calls_with_nothing_to_differentiate_skip_autograd(scan_mode, monkeypatch):
    """Without grad (no_grad, or no input requiring it) the kernels run without the
    autograd.Function; with it, through it. Same values either way; the graph only with grad."""
    from scankit.triton import common

    scan_mode("triton")
    applied = []
    apply = torch.autograd.Function.apply.__func__

    def counting(cls, *args):
        applied.append(cls.__name__)
        return apply(cls, *args)

    monkeypatch.setattr(torch.autograd.Function, "apply", classmethod(counting))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device="cpu").manual_seed(int(torch.randint(1 << 30, ())))
    a, b = (torch.rand(2, 13, 5, generator=g).to(device) for _ in range(2))
    plain = scankit.linear_scan(a, b, return_prefix=False)
    with torch.no_grad():
        no_grad = scankit.linear_scan(a.requires_grad_(), b.requires_grad_(), return_prefix=False)
    assert applied == [] and plain.grad_fn is None and no_grad.grad_fn is None
    graph = scankit.linear_scan(a, b, return_prefix=False)
    assert applied == ["linear_scan_fwd_eager"] and graph.grad_fn is not None
    assert torch.equal(plain, no_grad) and torch.equal(plain, graph.detach())
    graph.sum().backward()
    assert a.grad is not None and b.grad is not None and common.traced((a,)) is False
