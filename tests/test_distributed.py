"""Sequence-parallel scans (``scankit.distributed``) on gloo process groups of 2 and 4 CPU ranks:
time sharded in uneven pieces (one step on a rank included), every op's states, prefix form,
reverse, packed sequences crossing shard boundaries and final states, against the float64 loop
over the whole sequence, with the gradients of every shard, of h0 (summed over the ranks) and of
the final state (used on one rank only, so its gradient must reach every other shard); the eager
references in float64 and the kernels (the interpreter on the CPU) in float32. Also MinGRUStack
over shards against the same stack on the whole sequence, and bad input on one rank raising on
every rank."""
import io
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import scankit
from oracles import affine_loop, log_loop, states
from test_final_state import _inputs
from test_packed import _per_sequence
from test_reverse import _oracle as _reverse_oracle

pytestmark = pytest.mark.xdist_group("distributed")  # the spawned ranks share the 2 cores with nobody else

OPS = ["parallel_scan_log", "linear_scan", "matrix_scan", "matrix_affine_scan"]
DTYPE = {"eager": torch.float64, "triton": torch.float32}
TOL = {"eager": dict(rtol=1e-9, atol=1e-10), "triton": dict(rtol=2e-4, atol=2e-5)}
SHARDS = {2: [6, 7], 4: [5, 1, 4, 3]}       # T = 13 in uneven pieces
LENGTHS = [3, 6, 1, 3]                      # packed: sequences crossing the shard boundaries of both


def _cases():
    cases = []
    for op in OPS:
        cases += [dict(op=op, reverse=False), dict(op=op, reverse=True),
                  dict(op=op, reverse=False, packed=True), dict(op=op, reverse=True, packed=True)]
        if op != "parallel_scan_log":
            cases.append(dict(op=op, reverse=False, prefix=True))
            cases.append(dict(op=op, reverse=True, prefix=True))
    return cases


def _global(case, mode, seed):
    """The whole sequence's inputs, h0, grad outputs and final-state grad, the same on every rank."""
    g = torch.Generator().manual_seed(seed)
    B = 1 if case.get("packed") else 2
    xs, h0 = _inputs(case["op"], B, sum(LENGTHS), g, DTYPE[mode])
    if case.get("packed"):
        h0 = torch.cat([_inputs(case["op"], 1, 1, g, DTYPE[mode])[1] for _ in LENGTHS])
    if case.get("prefix"):
        h0 = None
    return xs, h0


def _call(module, op, xs, h0, case, **kw):
    cu = torch.tensor([0] + list(torch.tensor(LENGTHS).cumsum(0))) if case.get("packed") else None
    if op == "parallel_scan_log":
        return module.parallel_scan_log(*xs, log_h0=h0, return_final_state=True, reverse=case["reverse"],
                                        cu_seqlens=cu, **kw)
    return getattr(module, op)(*xs, h0=h0, return_prefix=bool(case.get("prefix")), return_final_state=True,
                               reverse=case["reverse"], cu_seqlens=cu, **kw)


def _grad_outputs(outs, seed):
    g = torch.Generator().manual_seed(seed + 1)
    return [torch.randn(o.shape, generator=g, dtype=torch.float64).to(o.dtype) for o in outs]


def _rank_case(case, mode, seed, rank, world):
    xs, h0 = _global(case, mode, seed)
    bounds = [0] + list(torch.tensor(SHARDS[world]).cumsum(0).tolist())
    mine = [x[:, bounds[rank]:bounds[rank + 1]].clone().requires_grad_() for x in xs]
    h0 = None if h0 is None else h0.clone().requires_grad_()
    out = _call(scankit.distributed, case["op"], mine, h0, case)
    *outs, final = out
    # grad outputs of the whole sequence, this rank's piece; the final state's only on rank 0
    whole = _grad_outputs([o.new_empty((o.shape[0], bounds[-1]) + o.shape[2:]) for o in outs], seed)
    loss = sum((o * w[:, bounds[rank]:bounds[rank + 1]]).sum() for o, w in zip(outs, whole))
    if rank == 0:
        loss = loss + (final * _grad_outputs([final], seed + 7)[0]).sum()
    leaves = mine + ([h0] if h0 is not None else [])
    grads = torch.autograd.grad(loss, leaves, allow_unused=True)
    return dict(outs=[o.detach() for o in outs], final=final.detach(), grads=[None if g is None else g.detach()
                                                                              for g in grads])


