"""Sequence-parallel scans: time sharded over the ranks of a ``torch.distributed`` process group.

Each rank holds a contiguous piece of time (rank 0 the first, shards of any lengths >= 1) of
inputs whose other dims agree across ranks, and calls the same function with the same
``group``. A first-order scan shards cleanly:

1. each rank scans its shard from zero with the ordinary ops (kernels on a GPU), keeping the
   prefix transition P_t and the states from zero Z_t of the part that the carry reaches;
2. the ranks all-gather one summary each: the shard's total transition T_r (zero where a
   packed sequence starts inside and blocks the carry) and its exit state E_r;
3. each rank folds the summaries of the ranks before it, c <- T_j c + E_j, into its carry-in c
   and applies it: h_t = P_t c + Z_t.

The backward is autograd through the same steps: the local ops' backward kernels (reverse
scans) and the gather's backward, an all-reduce of the summaries' gradients, so gradients flow
from later shards back to earlier ones. Every rank must run the backward (a collective).
``reverse=True`` runs the carry from the last rank to the first.

- ``h0`` is read on the rank where the scan starts (rank 0; the last rank with ``reverse``), and
  per packed sequence on the rank where that sequence starts: pass the same tensor on every rank
  (replicated, like a parameter). Its gradient lands on that rank (zeros elsewhere): summed over
  ranks, as data-parallel training does for a replicated parameter, it is the whole gradient.
- ``return_final_state=True``: every rank gets the final state (dense: h_T of the whole sequence;
  packed: (N, ...) each sequence's last state, wherever it lies).
- ``cu_seqlens``: the offsets of the whole packed batch (all shards together, the same tensor on
  every rank, on the CPU); a sequence may cross any number of shard boundaries.
- Inputs are checked on every rank and the outcome shared before any scan: a bad input on one
  rank raises on every rank (naming that rank) instead of leaving the others waiting.

Each call makes one object all-gather (check outcomes, shapes, lengths) and one tensor all-gather
of the summaries; its arguments are checked by the op itself on the shard's first step before
either (a small extra call, so that no rank enters a collective with inputs the op would reject).
Per rank the carried part costs the local scan in its prefix form plus a fix-up pass; the ops'
own costs otherwise.
"""
from __future__ import annotations

import functools

import torch
import torch.distributed as dist

from . import ops, packed


class _Gather(torch.autograd.Function):
    """(world, *x.shape): every rank's ``x``; the backward sums each rank's gradient of row r
    onto rank r (an all-reduce, which every backend has)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        out = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(out, x.contiguous(), group=group)
        return torch.stack(out)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad[dist.get_rank(ctx.group)], None


def _safe_log_apply(log_t: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """exp(log_t) * c for c >= 0 without overflow in exp(log_t) (a growing transition times a
    small carry): exp(log_t + log c), and 0 with a zero gradient where c = 0 or log_t = -inf."""
    live = (c > 0) & (log_t > float("-inf"))
    logs = torch.where(live, log_t, torch.zeros_like(log_t)) + torch.where(live, c, torch.ones_like(c)).log()
    return torch.where(live, logs.exp(), torch.zeros_like(logs))


class _Kind:
    """One op's algebra: its local scans (``prefix``: from zero, (P, Z); ``states``: from h0, packed
    or not), a transition acting on a state (``apply``) and on a transition (``compose``), the
    transition that stops a carry (``blocked``) and the one that passes it unchanged (``identity``)."""

    def __init__(self, name, prefix, states, apply, compose=None, blocked=None, identity=None):
        self.name, self.prefix, self.states = name, prefix, states
        self.apply, self.compose = apply, compose
        self.blocked = blocked or (lambda like, shape: like.new_zeros(shape))
        self.identity = identity

    def step(self, T, c, E):
        """T c + E: a carry through a summary, or a shard's fix-up (one fused pass where torch has one)."""
        return torch.addcmul(E, T, c) if self.apply is torch.mul else self.apply(T, c) + E


