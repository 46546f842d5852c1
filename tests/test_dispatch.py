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