def _worker(rank, world, port, mode, seed, jobs, queue):
    os.environ["MINGRU_SCAN"] = mode
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # the loopback interface: no hostname lookup needed
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        buf = io.BytesIO()  # bytes, not tensors: a tensor in a queue lives in this process's shared memory
        torch.save([job(rank, world, mode, seed) for job in jobs], buf)
        queue.put((rank, buf.getvalue()))
    except Exception as exc:  # noqa: BLE001 -- sent back whole, so the test shows it
        queue.put((rank, RuntimeError(f"{type(exc).__name__}: {exc}")))
        raise
    finally:
        dist.destroy_process_group()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(world, mode, seed, jobs):
    """Every job's result on every rank: [rank][job]."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, world, port, mode, seed, jobs, queue)) for r in range(world)]
    for p in procs:
        p.start()
    results = dict(queue.get(timeout=600) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    for r, res in results.items():
        if isinstance(res, Exception):
            raise AssertionError(f"rank {r} failed: {res!r}") from res
    return [torch.load(io.BytesIO(results[r])) for r in range(world)]


class _Case:
    """A picklable job: one case on one rank."""

    def __init__(self, case):
        self.case = case

    def __call__(self, rank, world, mode, seed):
        return _rank_case(self.case, mode, seed, rank, world)


def _reference(case, mode, seed):
    """Outputs, final state and gradients of the float64 loop over the whole sequence."""
    xs, h0 = _global(case, mode, seed)
    leaves = [x.double().requires_grad_() for x in xs] + ([h0.double().requires_grad_()] if h0 is not None else [])
    op, rev = case["op"], case["reverse"]
    x64, h64 = leaves[:2], (leaves[2] if h0 is not None else None)
    if case.get("packed"):
        h = _per_sequence(op, x64, h64, LENGTHS, reverse=rev)
        ends = torch.tensor(LENGTHS).cumsum(0)
        at = (ends - torch.tensor(LENGTHS)) if rev else ends - 1
        outs, final = [h], h[0, at]
    elif case.get("prefix"):
        if op == "matrix_scan":
            A, Bc, _ = affine_loop(x64[0], x64[1].unsqueeze(-1), reverse=rev)
            Bc = Bc.squeeze(-1)
        else:
            A, Bc, _ = affine_loop(*x64, elementwise=op == "linear_scan", reverse=rev)
        outs, final = [A, Bc], Bc[:, 0 if rev else -1]
    else:
        if rev:
            h = _reverse_oracle(op, x64, h64)
        elif op == "parallel_scan_log":
            h = log_loop(x64[0], torch.cat([h64.unsqueeze(1), x64[1]], dim=1))
        else:
            h = states(op, x64, h64)
        outs, final = [h], h[:, 0 if rev else -1]
    gouts = _grad_outputs(outs, seed)
    loss = sum((o * w.double()).sum() for o, w in zip(outs, gouts))
    loss = loss + (final * _grad_outputs([final.to(DTYPE[mode])], seed + 7)[0].double()).sum()
    grads = torch.autograd.grad(loss, leaves)
    return [o.detach() for o in outs], final.detach(), list(grads)


def _close(got, want, mode, what):
    torch.testing.assert_close(got.double(), want, **TOL[mode], msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("mode", ["eager", "triton"])
@pytest.mark.parametrize("world", sorted(SHARDS))
def test_sharded_ops_match_the_whole_sequence(world, mode, seed, monkeypatch):
    if mode == "triton" and os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
        pytest.skip("the kernels need a GPU or TRITON_INTERPRET=1")
    cases = _cases()
    ranks = _spawn(world, mode, seed, [_Case(c) for c in cases])
    for i, case in enumerate(cases):
        outs, final, grads = _reference(case, mode, seed)
        name = f"{case} on {world} ranks ({mode})"
        for k, want in enumerate(outs):
            got = torch.cat([ranks[r][i]["outs"][k] for r in range(world)], dim=1)
            _close(got, want, mode, f"{name}: output {k}")
        for r in range(world):  # every rank holds the final state
            _close(ranks[r][i]["final"], final, mode, f"{name}: final state on rank {r}")
        for k in range(2):  # the inputs' gradients, shard by shard
            got = torch.cat([ranks[r][i]["grads"][k] for r in range(world)], dim=1)
            _close(got, grads[k], mode, f"{name}: gradient of input {k}")
        if len(grads) == 3:  # h0's gradient lands where each scan starts: summed over the ranks
            got = sum(ranks[r][i]["grads"][2] for r in range(world) if ranks[r][i]["grads"][2] is not None)
            _close(got, grads[2], mode, f"{name}: gradient of h0")


STACK_MIXERS = ["mingru", "signed", "rotation", "givens"]


def _stack_inputs(packed_, seed):
    g = torch.Generator().manual_seed(seed)
    B = 1 if packed_ else 2
    x = torch.randn(B, sum(LENGTHS), 8, generator=g, dtype=torch.float64)
    gy = torch.randn(x.shape, generator=g, dtype=torch.float64)
    N = len(LENGTHS) if packed_ else B
    gs = [torch.randn(N, 8, generator=g, dtype=torch.float64) for _ in STACK_MIXERS]
    cu = torch.tensor([0] + list(torch.tensor(LENGTHS).cumsum(0))) if packed_ else None
    return x, gy, gs, cu


def _make_stack(seed):
    torch.manual_seed(seed)
    return scankit.MinGRUStack(8, depth=len(STACK_MIXERS), mixer=STACK_MIXERS).double()


def _stack_step(stack, x, gy, gs, cu, state_loss, **kw):
    """y, the per-layer states, and the gradients of x and of every parameter."""
    x = x.clone().requires_grad_()
    y, states = stack(x, return_state=True, cu_seqlens=cu, **kw)
    loss = (y * gy).sum() + (sum((s * g).sum() for s, g in zip(states, gs)) if state_loss else 0)
    grads = torch.autograd.grad(loss, [x] + list(stack.parameters()), allow_unused=True)
    return y.detach(), [s.detach() for s in states], [None if g is None else g.detach() for g in grads]


class _StackJob:
    def __init__(self, packed_):
        self.packed = packed_

    def __call__(self, rank, world, mode, seed):
        x, gy, gs, cu = _stack_inputs(self.packed, seed)
        bounds = [0] + list(torch.tensor(SHARDS[world]).cumsum(0).tolist())
        piece = slice(bounds[rank], bounds[rank + 1])
        return _stack_step(_make_stack(seed), x[:, piece], gy[:, piece], gs, cu, rank == 0, group=dist.group.WORLD)


@pytest.mark.parametrize("packed_", [False, True], ids=["dense", "packed"])
def test_sharded_stack_matches_the_whole_sequence(packed_, seed):
    """Every mixer in one MinGRUStack (float64, eager) over 4 uneven shards: outputs, per-layer final
    states, the input's gradient shard by shard, every parameter's gradient summed over the ranks."""
    world = 4
    ranks = _spawn(world, "eager", seed, [_StackJob(packed_)])
    x, gy, gs, cu = _stack_inputs(packed_, seed)
    y, states, grads = _stack_step(_make_stack(seed), x, gy, gs, cu, True)
    _close(torch.cat([ranks[r][0][0] for r in range(world)], dim=1), y, "eager", "stack output")
    for r in range(world):
        for layer, (got, want) in enumerate(zip(ranks[r][0][1], states)):
            _close(got, want, "eager", f"layer {layer}'s final state on rank {r}")
    _close(torch.cat([ranks[r][0][2][0] for r in range(world)], dim=1), grads[0], "eager", "gradient of x")
    names = ["x"] + [n for n, _ in _make_stack(seed).named_parameters()]
    for k in range(1, len(grads)):
        got = sum(ranks[r][0][2][k] for r in range(world) if ranks[r][0][2][k] is not None)
        _close(got, grads[k], "eager", f"gradient of {names[k]} (summed over the ranks)")


class _BadInputJob:
    """Rank 1 passes b of the wrong shape, or (``disagree``) a valid shard of another width."""

    def __init__(self, disagree):
        self.disagree = disagree

    def __call__(self, rank, world, mode, seed):
        D = 5 + (rank if self.disagree else 0)
        a, b = torch.rand(2, 3, D, dtype=torch.float64), torch.rand(2, 3, D, dtype=torch.float64)
        if rank == 1 and not self.disagree:
            b = b[:, :, :-1]
        try:
            scankit.distributed.linear_scan(a, b, return_prefix=False)
        except ValueError as exc:
            return str(exc)
        return None


@pytest.mark.parametrize("disagree", [False, True], ids=["bad-shard", "ranks-disagree"])
def test_bad_input_on_one_rank_raises_on_every_rank(disagree, seed):
    messages = [r[0] for r in _spawn(2, "eager", seed, [_BadInputJob(disagree)])]
    assert all(messages), f"every rank raises ValueError: {messages}"
    if disagree:
        assert all("must agree" in m for m in messages), messages
    else:
        assert "b must have shape" in messages[1], messages[1]
        assert messages[0].startswith("rank 1 of the group rejected its inputs") and "b must have shape" in messages[0]


def test_needs_a_process_group():
    a = torch.rand(1, 3, 2)
    with pytest.raises(RuntimeError, match="init_process_group"):
        scankit.distributed.linear_scan(a, a, return_prefix=False)


class _ChannelsLastTimeJob:
    """linear_scan of (B, D, T) shards along dim=-1 (no transpose by the caller)."""

    def __call__(self, rank, world, mode, seed):
        (a, b), h0 = _inputs("linear_scan", 2, sum(LENGTHS), torch.Generator().manual_seed(seed), DTYPE[mode])
        a, b = a.transpose(1, 2).contiguous(), b.transpose(1, 2).contiguous()   # (B, D, T)
        bounds = [0] + list(torch.tensor(SHARDS[world]).cumsum(0).tolist())
        piece = slice(bounds[rank], bounds[rank + 1])
        return scankit.distributed.linear_scan(a[..., piece], b[..., piece], h0=h0, return_prefix=False,
                                               return_final_state=True, dim=-1)


def test_sharded_scan_along_the_last_dim(seed):
    world = 2
    ranks = _spawn(world, "eager", seed, [_ChannelsLastTimeJob()])
    (a, b), h0 = _inputs("linear_scan", 2, sum(LENGTHS), torch.Generator().manual_seed(seed), torch.float64)
    want = states("linear_scan", (a, b), h0)                   # (B, T, D)
    got = torch.cat([ranks[r][0][0] for r in range(world)], dim=-1)
    assert got.shape == want.transpose(1, 2).shape
    _close(got, want.transpose(1, 2), "eager", "h along dim=-1")
    for r in range(world):
        _close(ranks[r][0][1], want[:, -1], "eager", f"final state on rank {r}")
