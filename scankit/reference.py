"""Eager pure-PyTorch references of the four scan ops (the "eager" implementation).

Every op solves the first-order affine recurrence ``h_t = A_t h_{t-1} + B_t`` along
dim 1. The log op uses Heinsen's log-space formulation; the three affine ops use
Hillis-Steele doubling over the associative composition
``(A1, B1) then (A2, B2) = (A2 A1, A2 B1 + B2)``. Half-precision inputs are computed in
float32 and returned in their own dtype. Inputs are assumed validated (see ``ops``).
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

_HALF = (torch.float16, torch.bfloat16)


def _accumulate_in_fp32(fn):
    """Run ``fn`` on float32 copies of half-precision tensors; cast outputs back."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        dtype = tensors[0].dtype
        if dtype not in _HALF:
            return fn(*args, **kwargs)
        up = lambda x: x.float() if isinstance(x, torch.Tensor) else x  # noqa: E731
        out = fn(*map(up, args), **{k: up(v) for k, v in kwargs.items()})
        if isinstance(out, tuple):
            return tuple(o.to(dtype) for o in out)
        return out.to(dtype)

    return wrapper


@_accumulate_in_fp32
def parallel_scan_log(log_coeffs: torch.Tensor, log_values: torch.Tensor, log_h0=None) -> torch.Tensor:
    """h_1..h_T of ``h_t = exp(log_coeffs_t) h_{t-1} + exp(log_values_t)``, h_0 = exp(log_values_0)
    (with ``log_h0`` (B, D): h_0 = exp(log_h0) and log_values (B, T, D) holds log b_1..log b_T).
    Heinsen's form: log_coeffs must be finite (a coefficient 0, log a = -inf, makes every later
    state NaN; ``parallel_scan_log_resets`` is exact there)."""
    if log_h0 is not None:
        log_values = torch.cat([log_h0.unsqueeze(1), log_values], dim=1)
    a_star = F.pad(torch.cumsum(log_coeffs, dim=1), (0, 0, 1, 0))
    log_h = a_star + torch.logcumsumexp(log_values - a_star, dim=1)
    return torch.exp(log_h)[:, 1:]


@_accumulate_in_fp32
def parallel_scan_log_resets(log_coeffs: torch.Tensor, log_values: torch.Tensor, log_h0: torch.Tensor) -> torch.Tensor:
    """``parallel_scan_log`` (log_h0 form) by Hillis-Steele doubling of (log a, log b) pairs in
    log space, ``(la1, lb1) then (la2, lb2) = (la1 + la2, logaddexp(la2 + lb1, lb2))``: exact
    where a coefficient is 0 (log a = -inf resets the state: packed sequences), where Heinsen's
    running sum gives NaN from there on (-inf - -inf)."""
    la, lb = log_coeffs, log_values
    T, offset = la.shape[1], 1
    while offset < T:
        la, lb = (torch.cat([la[:, :offset], la[:, offset:] + la[:, :-offset]], dim=1),
                  torch.cat([lb[:, :offset], torch.logaddexp(la[:, offset:] + lb[:, :-offset], lb[:, offset:])], dim=1))
        offset *= 2
    return torch.exp(torch.logaddexp(la + log_h0.unsqueeze(1), lb))


def log_g(x: torch.Tensor) -> torch.Tensor:
    """log of minGRU's positive activation g(x) = x + 0.5 (x >= 0), sigmoid(x) (x < 0)."""
    return torch.where(x >= 0, torch.log(F.relu(x) + 0.5), -F.softplus(-x))


def mingru_log_terms(gate_hidden: torch.Tensor):
    """minGRU's (log a, log b) from its pre-activations gate_hidden (..., 2D) = [k | v]:
    a = 1 - sigmoid(k), b = sigmoid(k) g(v), in log space."""
    k, v = gate_hidden.chunk(2, dim=-1)
    return -F.softplus(k), -F.softplus(-k) + log_g(v)


