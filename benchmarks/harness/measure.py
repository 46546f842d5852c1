"""Measuring on the GPU: timing, peak CUDA memory and parity, for any registry cell.

Shared by ``scripts/bench_scans.py`` and the asv suites so both measure the same way.
"""
from __future__ import annotations

import contextlib
import math
import os
import statistics
import time
from functools import lru_cache

import torch

from .cases import OPS, SHAPES, check_dims
from .grid import DIRECTIONS, IMPLS


@contextlib.contextmanager
def scan_mode(mode: str):
    """Temporarily set MINGRU_SCAN."""
    old = os.environ.get("MINGRU_SCAN")
    os.environ["MINGRU_SCAN"] = mode
    try:
        yield
    finally:
        if old is None:
            del os.environ["MINGRU_SCAN"]
        else:
            os.environ["MINGRU_SCAN"] = old


def as_tuple(x):
    return x if isinstance(x, tuple) else (x,)


@lru_cache(maxsize=None)
def _compiled(op_name: str):
    # One compile per op x shape x grad mode, all through the reference's shared wrapper:
    # lift Dynamo's recompile limit so it never silently falls back to eager.
    import torch._dynamo

    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), 512))
    return torch.compile(OPS[op_name].eager, dynamic=False)


def implementation(op_name: str, impl: str):
    """The callable that runs ``op_name`` the way ``impl`` names."""
    op = OPS[op_name]
    if impl == "triton":
        def run(*xs):
            # MINGRU_SCAN=triton: the kernels or an error, never the reference by accident. A
            # measurement sets it around all its calls (``suite``), as a user sets it once, so a
            # timed call pays only this read; setting it per call cost ~2.5 us a call (writing
            # os.environ), ~10% of a small forward's host time
            if os.environ.get("MINGRU_SCAN") == "triton":
                return op.fn(*xs)
            with scan_mode("triton"):
                return op.fn(*xs)
        return run
    if impl == "eager":
        return op.eager
    if impl == "torch_compile":
        return _compiled(op_name)
    raise ValueError(f"impl must be one of {IMPLS}; got {impl!r}")


def workload(op_name: str, impl: str, direction: str, xs):
    """A no-argument callable: forward under no_grad, or forward + backward (``callable_workload``)."""
    return callable_workload(implementation(op_name, impl), xs, direction)


def callable_workload(fn, xs, direction: str):
    """``workload`` of any callable ``fn(*xs)`` (the peers use it too). fwd+bwd back-propagates
    fixed random contiguous grad outputs, made once here: a ``sum()`` loss would hand every
    backward a stride-0 gradient that the kernels first copy to a full tensor."""
    if direction == "fwd":
        def run():
            with torch.no_grad():
                return fn(*xs)
    elif direction == "fwdbwd":
        with torch.no_grad():
            outs = as_tuple(fn(*xs))
        gen = torch.Generator(device=outs[0].device).manual_seed(1)
        cots = [torch.randn(o.shape, device=o.device, dtype=o.dtype, generator=gen) for o in outs]

        def run():
            return torch.autograd.grad(as_tuple(fn(*xs)), xs, cots, allow_unused=True)
    else:
        raise ValueError(f"direction must be one of {DIRECTIONS}; got {direction!r}")
    return run


def inputs_for(op_name: str, shape: str, direction: str, device="cuda", dtype=torch.float32, seed=0):
    return OPS[op_name].shape_inputs(shape, device=device, dtype=dtype, seed=seed,
                                     requires_grad=direction == "fwdbwd")


