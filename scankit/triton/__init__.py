"""Triton kernels of the four scan ops (the only package that imports triton).

Each function takes the public op's (validated) arguments and returns what the eager
reference returns; inputs outside the envelope raise ``ScanFallback``.
"""
from ..dispatch import ScanFallback
from . import affine, elementwise, givens
from .common import check_envelope


def parallel_scan_log(log_coeffs, log_values, log_h0=None, reverse=False, reset=None):
    """``reset``: int8 (T,) flags of the rows where a packed sequence's scan begins (B = 1)."""
    check_envelope("parallel_scan_log", log_coeffs, log_values, log_h0)
    return elementwise.log_scan(log_coeffs, log_values, log_h0, reverse, reset)


def linear_scan(a, b, *, h0=None, return_prefix=True, reverse=False, reset=None):
    check_envelope("linear_scan", a, b, h0)
    prod, h = elementwise.linear_scan(a, b, h0, return_prefix, reverse, reset)
    return (prod, h) if return_prefix else h


def mingru_scan(gate_hidden, h0=None):
    """minGRU's states from its pre-activations gate_hidden (B, T, 2D) = [k | v] (``ops.mingru_scan``)."""
    check_envelope("mingru_scan", gate_hidden, h0)
    return elementwise.gated_scan(gate_hidden, h0, 1)


def signed_mingru_scan(proj, h0=None, coupled=False):
    """The signed minGRU's states from its pre-activations proj (B, T, 3D) = [s | zk | v]
    (``ops.signed_mingru_scan``)."""
    check_envelope("signed_mingru_scan", proj, h0)
    return elementwise.gated_scan(proj, h0, 3 if coupled else 2)


def matrix_affine_scan(A, B, *, h0=None, return_prefix=True, reverse=False):
    check_envelope("matrix_affine_scan", A, B, h0, kv=(A.shape[-1], B.shape[-1]))
    Abar, out = affine.affine_scan(A, B, h0, return_prefix, reverse, None)
    return (Abar, out) if return_prefix else out


def matrix_scan(M, b, *, h0=None, return_prefix=True, reverse=False):
    check_envelope("matrix_scan", M, b, h0)
    Abar, out = affine.matrix_scan(M, b, h0, return_prefix, reverse, None)
    return (Abar, out) if return_prefix else out


ROTATION_K = (2, 4, 8, 16)


def rotation_scan(angles, b, *, scale=None, gamma=None, h0=None):
    """Angle-fused ``h_t = gamma_t G_{R-1}..G_0 diag(1, scale_t) h_{t-1} + b_t``.

    angles (B,T,n,R,k/2), b (B,T,n,k), scale and gamma (B,T,n) or None, h0 (B,n,k) or None.
    """
    check_envelope("rotation_scan", angles, b, scale, gamma, h0)
    k = b.shape[-1]
    if k not in ROTATION_K:
        raise ScanFallback(f"rotation_scan: the fused kernel takes k in {ROTATION_K}, got k = {k}")
    if scale is not None and k != 2:
        raise ScanFallback("rotation_scan: a per-step scale is only fused for k = 2")
    if len({x.dtype for x in (angles, b, scale, gamma, h0) if x is not None}) > 1:
        raise ScanFallback("rotation_scan: angles, b, scale, gamma and h0 must share one dtype")
    return givens.rotation_scan(angles, b, scale, gamma, h0)