def _log_prefix(log_coeffs, log_values, reverse):
    no_state = log_coeffs.new_full((log_coeffs.shape[0], log_coeffs.shape[2]), float("-inf"))
    Z = ops.parallel_scan_log(log_coeffs, log_values, log_h0=no_state, reverse=reverse)
    P = log_coeffs.flip(1).cumsum(1).flip(1) if reverse else log_coeffs.cumsum(1)
    return P, Z


def _log_states(log_coeffs, log_values, log_h0, reverse, cu_seqlens):
    if log_h0 is None and cu_seqlens is None:  # the dense log op takes h_0 = 0 as log h_0 = -inf
        log_h0 = log_coeffs.new_full((log_coeffs.shape[0], log_coeffs.shape[2]), float("-inf"))
    return ops.parallel_scan_log(log_coeffs, log_values, log_h0=log_h0, reverse=reverse, cu_seqlens=cu_seqlens)


def _affine(op):
    def prefix(coeffs, inputs, reverse):
        return op(coeffs, inputs, reverse=reverse)

    def states(coeffs, inputs, h0, reverse, cu_seqlens):
        return op(coeffs, inputs, h0=h0, return_prefix=False, reverse=reverse, cu_seqlens=cu_seqlens)
    return prefix, states


def _matvec(M, c):
    return (M @ c.unsqueeze(-1)).squeeze(-1)


def _eye(like, shape):
    return torch.eye(shape[-1], dtype=like.dtype, device=like.device).expand(shape)


KINDS = {
    "parallel_scan_log": _Kind("parallel_scan_log", _log_prefix, _log_states, _safe_log_apply,
                               blocked=lambda like, shape: like.new_full(shape, float("-inf"))),
    "linear_scan": _Kind("linear_scan", *_affine(ops.linear_scan), torch.mul, torch.mul,
                         identity=lambda like, shape: like.new_ones(shape)),
    "matrix_scan": _Kind("matrix_scan", *_affine(ops.matrix_scan), _matvec, torch.matmul, identity=_eye),
    "matrix_affine_scan": _Kind("matrix_affine_scan", *_affine(ops.matrix_affine_scan), torch.matmul, torch.matmul,
                                identity=_eye),
}


def _group(group):
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("scankit.distributed needs an initialised torch.distributed process group "
                           "(torch.distributed.init_process_group) on every rank")
    return dist.group.WORLD if group is None else group


def _agree(group, error, signature, length) -> list[int]:
    """Share each rank's check outcome, shape signature and shard length; raise on every rank
    if any rank's inputs were rejected or the ranks' shapes disagree. The shard lengths."""
    shared = [None] * dist.get_world_size(group)
    dist.all_gather_object(shared, (None if error is None else f"{type(error).__name__}: {error}", signature, length),
                           group=group)
    rank = dist.get_rank(group)
    if error is not None:
        raise error
    for r, (message, _, _) in enumerate(shared):
        if message is not None:
            raise ValueError(f"rank {r} of the group rejected its inputs: {message}")
    for r, (_, theirs, _) in enumerate(shared):
        if theirs != signature:
            raise ValueError(f"the ranks' inputs must agree in every dim but time and in dtype: rank {rank} has "
                             f"{signature}, rank {r} has {theirs}")
    return [length for _, _, length in shared]


