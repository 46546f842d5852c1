"""scankit: first-order scan ops (eager + Triton) and the minGRU mixer family.

``import scankit`` is cheap: torch loads on first use of an op or mixer, and the Triton
kernels only when a kernel runs.
"""
import importlib

__version__ = "0.1.0"
_EXPORTS = {
    "parallel_scan_log": "ops", "linear_scan": "ops", "matrix_scan": "ops", "matrix_affine_scan": "ops",
    "mingru_scan": "ops", "signed_mingru_scan": "ops",
    "ScanFallback": "dispatch", "available": "dispatch",
    "MinGRU": "mixers", "SignedMinGRU": "mixers", "RotationMinGRU": "mixers", "GivensMinGRU": "mixers",
    "MinGRUBlock": "mixers", "MinGRUStack": "mixers",
}
__all__ = list(_EXPORTS)


def __getattr__(name):
    if name == "distributed":  # sequence-parallel ops over torch.distributed (scankit.distributed)
        return importlib.import_module(".distributed", __name__)
    if name in _EXPORTS:  # imported once, then a plain module attribute (no lookup per call)
        value = globals()[name] = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        return value
    raise AttributeError(f"module 'scankit' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