def mingru_scan(gate_hidden: torch.Tensor, h0=None) -> torch.Tensor:
    """minGRU's states h_t = (1 - z_t) h_{t-1} + z_t g(v_t), z = sigmoid(k), from gate_hidden
    (B, T, 2D) = [k | v] and h0 (B, D) >= 0 (zeros when None), in log space (``parallel_scan_log``)."""
    log_a, log_b = mingru_log_terms(gate_hidden)
    log_h0 = h0.log() if h0 is not None else log_a.new_full((log_a.shape[0], log_a.shape[2]), float("-inf"))
    return parallel_scan_log(log_a, log_b, log_h0=log_h0)


def signed_mingru_terms(proj: torch.Tensor, coupled: bool = False):
    """The signed minGRU's (a, b) from its pre-activations proj (..., 3D) = [s | zk | v]:
    a = tanh(s) (times 1 - sigmoid(zk) when ``coupled``), b = sigmoid(zk) v."""
    s, zk, v = proj.chunk(3, dim=-1)
    z = torch.sigmoid(zk)
    return ((1 - z) * torch.tanh(s) if coupled else torch.tanh(s)), z * v


def signed_mingru_scan(proj: torch.Tensor, h0=None, coupled: bool = False) -> torch.Tensor:
    """The signed minGRU's states h_t = a_t h_{t-1} + b_t (``signed_mingru_terms``) from h0 (B, D)."""
    a, b = signed_mingru_terms(proj, coupled)
    return linear_scan(a, b, h0=h0, return_prefix=False)


def _doubling(A: torch.Tensor, B: torch.Tensor, mul):
    """Inclusive Hillis-Steele scan of affine maps along dim 1; ``mul`` composes. Fresh
    tensors, never the inputs themselves (T = 1 included)."""
    T = A.shape[1]
    if T == 1:
        return A.clone(), B.clone()
    offset = 1
    while offset < T:
        A_new = mul(A[:, offset:], A[:, :-offset])
        B_new = mul(A[:, offset:], B[:, :-offset]) + B[:, offset:]
        A = torch.cat([A[:, :offset], A_new], dim=1)
        B = torch.cat([B[:, :offset], B_new], dim=1)
        offset *= 2
    return A, B


def _finish(Abar, Bbar, h0, return_prefix, apply):
    """Return the prefix pair, or only the states ``h_t = Abar_t h0 + Bbar_t``."""
    if return_prefix:
        return Abar, Bbar
    return Bbar if h0 is None else apply(Abar, h0.unsqueeze(1)) + Bbar


@_accumulate_in_fp32
def linear_scan(a, b, *, h0=None, return_prefix=True):
    """Elementwise affine scan: A_t = a_1...a_t, Bc_t = a_t Bc_{t-1} + b_t (Bc_0 = 0)."""
    A, Bc = _doubling(a, b, torch.mul)
    return _finish(A, Bc, h0, return_prefix, torch.mul)


@_accumulate_in_fp32
def matrix_affine_scan(A, Bm, *, h0=None, return_prefix=True):
    """Blockwise affine scan with k x k transitions A (B,T,n,k,k) and inputs Bm (B,T,n,k,v)."""
    Abar, Bbar = _doubling(A, Bm, torch.matmul)
    return _finish(Abar, Bbar, h0, return_prefix, torch.matmul)


def matrix_scan(M, b, *, h0=None, return_prefix=True):
    """2 x 2 block scan: M (B,T,n,2,2), b (B,T,n,2); ``matrix_affine_scan`` with v = 1."""
    h0v = None if h0 is None else h0.unsqueeze(-1)
    out = matrix_affine_scan(M, b.unsqueeze(-1), h0=h0v, return_prefix=return_prefix)
    if return_prefix:
        return out[0], out[1].squeeze(-1)
    return out.squeeze(-1)