def _check_local(kind: _Kind, coeffs, inputs, h0, return_prefix, cu_seqlens, reverse, return_final_state):
    """The ops' own checks of this rank's shard, run on its first step (and of ``h0``)."""
    ops._check_flag("reverse", reverse)
    ops._check_flag("return_final_state", return_final_state)
    ops._check_flag("return_prefix", return_prefix)
    for name, x in (("the coefficients", coeffs), ("the inputs", inputs)):
        if not isinstance(x, torch.Tensor) or x.dim() < 3 or x.shape[1] < 1:
            raise ValueError(f"{kind.name}: {name} must be this rank's shard, a tensor with T >= 1 steps at dim 1; "
                             f"got {ops._describe(x)}")
    if return_prefix and (h0 is not None or cu_seqlens is not None):
        raise ValueError("h0 and cu_seqlens give states: pass return_prefix=False")
    one = tuple(x[:, :1].detach() for x in (coeffs, inputs))
    dense_h0 = None if cu_seqlens is not None or h0 is None else h0.detach()
    if kind.name == "parallel_scan_log":
        out = ops.parallel_scan_log(*one, log_h0=one[0][:, 0] if dense_h0 is None else dense_h0)
    else:
        out = getattr(ops, kind.name)(*one, h0=dense_h0, return_prefix=return_prefix)
    if cu_seqlens is not None:
        if coeffs.shape[0] != 1:
            raise ValueError(f"cu_seqlens packs the sequences along time in a batch of 1; got shape {tuple(coeffs.shape)}")
        if h0 is not None:
            name, tail = ("log_h0" if kind.name == "parallel_scan_log" else "h0"), tuple(out.shape[2:])
            ops._check_tensor(name, h0, 1 + len(tail), "(N, ...) one per packed sequence")
            ops._check_same("the coefficients", coeffs, name, h0)
            n = cu_seqlens.numel() - 1 if isinstance(cu_seqlens, torch.Tensor) else -1
            ops._check_shape(name, h0, (n,) + tail, "(N, ...) one per packed sequence")


class _Plan:
    """How rank ``q``'s shard [start, start + L) meets the scan (every rank computes every rank's
    plan from the shard lengths and the offsets). ``head``: the local slice the carry from the
    neighbour reaches (empty where the shard's first step in scan order starts a scan); ``fresh``:
    the slice whose sequences start here, with their local offsets ``cuts`` (None: dense) and the
    index ``first`` of the first; ``final``: the sequence whose scan ends at the head's end, if any."""

    def __init__(self, start, L, reverse, bounds=None, dense_continues=True):
        self.start, self.L = start, L
        if bounds is None:
            self.continues = dense_continues
            self.head, self.fresh = (slice(0, L), slice(L, L)) if dense_continues else (slice(0, 0), slice(0, L))
            self.cuts, self.first, self.final = None, 0, None
            return
        starts, ends = bounds[:-1], bounds[1:]
        end = start + L
        if not reverse:
            self.continues = start not in starts
            inner = [x - start for x in starts if start < x < end]
            c = (inner[0] if inner else L) if self.continues else 0
            self.head, self.fresh = slice(0, c), slice(c, L)
            self.cuts = [x - c for x in inner if x >= c] if self.continues else [0] + inner
            self.cuts = self.cuts + [L - c]
            self.first = next((n for n, x in enumerate(starts) if x >= start + c), len(starts))
            self.final = ends.index(start + c) if self.continues and start + c in ends else None
        else:
            self.continues = end not in ends
            inner = [x - start for x in ends if start < x < end]
            c = (inner[-1] if inner else 0) if self.continues else L
            self.head, self.fresh = slice(c, L), slice(0, c)
            self.cuts = [0] + [x for x in inner if x < c] + [c]
            self.first = next((n for n, x in enumerate(ends) if x > start), len(ends))
            self.final = starts.index(start + c) if self.continues and start + c in starts else None

    def has(self, part) -> bool:
        part = getattr(self, part)
        return part.stop > part.start


class _Tie(torch.autograd.Function):
    """``x`` unchanged, made to depend on ``dep``: every rank's outputs reach the summaries'
    gather, so every rank runs its backward (a collective) whatever its own part of the work."""

    @staticmethod
    def forward(ctx, x, dep):
        ctx.dep = (dep.shape, dep.dtype, dep.device)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        shape, dtype, device = ctx.dep
        return grad, torch.zeros(shape, dtype=dtype, device=device)


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(x.shape[0], -1)


