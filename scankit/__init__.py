"""scankit: first-order scan ops (eager + Triton) and the minGRU mixer family.

``import scankit`` needs only torch; the Triton kernels load on first use.
"""
from .dispatch import ScanFallback, available
from .mixers import GivensMinGRU, MinGRU, MinGRUBlock, MinGRUStack, RotationMinGRU, SignedMinGRU
from .ops import linear_scan, matrix_affine_scan, matrix_scan, parallel_scan_log

__version__ = "0.1.0"
__all__ = [
    "parallel_scan_log", "linear_scan", "matrix_scan", "matrix_affine_scan", "ScanFallback", "available",
    "MinGRU", "SignedMinGRU", "RotationMinGRU", "GivensMinGRU", "MinGRUBlock", "MinGRUStack",
]
