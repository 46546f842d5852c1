"""Triton kernels of the four scan ops (the only package that imports triton).

Each function takes the public op's (validated) arguments and returns what the eager
reference returns; inputs outside the envelope raise ``ScanFallback``.
"""
from . import affine, elementwise
from .common import check_envelope


def parallel_scan_log(log_coeffs, log_values):
    check_envelope("parallel_scan_log", log_coeffs, log_values)
    return elementwise.log_scan_fwd(log_coeffs, log_values)


def linear_scan(a, b, *, h0=None, return_prefix=True):
    check_envelope("linear_scan", a, b, h0)
    prod, h = elementwise.linear_scan_fwd(a, b, h0, return_prefix)
    return (prod, h) if return_prefix else h


def matrix_affine_scan(A, B, *, h0=None, return_prefix=True):
    check_envelope("matrix_affine_scan", A, B, h0, kv=(A.shape[-1], B.shape[-1]))
    Abar, out = affine.affine_scan_fwd(A, B, h0, return_prefix)
    return (Abar, out) if return_prefix else out


def matrix_scan(M, b, *, h0=None, return_prefix=True):
    check_envelope("matrix_scan", M, b, h0)
    Abar, out = affine.affine_scan_fwd(M, b.unsqueeze(-1), None if h0 is None else h0.unsqueeze(-1), return_prefix)
    return (Abar, out.squeeze(-1)) if return_prefix else out.squeeze(-1)