def median_us(fn, slow_ms: float = 100.0, block_ms: float = 2.0, budget_ms: float = 200.0) -> float:
    """Median time of one call of ``fn`` in microseconds, as a training loop sees it.

    Calls run back to back in blocks of n (n calls >= ``block_ms``), each block timed by CUDA
    events: the GPU timeline then includes the host's launch gaps wherever launching, not the
    GPU, is the bottleneck (small shapes), and is the kernels' time where the GPU is (large
    shapes). The result is the median over 5-25 blocks (about ``budget_ms`` in all) of the
    per-call block time; 3 single calls when one call takes ``slow_ms`` or more. (Timing each
    call alone between cache flushes, as triton's do_bench does, mixes host and GPU time by
    how far the host runs ahead: 2-3x apart between H200 runs of the same code at lab/longT.)
    """
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def block(n: int) -> float:
        torch.cuda.synchronize()
        start.record()
        for _ in range(n):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / n

    fn()  # warm-up: compile, autotune, allocator
    once = min(block(1), block(1))
    if once >= slow_ms:
        return 1e3 * statistics.median(block(1) for _ in range(3))
    n = max(1, math.ceil(block_ms / max(once, 1e-3)))
    blocks = min(25, max(5, round(budget_ms / (n * max(once, 1e-3)))))
    block(n)  # steady state: allocator and clocks settled under back-to-back calls
    return 1e3 * statistics.median(block(n) for _ in range(blocks))


# The two timed quantities, as asv samples (``{"samples": per-call seconds, "number": calls
# per sample}``: asv then records the median, the 99% CI and quartiles of each cell).
# grid.METHOD names them in the benchmarks' versions.
SAMPLES = 15
SAMPLE_MS = 2.0     # aim of one sample (n calls)
MAX_QUEUED = 48     # calls queued per device-time sample: launches stay far below the ~1k launch queue
SLOW_BUDGET_S = 3.0  # a quantity's samples of a slow cell (one call > 0.2 s: eager references at
MIN_SAMPLES = 5      # large) stop at this many seconds, and at no fewer than MIN_SAMPLES samples


def _sample_count(once: float, samples: int) -> int:  # once: the seconds one sample of n = 1 takes
    """``samples``, or fewer for a cell whose one call is slow: eager matrix_scan's fwd+bwd at
    large takes 1.8 s a call, its 15 + 5 calls per quantity took 95 s of a cold run (session 10),
    and its spread is < 0.1%."""
    return samples if once * samples <= SLOW_BUDGET_S else max(MIN_SAMPLES, min(samples, math.ceil(SLOW_BUDGET_S / once)))


@lru_cache(maxsize=None)
def _sleep_cycles_per_second() -> float:
    """GPU clock cycles per second of ``torch.cuda._sleep``, measured once per process."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1_000_000)  # clocks up
    rates = []
    for _ in range(3):
        start.record()
        torch.cuda._sleep(2_000_000)
        end.record()
        end.synchronize()
        rates.append(2_000_000 / (start.elapsed_time(end) * 1e-3))
    return statistics.median(rates)


def _wall_block(fn, n: int) -> float:
    """Seconds per call of n back-to-back calls, host-inclusive (synchronized before and after)."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n


def call_latency(fn, samples: int = SAMPLES) -> dict:
    """Host-inclusive steady-state seconds per call, what a user at small shapes feels."""
    fn()
    firsts = [_wall_block(fn, 1) for _ in range(3)]
    once = min(firsts)
    n = max(1, min(1000, math.ceil(SAMPLE_MS * 1e-3 / once)))
    count = _sample_count(once, samples)
    if count < samples:  # slow calls (n = 1): the single calls were samples already
        return dict(samples=firsts + [_wall_block(fn, 1) for _ in range(count - len(firsts))], number=1)
    _wall_block(fn, n)
    return dict(samples=[_wall_block(fn, n) for _ in range(samples)], number=n)


MAX_SLEEP_S = 0.5   # a sample's head start for the host, at most


