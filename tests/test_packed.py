"""Packed variable-length sequences (``cu_seqlens``) on every op, eager and kernels: each
sequence of the packed batch against the float64 loop over that sequence alone, from its own
h0, with final states and gradients (inputs, h0, final states); reversed too; bad offsets are
a ValueError that says what is wrong."""
import pytest
import torch

import scankit
from oracles import log_loop, states
from test_final_state import DEVICE, DTYPE, OPS_, _inputs
from test_reverse import _oracle as _reverse_oracle

LENGTHS = {"one": [1], "single": [13], "mixed": [1, 257, 2], "short": [5, 1, 1, 7]}


def _call(op, xs, h0, cu, **kw):
    if op == "parallel_scan_log":
        return scankit.parallel_scan_log(*xs, log_h0=h0, cu_seqlens=cu, **kw)
    return getattr(scankit, op)(*xs, h0=h0, return_prefix=False, cu_seqlens=cu, **kw)


def _per_sequence(op, xs, h0, lengths, reverse=False):
    """The float64 loop over each sequence alone (h0[n] or zeros), packed again."""
    outs, t = [], 0
    for n, length in enumerate(lengths):
        piece = [x[:, t:t + length] for x in xs]
        start = h0[n:n + 1] if h0 is not None else None
        if reverse:
            if start is None:
                start = torch.full_like(piece[0][:, 0], float("-inf")) if op == "parallel_scan_log" else \
                    torch.zeros_like(states(op, piece, None)[:, 0])
            outs.append(_reverse_oracle(op, piece, start))
        elif op == "parallel_scan_log":
            start = start if start is not None else torch.full_like(piece[0][:, 0], float("-inf"))
            outs.append(log_loop(piece[0], torch.cat([start.unsqueeze(1), piece[1]], dim=1)))
        else:
            outs.append(states(op, piece, start))
        t += length
    return torch.cat(outs, dim=1)


