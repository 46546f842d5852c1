"""``MINGRU_SCAN`` resolution: choose the eager reference or the Triton kernel per call.

* ``auto`` (default): CPU tensors run eager; CUDA tensors run the kernel, and when it
  cannot (``ScanFallback``, Triton missing) a warning is issued once per op and process
  and the eager reference runs.
* ``eager``: always the reference.
* ``triton``: always the kernel; if it cannot run, ``RuntimeError`` (a benchmark must
  never time eager by accident). On CPU tensors this needs ``TRITON_INTERPRET=1``.
"""
from __future__ import annotations

import os
import warnings

MODES = ("auto", "eager", "triton")
_warned: set[str] = set()


class ScanFallback(Exception):
    """A kernel cannot handle these inputs (outside its envelope); use the reference."""


_PARSED: dict = {}  # MINGRU_SCAN's raw values seen -> their mode


def scan_mode() -> str:
    """The current ``MINGRU_SCAN`` value, read on every call (parsed once per raw value)."""
    raw = os.environ.get("MINGRU_SCAN")
    mode = _PARSED.get(raw)
    if mode is None:
        mode = (raw or "auto").strip().lower() or "auto"
        if mode not in MODES:
            raise ValueError(f"MINGRU_SCAN must be one of {', '.join(MODES)}; got {mode!r}")
        _PARSED[raw] = mode
    return mode


def checks_values(x) -> bool:
    """Whether to check the values of ``x`` (not only its shape): always on the CPU, where it
    is free; elsewhere only with ``SCANKIT_CHECK_VALUES=1``, since reading a GPU tensor's
    values synchronises the host with the device; never while torch.compile traces, nor on a
    traced tensor (AOTAutograd's fake and functional tensors have no values to read)."""
    import torch

    if torch.compiler.is_compiling() or type(x) not in (torch.Tensor, torch.nn.Parameter):
        return False
    return x.device.type == "cpu" or os.environ.get("SCANKIT_CHECK_VALUES", "0") not in ("", "0")


def interpreting() -> bool:
    """True when Triton runs kernels on the CPU through its interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def load_kernels():
    """Import ``scankit.triton`` (the only module that imports triton).

    A plain import statement, so torch.compile traces through it without a graph break; once
    imported it is a module attribute (an import statement costs ~0.7 us a call).
    """
    global _kernels
    if _kernels is None:
        from . import triton as kernels

        _kernels = kernels
    return _kernels


_kernels = None


def available(device: str = "cuda") -> bool:
    """Whether the Triton kernels can run on ``device`` tensors in this process."""
    import torch

    kind = torch.device(device).type
    if kind == "cuda" and not torch.cuda.is_available():
        return False
    if kind == "cpu" and not interpreting():
        return False
    try:
        load_kernels()
    except ImportError:
        return False
    return True


def _warn_once(op: str, reason: BaseException) -> None:
    if op not in _warned:
        _warned.add(op)
        warnings.warn(f"scankit: {op} falls back to the eager reference ({reason})", RuntimeWarning, stacklevel=4)


def _eager(device, eager):
    """``eager()`` outside autocast: an op runs in its inputs' dtype on either path (under CUDA
    autocast the references' exp, log and softplus would otherwise return fp32 for bf16 inputs,
    where the kernels return bf16)."""
    import torch

    if device.type in ("cuda", "cpu") and torch.is_autocast_enabled(device.type):
        with torch.autocast(device.type, enabled=False):
            return eager()
    return eager()


def run(op: str, device, eager, kernel):
    """Run ``kernel(kernels_module)`` or ``eager()`` for ``op`` per ``MINGRU_SCAN``."""
    mode = scan_mode()
    if mode == "eager" or (mode == "auto" and device.type != "cuda"):
        return _eager(device, eager)
    if device.type != "cuda" and not interpreting():
        raise RuntimeError(
            f"MINGRU_SCAN=triton: {op} got {device.type} tensors; the kernels need CUDA tensors "
            "(or TRITON_INTERPRET=1 to run them on the CPU through Triton's interpreter)"
        )
    try:
        kernels = load_kernels()
        return kernel(kernels)
    except (ScanFallback, ImportError) as exc:
        if isinstance(exc, ImportError) and not _import_failed(exc):
            raise
        if mode == "triton":
            raise RuntimeError(f"MINGRU_SCAN=triton but the {op} kernel cannot run: {exc}") from exc
        _warn_once(op, exc)
        return _eager(device, eager)


def _import_failed(exc: ImportError) -> bool:
    """Only a missing ``triton`` / ``scankit.triton`` counts as 'kernels unavailable'."""
    name = getattr(exc, "name", None) or ""
    return name.split(".")[0] == "triton" or name.startswith("scankit.triton")