def device_time(fn, samples: int = SAMPLES) -> dict:
    """GPU seconds per call without the host: each sample queues n calls behind a GPU sleep
    long enough for the host to enqueue them all, and times them with CUDA events, so the
    GPU runs them back to back whatever the host's launch cost. A sample whose enqueueing
    outlasted its sleep (the GPU then waited on the host) is taken again with a longer one."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    torch.cuda.synchronize()
    host = []
    for _ in range(5):  # the host's enqueue time per call (no sync inside); the median: a
        torch.cuda.synchronize()  # late compile or a GC pause in one call must not size every sleep
        t0 = time.perf_counter()
        fn()
        host.append(time.perf_counter() - t0)
        if sum(host) > SLOW_BUDGET_S / 3:  # a slow cell's enqueue time is known well enough
            break
    rate = _sleep_cycles_per_second()
    per_call = statistics.median(host)

    def queued(n: int) -> float:
        sleep = min(MAX_SLEEP_S, 1.5 * n * per_call + 50e-6)
        for _ in range(4):
            torch.cuda.synchronize()
            torch.cuda._sleep(int(rate * sleep))
            t0 = time.perf_counter()
            start.record()
            for _ in range(n):
                fn()
            end.record()
            enqueued = time.perf_counter() - t0
            end.synchronize()
            if enqueued < sleep or sleep >= MAX_SLEEP_S:
                break
            sleep = min(MAX_SLEEP_S, 2 * enqueued)
        return start.elapsed_time(end) * 1e-3 / n

    t0 = time.perf_counter()
    firsts = [queued(1) for _ in range(2)]
    once = min(firsts)
    n = max(1, min(MAX_QUEUED, math.ceil(SAMPLE_MS * 1e-3 / once)))
    count = _sample_count((time.perf_counter() - t0) / 2, samples)  # a sample's wall time: its sleep too
    if count < samples:  # slow calls (n = 1): the single calls were samples already
        return dict(samples=firsts + [queued(1) for _ in range(count - len(firsts))], number=1)
    queued(n)
    return dict(samples=[queued(n) for _ in range(samples)], number=n)


def gpu_launches(fn) -> int:
    """Kernels, memsets and memcpys that one call of ``fn`` (already warm: compiled) puts on
    the GPU, from a torch.profiler trace: glue included, whoever launched it."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def median_of(cell: dict) -> float:
    """The median of an asv samples dict (what asv records as the result)."""
    return statistics.median(cell["samples"])


def peak_bytes(fn) -> int:
    """Peak CUDA memory that one call of ``fn`` allocates beyond what was live before it."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    del out
    return torch.cuda.max_memory_allocated() - base


def copy_bandwidth(n_bytes: int = 2 << 30) -> float:
    """Device-to-device copy bandwidth in bytes/s (bytes read + written), measured now."""
    x = torch.empty(n_bytes // 4, device="cuda", dtype=torch.float32).uniform_()
    y = torch.empty_like(x)
    us = median_us(lambda: y.copy_(x))
    return 2 * n_bytes / (us * 1e-6)


def meta_inputs_outputs(op_name: str, shape: str):
    """(inputs, outputs) of a registry cell as meta tensors, for the byte model."""
    op = OPS[op_name]
    metas = [torch.empty(s, device="meta") for s in op.input_shapes(op.dims_at(SHAPES[shape]))]
    with torch.device("meta"):
        outs = as_tuple(op.eager(*metas))
    return metas, outs


# ---------------------------------------------------------------- parity

def _errors(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    diff = (out.double() - ref).abs()
    scale = ref.abs().max().item()
    worst = diff.max().item() if diff.numel() else 0.0
    return worst, (worst / scale if scale > 0 else worst)


def parity_case(op_name: str, dims: dict, device="cuda", dtype=torch.float32, seed=0):
    """Kernel vs the eager reference evaluated in float64 on the same inputs: two rows,
    forward (all outputs) and grad (all inputs, random cotangents)."""
    op = OPS[op_name]
    xs = [x.requires_grad_() for x in op.inputs(dims, device=device, dtype=dtype, seed=seed)]
    ref_in = [x.detach().double().requires_grad_() for x in xs]
    with scan_mode("triton"):
        out = as_tuple(op.fn(*xs))
    with scan_mode("eager"):
        ref = as_tuple(op.eager(*ref_in))
    gen = torch.Generator(device=device).manual_seed(seed + 1)
    weights = [torch.randn(r.shape, device=device, dtype=torch.float64, generator=gen) for r in ref]
    # an input the output does not depend on (a_1 from h_0 = 0 at T = 1) has gradient zero
    grads = torch.autograd.grad(sum((o.float() * w.float()).sum() for o, w in zip(out, weights)), xs,
                                allow_unused=True, materialize_grads=True)
    ref_grads = torch.autograd.grad(sum((r * w).sum() for r, w in zip(ref, weights)), ref_in,
                                    allow_unused=True, materialize_grads=True)
    rows = []
    for direction, outs, refs in (("fwd", out, ref), ("grad", grads, ref_grads)):
        gate = op.gate_for(direction, dtype)
        rows.append(_row(op_name, ",".join(f"{k}={v}" for k, v in dims.items()), str(dtype).replace("torch.", ""),
                         direction, gate, [(o.detach(), r.detach()) for o, r in zip(outs, refs)]))
    return rows


def _row(op, shape, dtype, direction, gate, pairs) -> dict:
    """One parity row over (output, reference) pairs."""
    errs = [_errors(o, r) for o, r in pairs]
    margin = max(gate.margin(o, r) for o, r in pairs)
    return dict(op=op, shape=shape, dtype=dtype, direction=direction, gate_atol=gate.atol, gate_rtol=gate.rtol,
                max_abs_err=max(e[0] for e in errs), max_rel_err=max(e[1] for e in errs),
                margin=margin, passed=margin <= 1.0)


def parity_grid():
    """(op, dims, dtype) of every parity case: the seed's float32 grid plus bfloat16 cases."""
    for op_name, dims in check_dims():
        yield op_name, dims, torch.float32
    for op_name, op in OPS.items():
        for shape in ("lab", "longT"):
            yield op_name, op.dims_at(SHAPES[shape]), torch.bfloat16