def _packed_inputs(op, lengths, g, dtype):
    xs, _ = _inputs(op, 1, sum(lengths), g, dtype)
    _, h0 = _inputs(op, len(lengths), 1, g, dtype)
    return xs, h0


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("with_h0", [True, False])
@pytest.mark.parametrize("lengths", list(LENGTHS))
@pytest.mark.parametrize("op", OPS_)
def test_packed_sequences_each_scan_alone(op, lengths, with_h0, reverse, kernel_mode, seed):
    g = torch.Generator().manual_seed(seed)
    sizes = LENGTHS[lengths]
    xs, h0 = _packed_inputs(op, sizes, g, DTYPE[kernel_mode])
    cu = torch.tensor([0] + torch.tensor(sizes).cumsum(0).tolist(), dtype=torch.int32 if reverse else torch.int64)
    leaves = [x.to(DEVICE).requires_grad_() for x in (*xs, h0)]
    h0_leaf = leaves[-1] if with_h0 else None
    h, last = _call(op, leaves[:-1], h0_leaf, cu.to(DEVICE), return_final_state=True, reverse=reverse)
    ref_leaves = [x.detach().double().cpu().requires_grad_() for x in leaves]
    ref = _per_sequence(op, ref_leaves[:-1], ref_leaves[-1] if with_h0 else None, sizes, reverse)
    ends = (cu[:-1] if reverse else cu[1:] - 1).long()
    ref_last = ref[0, ends]
    assert last.shape == ref_last.shape, (last.shape, ref_last.shape)
    torch.testing.assert_close(h.detach().cpu().double(), ref.detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(last.detach().cpu().double(), ref_last.detach(), atol=1e-5, rtol=1e-5)
    w, w_last = (torch.randn(t.shape, generator=g, dtype=torch.float64) for t in (ref, ref_last))
    loss = (h * w.to(h)).sum() + (last * w_last.to(last)).sum()
    ref_loss = (ref * w).sum() + (ref_last * w_last).sum()
    used, ref_used = (leaves, ref_leaves) if with_h0 else (leaves[:-1], ref_leaves[:-1])
    want = torch.autograd.grad(ref_loss, ref_used, allow_unused=True)  # T = 1 from zero: h does not read a
    want = [torch.zeros_like(x) if w is None else w for w, x in zip(want, ref_used)]
    for got, wanted in zip(torch.autograd.grad(loss, used, allow_unused=True), want):
        got = torch.zeros_like(wanted) if got is None else got.cpu().double()  # eager, T = 1 from zero: a unused
        torch.testing.assert_close(got, wanted, atol=1e-4, rtol=1e-5)


def test_log_reference_resets_exactly_where_a_coefficient_is_zero(seed):
    """log a = -inf (a = 0) in the packed path's eager reference: the state restarts there
    (Heinsen's running sum would give NaN from there on), gradients finite."""
    from scankit import reference

    g = torch.Generator().manual_seed(seed)
    lc = -torch.rand(2, 37, 3, generator=g, dtype=torch.float64)
    lv = torch.randn(2, 38, 3, generator=g, dtype=torch.float64)
    lc[:, 5] = float("-inf")
    lc[1, 20, 1] = float("-inf")
    lc.requires_grad_(), lv.requires_grad_()
    h = reference.parallel_scan_log_resets(lc, lv[:, 1:], lv[:, 0])
    torch.testing.assert_close(h, log_loop(lc, lv))
    assert all(torch.isfinite(x).all() for x in torch.autograd.grad(h.sum(), [lc, lv]))


BAD = [
    ([1, 4, 9], "cu_seqlens must start at 0; got 1"),
    ([0, 4, 8], r"cu_seqlens must end at the packed length T = 9 \(dim 1 of a\); got 8"),
    ([0, 5, 4, 9], r"cu_seqlens decreases at sequence 1 \(5 -> 4\)"),
    ([0, 4, 4, 9], r"cu_seqlens has an empty sequence at sequence 1 \(4 -> 4\)"),
    ([0], r"cu_seqlens must be 1-D \(N\+1,\) with N >= 1 sequences; got shape \(1,\)"),
]


@pytest.mark.parametrize("offsets, message", BAD)
def test_bad_offsets_are_named(offsets, message, scan_mode):
    scan_mode("eager")
    a = torch.rand(1, 9, 4)
    with pytest.raises(ValueError, match=message):
        scankit.linear_scan(a, a, return_prefix=False, cu_seqlens=torch.tensor(offsets))


def test_bad_packed_calls_are_named(scan_mode):
    scan_mode("eager")
    a, cu = torch.rand(1, 9, 4), torch.tensor([0, 4, 9])
    with pytest.raises(TypeError, match="cu_seqlens must be int32 or int64; got torch.float32"):
        scankit.linear_scan(a, a, return_prefix=False, cu_seqlens=cu.float())
    with pytest.raises(TypeError, match="cu_seqlens must be a torch.Tensor of int32 or int64 offsets"):
        scankit.linear_scan(a, a, return_prefix=False, cu_seqlens=[0, 4, 9])
    with pytest.raises(ValueError, match=r"a must have batch 1; got shape \(2, 9, 4\)"):
        scankit.linear_scan(torch.rand(2, 9, 4), torch.rand(2, 9, 4), return_prefix=False, cu_seqlens=cu)
    with pytest.raises(ValueError, match=r"h0 must have shape \(N, D\) = \(2, 4\); got \(1, 4\)"):
        scankit.linear_scan(a, a, h0=torch.rand(1, 4), return_prefix=False, cu_seqlens=cu)
    with pytest.raises(ValueError, match="cu_seqlens gives each packed sequence's states: pass return_prefix=False"):
        scankit.linear_scan(a, a, cu_seqlens=cu)
    with pytest.raises(ValueError, match=r"log_values must have shape \(1, T, D\)"):
        scankit.parallel_scan_log(-a, torch.rand(1, 10, 4), cu_seqlens=cu)
    with pytest.raises(ValueError, match=r"log_h0 must have shape \(N, D\) = \(2, 4\)"):
        scankit.parallel_scan_log(-a, a, log_h0=torch.rand(3, 4), cu_seqlens=cu)
    with pytest.raises(ValueError, match=r"h0 must have shape \(N, n, 2\) = \(2, 3, 2\)"):
        scankit.matrix_scan(torch.rand(1, 9, 3, 2, 2), torch.rand(1, 9, 3, 2), h0=torch.rand(1, 3, 2),
                            return_prefix=False, cu_seqlens=cu)


MIXER_NAMES = ["mingru", "signed", "rotation", "givens"]


@pytest.mark.parametrize("decay", [False, True])
@pytest.mark.parametrize("name", MIXER_NAMES)
def test_mixers_and_the_stack_take_packed_batches(name, decay, kernel_mode, seed):
    """A packed batch through a mixer, a block and a stack equals each sequence on its own
    (same weights), h_0 per sequence; the states returned are each sequence's last."""
    from scankit.mixers import MIXERS

    torch.manual_seed(seed)
    dtype = DTYPE[kernel_mode]
    lengths = [3, 1, 9]
    cu = torch.tensor([0, 3, 4, 13], device=DEVICE)
    mixer = MIXERS[name](5, 8, decay=decay).to(DEVICE, dtype)
    x = torch.randn(1, 13, 5, device=DEVICE, dtype=dtype, requires_grad=True)
    dt = torch.rand(1, 13, device=DEVICE, dtype=dtype) * 2 if decay else None
    h0 = mixer.initial_state(3, x).detach() + 0.25 * torch.rand(3, 8, device=DEVICE, dtype=dtype)
    got = mixer(x, h0, delta_t=dt, cu_seqlens=cu)
    want, t = [], 0
    for n, length in enumerate(lengths):
        want.append(mixer(x[:, t:t + length], h0[n:n + 1], None if dt is None else dt[:, t:t + length]))
        t += length
    want = torch.cat(want, dim=1)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    w = torch.randn_like(got)
    torch.testing.assert_close(torch.autograd.grad((got * w).sum(), x)[0], torch.autograd.grad((want * w).sum(), x)[0],
                               atol=1e-4, rtol=1e-5)
    stack = scankit.MinGRUStack(8, depth=2, mixer=[name, "mingru"]).to(DEVICE, dtype)
    xs = torch.randn(1, 13, 8, device=DEVICE, dtype=dtype)
    y, last = stack(xs, cu_seqlens=cu, return_state=True)
    t = 0
    for n, length in enumerate(lengths):
        y_n, last_n = stack(xs[:, t:t + length], return_state=True)
        torch.testing.assert_close(y[:, t:t + length], y_n, atol=1e-5, rtol=1e-5)
        for a, b in zip(last, last_n):
            torch.testing.assert_close(a[n:n + 1], b, atol=1e-5, rtol=1e-5)
        t += length


SLEEP_CYCLES = 10**8  # ~50 ms of a GPU's clock: far longer than a call's host time


@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA device")
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("op", OPS_)
def test_packed_calls_never_wait_for_the_gpu(op, reverse, scan_mode, seed):
    """Offsets on the host cost no synchronisation: queued behind a long GPU sleep, a packed
    fwd+bwd returns to the host long before the sleep ends (a copy of the offsets from
    pageable memory made every packed call wait for the kernels queued before it)."""
    import time

    scan_mode("triton")
    g = torch.Generator().manual_seed(seed)
    xs, h0 = _packed_inputs(op, [5, 1, 300, 7], g, torch.float32)
    cu = torch.tensor([0, 5, 6, 306, 313])
    leaves = [x.to(DEVICE).requires_grad_() for x in (*xs, h0)]

    def call():
        h, last = _call(op, leaves[:-1], leaves[-1], cu, return_final_state=True, reverse=reverse)
        torch.autograd.grad(h.sum() + last.sum(), leaves)

    call()  # compiles
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    torch.cuda._sleep(SLEEP_CYCLES)
    call()
    host = time.perf_counter() - t0
    torch.cuda.synchronize()
    total = time.perf_counter() - t0
    assert host < total / 2, f"the packed call returned after {host * 1e3:.1f} ms of {total * 1e3:.1f} ms: it waited"