def _scan(kind_name: str, coeffs, inputs, *, h0=None, return_prefix=False, return_final_state=False,
          reverse=False, cu_seqlens=None, group=None):
    kind = KINDS[kind_name]
    group = _group(group)
    error = None
    try:
        _check_local(kind, coeffs, inputs, h0, return_prefix, cu_seqlens, reverse, return_final_state)
    except (TypeError, ValueError) as exc:
        error = exc
    signature = None if error is not None else (
        tuple(coeffs.shape[:1]) + tuple(coeffs.shape[2:]), tuple(inputs.shape[:1]) + tuple(inputs.shape[2:]),
        str(coeffs.dtype), coeffs.device.type)
    lengths = _agree(group, error, signature, coeffs.shape[1] if error is None else 0)
    rank, world = dist.get_rank(group), len(lengths)
    order = list(range(world))[::-1] if reverse else list(range(world))
    offsets = [sum(lengths[:q]) for q in range(world)]
    exit_at = 0 if reverse else -1
    bounds = None
    if cu_seqlens is not None:
        total = sum(lengths)
        host = cu_seqlens.cpu() if isinstance(cu_seqlens, torch.Tensor) else cu_seqlens  # read on the host anyway
        bounds = packed.offsets(host, torch.empty((1, total, 0)), "the packed inputs (all shards together)")[0]
        bounds = bounds.tolist() + [total]
    plans = [_Plan(offsets[q], lengths[q], reverse, bounds, return_prefix or q != order[0]) for q in range(world)]
    me = plans[rank]

    # 1. this shard from zero where the carry reaches (prefix form), and the scans that start here
    P = Z = fresh = None
    if me.has("head"):
        P, Z = kind.prefix(coeffs[:, me.head], inputs[:, me.head], reverse)
    if me.has("fresh"):
        if bounds is None:
            fresh = kind.states(coeffs, inputs, h0, reverse, None)
        else:
            local = torch.tensor(me.cuts, dtype=torch.int64)
            h0_fresh = None if h0 is None else h0[me.first:me.first + len(me.cuts) - 1]
            fresh = kind.states(coeffs[:, me.fresh], inputs[:, me.fresh], h0_fresh, reverse, local)

    # 2. one summary per rank: the transition to the exit and the exit state (and, packed, the
    #    head's end and the final states of the sequences that end here), all-gathered
    state = (fresh if fresh is not None else Z)[:, exit_at]
    blocked = kind.blocked(coeffs, coeffs[:, 0].shape)
    T_exit, E_exit = (blocked, state) if fresh is not None else (P[:, exit_at], state)
    parts = [T_exit, E_exit]
    if bounds is not None:  # packed: B = 1
        P_end, Z_end = (P[:, exit_at], Z[:, exit_at]) if P is not None else (blocked, torch.zeros_like(state))
        finals = state.new_zeros((len(bounds) - 1,) + tuple(state.shape[1:]))
        if fresh is not None:
            last = [me.cuts[k] if reverse else me.cuts[k + 1] - 1 for k in range(len(me.cuts) - 1)]
            if reverse:  # the first may have begun on an earlier rank: its scan ends there
                ends_here = [k for k in range(len(last)) if k > 0 or offsets[rank] in bounds]
            else:  # the last may go on into a later rank
                ends_here = [k for k in range(len(last)) if me.fresh.start + me.cuts[k + 1] < me.L
                             or offsets[rank] + me.L in bounds]
            if ends_here:
                rows = torch.tensor([me.first + k for k in ends_here])
                finals = finals.index_put((rows,), fresh[0, [last[k] for k in ends_here]])
        parts += [P_end, Z_end, finals.reshape(1, -1)]
    sizes = [_rows(x).shape[1] for x in parts]
    gathered = _Gather.apply(torch.cat([_rows(x) for x in parts], dim=1), group)
    pieces = gathered.split(sizes, dim=2)
    Ts, Es = (pieces[i].reshape(world, *parts[i].shape) for i in (0, 1))

    # 3. fold the summaries before each rank into its carry-in; apply this rank's
    if return_prefix:  # (A, Bc) of the whole sequence: the transitions before this rank compose too
        Tc, Ec = kind.identity(E_exit, T_exit.shape), torch.zeros_like(E_exit)
        for j in order[:order.index(rank)]:
            Tc, Ec = kind.compose(Ts[j], Tc), kind.step(Ts[j], Ec, Es[j])
        out = (_Tie.apply(kind.compose(P, Tc.unsqueeze(1)), gathered), kind.step(P, Ec.unsqueeze(1), Z))
        if not return_final_state:
            return out
        final = torch.zeros_like(E_exit)
        for j in order:
            final = kind.step(Ts[j], final, Es[j])
        return (*out, final)

    carries, carry = {}, torch.zeros_like(E_exit)
    for j in order:
        carries[j] = carry
        carry = kind.step(Ts[j], carry, Es[j])
    h = [kind.step(P, carries[rank].unsqueeze(1), Z)] if P is not None else []
    h = h + [fresh] if fresh is not None else h
    h = h[0] if len(h) == 1 else torch.cat(h[::-1] if reverse else h, dim=1)
    h = _Tie.apply(h, gathered)
    if not return_final_state:
        return h
    if bounds is None:
        return h, carry  # the fold over every rank: the exit state of the whole sequence
    P_ends, Z_ends = (pieces[i].reshape(world, *parts[i].shape) for i in (2, 3))
    finals = pieces[4].reshape(world, *finals.shape).sum(0)
    for q, plan in enumerate(plans):  # the sequences whose scan ends at a rank's head end
        if plan.has("head") and plan.final is not None:
            value = kind.step(P_ends[q], carries[q], Z_ends[q])
            finals = finals.index_put((torch.tensor([plan.final]),), value)
    return h, finals