def _kernel_mode(device: str) -> str:
    """The mode whose mixers take the kernels: ``auto`` on CUDA, ``triton`` (interpreter) on CPU."""
    return "auto" if device == "cuda" else "triton"


def mixer_parity_case(label: str, device="cuda", seed=0, batch=128, T=64):
    """A mixer on the kernel path (float32) vs the same mixer eager in float64: output
    and every parameter's gradient."""
    import copy

    from .cases import MIXER_CASES, MIXER_PARAM

    torch.manual_seed(seed)
    mixer = MIXER_CASES[label]().to(device)
    ref_mixer = copy.deepcopy(mixer).double()
    x = torch.randn(batch, T, 64, device=device)
    dt = torch.rand(batch, T, device=device) * 2 if mixer.decay is not None else None
    with scan_mode(_kernel_mode(device)):
        out = mixer(x, delta_t=dt)
    with scan_mode("eager"):
        ref = ref_mixer(x.double(), delta_t=None if dt is None else dt.double())
    # cotangents of a mean-reduced loss: parameter grads stay O(1), where the gate's atol
    # means something (a sum over B*T rows makes them O(1e3) and atol 1e-3 a 1e-6 bar)
    w = torch.randn(ref.shape, device=device, dtype=torch.float64) / (batch * T)
    with scan_mode(_kernel_mode(device)):
        (out * w.float()).sum().backward()
    (ref * w).sum().backward()
    pairs = {"fwd": [(out.detach(), ref.detach())],
             "grad": [(p.grad, q.grad) for p, q in zip(mixer.parameters(), ref_mixer.parameters())]}
    return [_row(label, f"B={batch},T={T},d=64", "float32", direction, MIXER_PARAM, items)
            for direction, items in pairs.items()]


def mixer_train_step(label: str, path: str, B=128, T=64, device="cuda"):
    """A callable: one forward + backward of a registry mixer on ``path`` ("generic": eager
    matrices; "kernel": the kernels ``auto`` picks on CUDA)."""
    from .cases import MIXER_CASES

    torch.manual_seed(0)
    mixer = MIXER_CASES[label]().to(device)
    x = torch.randn(B, T, 64, device=device)
    mode = "eager" if path == "generic" else _kernel_mode(device)
    with torch.no_grad(), scan_mode(mode):
        cot = torch.randn_like(mixer(x))  # a fixed contiguous grad output, as the scan cells take

    def run():
        with scan_mode(mode):
            return torch.autograd.grad(mixer(x), list(mixer.parameters()), cot)

    return run
