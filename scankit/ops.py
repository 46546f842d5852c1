"""Public scan ops: validate the inputs, then dispatch to the eager reference or the kernel.

Every op also takes these call forms (keyword arguments):

- ``reverse=True`` scans from the end, ``h_t = a_t h_{t+1} + b_t`` from h0 = h_{T+1} (a prefix
  form's A_t is the product from t to T): outputs in the inputs' time order, the final state h_1.
  The kernels walk time backwards in place; the eager references flip the inputs and outputs
  instead (``_time_reversed``: copies).
- ``cu_seqlens`` (N+1,) int32/int64 offsets: the batch of 1 packs N sequences, each scanned
  from its own h0[n] (h0 (N, ...), zeros when None; the states only), final states (N, ...)
  (``scankit.packed``).
"""
from __future__ import annotations

import operator

import torch

from . import dispatch, packed, reference

FLOAT_DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)


def _describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"{tuple(x.shape)} {x.dtype} on {x.device}"
    return type(x).__name__


def _check_tensor(name: str, x, ndim: int, layout: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor {layout}; got {_describe(x)}")
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be float64/float32/bfloat16/float16; got {x.dtype}")
    if x.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D {layout}; got shape {tuple(x.shape)}")


def _check_same(first: str, x: torch.Tensor, name: str, y: torch.Tensor) -> None:
    if y.dtype != x.dtype:
        raise TypeError(f"{name} must have the dtype of {first} ({x.dtype}); got {y.dtype}")
    if y.device != x.device:
        raise ValueError(f"{name} must be on the device of {first} ({x.device}); got {y.device}")


def _check_shape(name: str, x: torch.Tensor, expected: tuple, layout: str) -> None:
    if x.shape != expected:  # (a torch.Size is a tuple: no conversions)
        raise ValueError(f"{name} must have shape {layout} = {tuple(expected)}; got {tuple(x.shape)}")


def _check_time(name: str, x: torch.Tensor) -> None:
    if x.shape[1] < 1:
        raise ValueError(f"{name} needs T >= 1 (dim 1); got shape {tuple(x.shape)}")


def _check_h0(h0, ref: torch.Tensor, ref_name: str, expected: tuple, layout: str, return_prefix: bool) -> None:
    if h0 is None:
        return
    if return_prefix:
        raise ValueError("h0 is only used with return_prefix=False (the states from h0); the prefix form "
                         "returns (A, Bc) from h_0 = 0, so form h = A * h0 + Bc from it, or pass return_prefix=False")
    _check_tensor("h0", h0, len(expected), layout)
    _check_same(ref_name, ref, "h0", h0)
    _check_shape("h0", h0, expected, layout)


def _with_final(out, return_final_state: bool, reverse: bool = False):
    """``out``, and with ``return_final_state`` the last state h_T after it (h_1 of a scan from
    the end): of the states (``return_prefix=False``, the log op) or of the solution from
    h_0 = 0 (the prefix form; the total transition is the prefix's last step). A copy, so that
    keeping it (streaming, chunked prefill) does not keep every step's state alive."""
    if not _check_flag("return_final_state", return_final_state):
        return out
    last = 0 if reverse else -1
    if isinstance(out, tuple):
        return (*out, out[-1][:, last].clone())
    return out, out[:, last].clone()


def _check_flag(name: str, value) -> bool:
    """``value``, which must be True or False (not merely truthy): a flag named ``name``."""
    if value is not True and value is not False:
        raise TypeError(f"{name} must be True or False; got {value!r}")
    return value


def _packed(kind: str, op, name: str, coeffs, inputs, h0, cu_seqlens, tail: tuple, layout: str,
            return_final_state, h0_name: str = "h0", reverse: bool = False, return_prefix=None):
    """``op``'s states of the packed sequences ``cu_seqlens`` (``scankit.packed``): each from
    its own h0[n] (zeros when None), final states (N, ...) with ``return_final_state``;
    ``reverse``: ``op`` scans from the end (given ``reverse=True``), each sequence from its last step.
    ``return_prefix``: the affine ops' flag (None for the log op), which must be False."""
    op_kwargs = {}
    if return_prefix is not None:
        if return_prefix:
            raise ValueError("cu_seqlens gives each packed sequence's states: pass return_prefix=False")
        op_kwargs["return_prefix"] = False
    starts, ends = packed.offsets(cu_seqlens, coeffs, name)
    if reverse:  # a sequence's scan starts at its last step and ends at its first
        starts, ends = ends - 1, starts + 1
        op_kwargs["reverse"] = True
    if h0 is not None:
        _check_tensor(h0_name, h0, 1 + len(tail), layout)
        _check_same(name, coeffs, h0_name, h0)
        _check_shape(h0_name, h0, (len(starts), *tail), layout)
    _check_flag("return_final_state", return_final_state)
    inputs = packed.with_initial_states(kind, coeffs, inputs, h0, starts)
    if kind == "matrix":
        h = op(packed.reset_coefficients(kind, coeffs, starts), inputs, **op_kwargs)
    else:  # the elementwise ops reset in their kernels (the eager references on a copy)
        h = op(coeffs, inputs, resets=starts, **op_kwargs)
    return (h, packed.final_states(h, ends)) if return_final_state else h


def _log_scan_with_resets(log_coeffs: torch.Tensor, log_values: torch.Tensor, resets: torch.Tensor,
                          reverse: bool = False) -> torch.Tensor:
    """The log op from h_0 = 0 whose carry restarts at the rows ``resets`` (packed sequences):
    the kernels reset in place (int8 flags); the eager path writes log a = -inf there into a
    copy and runs the reference's log-space doubling (Heinsen's running sum cannot pass a -inf)."""
    no_state = log_coeffs.new_full((log_coeffs.shape[0], log_coeffs.shape[2]), float("-inf"))
    eager = _time_reversed(reference.parallel_scan_log_resets, reverse)
    return dispatch.run(
        "parallel_scan_log",
        log_coeffs.device,
        lambda: eager(packed.reset_coefficients("log", log_coeffs, resets), log_values, no_state),
        lambda k: k.parallel_scan_log(log_coeffs, log_values, no_state, reverse, packed.flags(resets, log_coeffs.shape[1])),
    )


def _time_reversed(op, reverse):
    """The eager reference ``op`` (time at dim 1) scanning from the end when ``reverse``:
    h_t = a_t h_{t+1} + b_t from h0 = h_{T+1}, the outputs in the inputs' time order. The
    time-indexed inputs go in flipped and the outputs come back flipped (copies, with their
    gradients); the kernels need none."""
    if not _check_flag("reverse", reverse):
        return op

    def flip(x):
        return x.flip(1) if isinstance(x, torch.Tensor) and x.dim() > 2 else x

    def run(*time_inputs, **kwargs):
        out = op(*map(flip, time_inputs), **kwargs)
        return tuple(map(flip, out)) if isinstance(out, tuple) else flip(out)
    return run


def _along_dim(dim, op, time_inputs: tuple, kwargs: dict):
    """``op`` (time at dim 1) along ``dim`` of the inputs: an index into the first input's
    leading three dims (batch, time, channels / blocks), negative counted on its dims. The
    inputs go in as views with that dim moved to 1 (the kernels read any strides), the outputs
    come back as views with time where it came from; h0 and the final state have no time dim."""
    if dim == 1 and type(dim) is int:
        return op(*time_inputs, **kwargs)
    if isinstance(dim, bool) or not hasattr(dim, "__index__"):
        raise TypeError(f"dim must be an int; got {type(dim).__name__}")
    dim = operator.index(dim)  # numpy and 0-d integer tensors too
    first = time_inputs[0]
    if not isinstance(first, torch.Tensor):
        return op(*time_inputs, **kwargs)  # the op's own check names the argument
    d = dim + first.dim() if dim < 0 else dim
    if not 0 <= d <= 2:
        raise ValueError(f"dim must pick one of the first three dims (batch, time, channels) of the "
                         f"{first.dim()}-D input {tuple(first.shape)}; got dim={dim}")
    moved = [x.movedim(d, 1) if isinstance(x, torch.Tensor) and x.dim() > 2 else x for x in time_inputs]
    try:
        out = op(*moved, **kwargs)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{exc} (the shapes with dim={dim} moved to 1)") from None
    back = lambda x: x.movedim(1, d)  # noqa: E731
    if not isinstance(out, tuple):
        return back(out)
    if kwargs.get("return_final_state") is True:
        return (*map(back, out[:-1]), out[-1])
    return tuple(map(back, out))


def parallel_scan_log(log_coeffs: torch.Tensor, log_values: torch.Tensor, *, log_h0=None,
                      return_final_state: bool = False, dim: int = 1, reverse: bool = False, cu_seqlens=None):
    """Positive scalar recurrence in log space.

    log_coeffs (B,T,D) = log a_t; log_values (B,T+1,D): slot 0 = log h_0, slots 1..T =
    log b_t. Returns h_1..h_T (B,T,D) of ``h_t = a_t h_{t-1} + b_t``. Or, with ``log_h0``
    (B,D) = log h_0, log_values (B,T,D) = log b_1..log b_T: the same recurrence without
    concatenating h_0 onto the values first (what ``MinGRU`` does). ``return_final_state=True``
    returns ``(h, h_T)`` with h_T (B,D); pass ``log_h0=h_T.log()`` to the next piece.
    ``dim``: the time dim (default 1; ``dim=-1`` scans (B, D, T) inputs in place, outputs alike).
    ``reverse=True`` scans from the end, ``h_t = a_t h_{t+1} + b_t`` from h_{T+1} (slot 0 of
    log_values, or ``log_h0``); h comes back in the inputs' time order, the final state is h_1.
    ``cu_seqlens`` (N+1,) int32/int64 offsets: the batch of 1 packs N sequences (log_values (1, T, D),
    ``log_h0`` (N, D) or h_0 = 0), each scanned alone, final states (N, D) (``scankit.packed``).

    Range: any finite log inputs, -inf included (a = 0, b = 0, h_0 = 0; the eager reference
    takes no a = 0: NaN from there on, except packed, see cu_seqlens). The Triton kernel
    carries log h between chunks and redoes a chunk in log space wherever exp() of its
    inputs or states would leave fp32, so h comes out to fp32 rounding whatever the magnitudes
    along the way; a state beyond fp32 is inf (or 0) as an fp32 value, and its gradient is
    not usable. The eager reference (the CPU path) is Heinsen's form in the input precision:
    in fp32 its relative error grows with T (about 5e-6 at T = 1024, 2e-5 at 4097, 9e-5 at
    16384 on minGRU-like inputs, where the kernel stays near 1e-7) because it subtracts a
    running sum of log_coeffs that grows with T; give it float64 inputs for long sequences.
    """
    _check_flag("reverse", reverse)
    return _along_dim(dim, _parallel_scan_log, (log_coeffs, log_values),
                      dict(log_h0=log_h0, return_final_state=return_final_state, cu_seqlens=cu_seqlens, reverse=reverse))


def _log_eager(log_coeffs, log_values, log_h0, reverse: bool):
    """The eager log reference, from the end when ``reverse``: the slot-0 form's log h_0 then
    passed apart (views), since the reference flips time and slot 0 is no step (the kernels
    read slot 0 in place either way)."""
    if reverse and log_h0 is None:
        log_h0, log_values = log_values[:, 0], log_values[:, 1:]
    return _time_reversed(reference.parallel_scan_log, reverse)(log_coeffs, log_values, log_h0)


def _parallel_scan_log(log_coeffs: torch.Tensor, log_values: torch.Tensor, *, log_h0=None,
                       return_final_state: bool = False, cu_seqlens=None, reverse: bool = False):
    _check_tensor("log_coeffs", log_coeffs, 3, "(B, T, D)")
    _check_time("log_coeffs", log_coeffs)
    B, T, D = log_coeffs.shape
    if cu_seqlens is not None:
        _check_tensor("log_values", log_values, 3, "(1, T, D) with cu_seqlens")
        _check_same("log_coeffs", log_coeffs, "log_values", log_values)
        _check_shape("log_values", log_values, (B, T, D), "(1, T, D) like log_coeffs with cu_seqlens (h_0: log_h0 (N, D))")
        return _packed("log", _log_scan_with_resets, "log_coeffs", log_coeffs, log_values, log_h0, cu_seqlens, (D,),
                       "(N, D)", return_final_state, h0_name="log_h0", reverse=reverse)
    if log_h0 is None:
        _check_tensor("log_values", log_values, 3, "(B, T+1, D)")
        _check_same("log_coeffs", log_coeffs, "log_values", log_values)
        _check_shape("log_values", log_values, (B, T + 1, D), "(B, T+1, D), slot 0 = log h_0 (or pass log_h0=)")
    else:
        _check_tensor("log_values", log_values, 3, "(B, T, D) with log_h0")
        _check_same("log_coeffs", log_coeffs, "log_values", log_values)
        _check_shape("log_values", log_values, (B, T, D), "(B, T, D) like log_coeffs when log_h0 is given")
        _check_tensor("log_h0", log_h0, 2, "(B, D)")
        _check_same("log_coeffs", log_coeffs, "log_h0", log_h0)
        _check_shape("log_h0", log_h0, (B, D), "(B, D)")
    return _with_final(dispatch.run(
        "parallel_scan_log",
        log_coeffs.device,
        lambda: _log_eager(log_coeffs, log_values, log_h0, reverse),
        lambda k: k.parallel_scan_log(log_coeffs, log_values, log_h0, reverse),
    ), return_final_state, reverse)


def linear_scan(a: torch.Tensor, b: torch.Tensor, *, h0=None, return_prefix: bool = True,
                return_final_state: bool = False, dim: int = 1, reverse: bool = False,
                cu_seqlens=None):
    """Elementwise affine scan ``h_t = a_t h_{t-1} + b_t`` over a, b (B,T,D).

    Returns ``(A, Bc)``: the running product of a and the solution from h_0 = 0 (so
    ``h = A * h0 + Bc``); with ``return_prefix=False`` only the states h (B,T,D) from
    ``h0`` (B,D) (zeros when None). ``return_final_state=True`` appends h_T (B,D): with
    ``return_prefix=False`` and ``h0``, scanning a sequence in pieces, each from the last
    piece's h_T, equals one call. ``dim``: the time dim (default 1; ``dim=-1`` for (B, D, T)).
    ``reverse``, ``cu_seqlens``: the module doc.
    """
    _check_flag("reverse", reverse)
    return _along_dim(dim, _linear_scan, (a, b),
                      dict(h0=h0, return_prefix=return_prefix, return_final_state=return_final_state,
                           cu_seqlens=cu_seqlens, reverse=reverse))


def _linear_scan(a: torch.Tensor, b: torch.Tensor, *, h0=None, return_prefix: bool = True,
                 return_final_state: bool = False, cu_seqlens=None, reverse: bool = False, resets=None):
    _check_tensor("a", a, 3, "(B, T, D)")
    _check_time("a", a)
    _check_tensor("b", b, 3, "(B, T, D)")
    _check_same("a", a, "b", b)
    _check_shape("b", b, a.shape, "(B, T, D) like a")
    if cu_seqlens is not None:
        return _packed("elementwise", _linear_scan, "a", a, b, h0, cu_seqlens, (a.shape[2],), "(N, D)",
                       return_final_state, reverse=reverse, return_prefix=return_prefix)
    _check_h0(h0, a, "a", (a.shape[0], a.shape[2]), "(B, D)", return_prefix)
    eager = _time_reversed(reference.linear_scan, reverse)
    # resets (from _packed): the rows where a packed sequence's scan begins; the kernels reset there in place
    return _with_final(dispatch.run(
        "linear_scan",
        a.device,
        lambda: eager(a if resets is None else packed.reset_coefficients("elementwise", a, resets), b, h0=h0,
                      return_prefix=return_prefix),
        lambda k: k.linear_scan(a, b, h0=h0, return_prefix=return_prefix, reverse=reverse,
                                reset=None if resets is None else packed.flags(resets, a.shape[1])),
    ), return_final_state, reverse)


def _check_projection(name: str, proj, n: int, layout: str, h0) -> int:
    """Validate a gated scan's projection (B, T, n D) and its h0 (B, D); returns D."""
    _check_tensor(name, proj, 3, layout)
    _check_time(name, proj)
    B, T, nD = proj.shape
    if nD % n or nD < n:
        raise ValueError(f"{name} must have shape {layout} (a last dim divisible by {n}); got {tuple(proj.shape)}")
    if h0 is not None:
        _check_tensor("h0", h0, 2, "(B, D)")
        _check_same(name, proj, "h0", h0)
        _check_shape("h0", h0, (B, nD // n), "(B, D)")
    return nD // n


def mingru_scan(gate_hidden: torch.Tensor, *, h0=None, return_final_state: bool = False):
    """minGRU's recurrence from its pre-activations, the gate math fused into the scan.

    gate_hidden (B, T, 2D) = [k | v], the gate and candidate pre-activations side by side (as
    one projection gives them, ``MinGRU.to_gate_hidden``). Returns h (B, T, D) of
    ``h_t = (1 - z_t) h_{t-1} + z_t g(v_t)``, z_t = sigmoid(k_t), g(v) = v + 1/2 (v >= 0),
    sigmoid(v) (v < 0), from ``h0`` (B, D) >= 0 (zeros when None: minGRU's states are
    positive). ``return_final_state=True`` returns ``(h, h_T)``; pass ``h0=h_T`` to the next piece.
    Gradients flow to gate_hidden (one (B, T, 2D) tensor, as the projection wants it) and h0.
    The kernel reads k, v once and does the gate math in registers, forward and backward (the
    eager path is ``parallel_scan_log`` of the log terms). At g'(0) the kernel takes the
    right-hand derivative 1 (g has a kink there; ``log_g``'s autograd gives 0)."""
    _check_projection("gate_hidden", gate_hidden, 2, "(B, T, 2D) = [k | v]", h0)
    if h0 is not None and dispatch.checks_values(h0) and bool((h0 < 0).any()):
        raise ValueError("h0 must be >= 0 everywhere (minGRU's states are positive)")
    return _with_final(dispatch.run(
        "mingru_scan",
        gate_hidden.device,
        lambda: reference.mingru_scan(gate_hidden, h0),
        lambda k: k.mingru_scan(gate_hidden, h0),
    ), return_final_state)


def signed_mingru_scan(proj: torch.Tensor, *, h0=None, coupled: bool = False, return_final_state: bool = False):
    """The signed minGRU's recurrence from its pre-activations, the gate math fused into the scan.

    proj (B, T, 3D) = [s | zk | v] (``SignedMinGRU.proj``). Returns h (B, T, D) of
    ``h_t = a_t h_{t-1} + z_t v_t``, z_t = sigmoid(zk_t), a_t = tanh(s_t), or with ``coupled``
    a_t = (1 - z_t) tanh(s_t), from ``h0`` (B, D) (zeros when None); ``return_final_state=True``
    returns ``(h, h_T)``. Gradients flow to proj (one (B, T, 3D) tensor) and h0. The kernel
    reads s, zk, v once and forms a, b in registers, forward and backward (the eager path is
    ``linear_scan`` of the terms)."""
    _check_projection("proj", proj, 3, "(B, T, 3D) = [s | zk | v]", h0)
    _check_flag("coupled", coupled)
    return _with_final(dispatch.run(
        "signed_mingru_scan",
        proj.device,
        lambda: reference.signed_mingru_scan(proj, h0, coupled),
        lambda k: k.signed_mingru_scan(proj, h0, coupled),
    ), return_final_state)


def matrix_scan(M: torch.Tensor, b: torch.Tensor, *, h0=None, return_prefix: bool = True,
                return_final_state: bool = False, dim: int = 1, reverse: bool = False,
                cu_seqlens=None):
    """2 x 2 block affine scan: M (B,T,n,2,2), b (B,T,n,2).

    Returns ``(A, Bc)`` of shapes (B,T,n,2,2), (B,T,n,2); with ``return_prefix=False``
    only h (B,T,n,2) from ``h0`` (B,n,2). ``return_final_state=True`` appends h_T (B,n,2).
    ``dim``: the time dim among the first three (default 1).
    ``reverse``, ``cu_seqlens``: the module doc.
    """
    _check_flag("reverse", reverse)
    return _along_dim(dim, _matrix_scan, (M, b),
                      dict(h0=h0, return_prefix=return_prefix, return_final_state=return_final_state,
                           cu_seqlens=cu_seqlens, reverse=reverse))


def _matrix_scan(M: torch.Tensor, b: torch.Tensor, *, h0=None, return_prefix: bool = True,
                 return_final_state: bool = False, cu_seqlens=None, reverse: bool = False):
    _check_tensor("M", M, 5, "(B, T, n, 2, 2)")
    _check_time("M", M)
    if M.shape[-2:] != (2, 2):
        raise ValueError(f"M must have shape (B, T, n, 2, 2); got {tuple(M.shape)}")
    _check_tensor("b", b, 4, "(B, T, n, 2)")
    _check_same("M", M, "b", b)
    _check_shape("b", b, M.shape[:3] + (2,), "(B, T, n, 2)")
    if cu_seqlens is not None:
        return _packed("matrix", _matrix_scan, "M", M, b, h0, cu_seqlens, (M.shape[2], 2), "(N, n, 2)",
                       return_final_state, reverse=reverse, return_prefix=return_prefix)
    _check_h0(h0, M, "M", (M.shape[0], M.shape[2], 2), "(B, n, 2)", return_prefix)
    eager = _time_reversed(reference.matrix_scan, reverse)
    return _with_final(dispatch.run(
        "matrix_scan",
        M.device,
        lambda: eager(M, b, h0=h0, return_prefix=return_prefix),
        lambda k: k.matrix_scan(M, b, h0=h0, return_prefix=return_prefix, reverse=reverse),
    ), return_final_state, reverse)


def matrix_affine_scan(A: torch.Tensor, B: torch.Tensor, *, h0=None, return_prefix: bool = True,
                       return_final_state: bool = False, dim: int = 1, reverse: bool = False,
                       cu_seqlens=None):
    """k x k block affine scan: A (B,T,n,k,k), B (B,T,n,k,v).

    Returns ``(Abar, Bbar)`` with ``Abar_t = A_t Abar_{t-1}``, ``Bbar_t = A_t Bbar_{t-1} + B_t``;
    with ``return_prefix=False`` only h (B,T,n,k,v) from ``h0`` (B,n,k,v).
    ``return_final_state=True`` appends h_T (B,n,k,v). ``dim``: the time dim among the first three.
    ``reverse``, ``cu_seqlens``: the module doc.
    """
    _check_flag("reverse", reverse)
    return _along_dim(dim, _matrix_affine_scan, (A, B),
                      dict(h0=h0, return_prefix=return_prefix, return_final_state=return_final_state,
                           cu_seqlens=cu_seqlens, reverse=reverse))


def _matrix_affine_scan(A: torch.Tensor, B: torch.Tensor, *, h0=None, return_prefix: bool = True,
                        return_final_state: bool = False, cu_seqlens=None, reverse: bool = False):
    _check_tensor("A", A, 5, "(B, T, n, k, k)")
    _check_time("A", A)
    if A.shape[-1] != A.shape[-2] or A.shape[-1] < 1:
        raise ValueError(f"A must have square blocks (B, T, n, k, k); got {tuple(A.shape)}")
    _check_tensor("B", B, 5, "(B, T, n, k, v)")
    _check_same("A", A, "B", B)
    if tuple(B.shape[:4]) != tuple(A.shape[:4]) or B.shape[4] < 1:
        raise ValueError(f"B must have shape (B, T, n, k, v) = {tuple(A.shape[:4])} + (v,); got {tuple(B.shape)}")
    if cu_seqlens is not None:
        return _packed("matrix", _matrix_affine_scan, "A", A, B, h0, cu_seqlens, (A.shape[2], A.shape[3], B.shape[4]),
                       "(N, n, k, v)", return_final_state, reverse=reverse, return_prefix=return_prefix)
    _check_h0(h0, A, "A", (A.shape[0], A.shape[2], A.shape[3], B.shape[4]), "(B, n, k, v)", return_prefix)
    eager = _time_reversed(reference.matrix_affine_scan, reverse)
    return _with_final(dispatch.run(
        "matrix_affine_scan",
        A.device,
        lambda: eager(A, B, h0=h0, return_prefix=return_prefix),
        lambda k: k.matrix_affine_scan(A, B, h0=h0, return_prefix=return_prefix, reverse=reverse),
    ), return_final_state, reverse)