def parallel_scan_log(log_coeffs, log_values, *, log_h0=None, return_final_state=False, dim=1, reverse=False,
                      cu_seqlens=None, group=None):
    """``scankit.parallel_scan_log`` over time sharded across ``group``'s ranks (the module doc):
    log_coeffs, log_values (B, T_r, D) this rank's shard; ``log_h0`` (B, D) or, packed, (N, D);
    None: h_0 = 0. Returns h (B, T_r, D), and with ``return_final_state`` the final state."""
    return ops._along_dim(dim, functools.partial(_log_entry, group=group), (log_coeffs, log_values),
                          dict(log_h0=log_h0, return_final_state=return_final_state, reverse=reverse,
                               cu_seqlens=cu_seqlens))


def _log_entry(log_coeffs, log_values, *, log_h0, group, **kwargs):
    return _scan("parallel_scan_log", log_coeffs, log_values, h0=log_h0, group=group, **kwargs)


def _affine_entry(name):
    def entry(coeffs, inputs, *, group, **kwargs):
        return _scan(name, coeffs, inputs, group=group, **kwargs)
    return entry


def _affine_op(name: str, doc: str):
    def op(coeffs, inputs, *, h0=None, return_prefix=True, return_final_state=False, dim=1, reverse=False,
           cu_seqlens=None, group=None):
        return ops._along_dim(dim, functools.partial(_affine_entry(name), group=group), (coeffs, inputs),
                              dict(h0=h0, return_prefix=return_prefix, return_final_state=return_final_state,
                                   reverse=reverse, cu_seqlens=cu_seqlens))
    op.__name__ = op.__qualname__ = name
    op.__doc__ = doc
    return op


linear_scan = _affine_op("linear_scan", """``scankit.linear_scan`` over time sharded across ``group``'s ranks
(the module doc): a, b (B, T_r, D) this rank's shard. The prefix form returns (A, Bc) of the whole
sequence at this rank's steps; ``return_prefix=False`` the states from ``h0`` (B, D).""")
matrix_scan = _affine_op("matrix_scan", """``scankit.matrix_scan`` over time sharded across ``group``'s ranks
(the module doc): M (B, T_r, n, 2, 2), b (B, T_r, n, 2) this rank's shard.""")
matrix_affine_scan = _affine_op("matrix_affine_scan", """``scankit.matrix_affine_scan`` over time sharded across
``group``'s ranks (the module doc): A (B, T_r, n, k, k), B (B, T_r, n, k, v) this rank's shard.""")
