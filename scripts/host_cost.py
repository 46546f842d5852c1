"""Host time per call of each scan op, split into scankit's own Python and Triton's launches.

    python scripts/host_cost.py [--shape lab] [--calls 2000] [--graphs] [--ops OP ...] [--json OUT]

Each op (the benchmark registry's cells: triton impl, fwd and fwd+bwd) is called back to back
and timed on the wall clock; then the kernel launches of one call are recorded (kernel, grid,
arguments) and replayed on their own, ``kernel[grid](...)`` as scankit makes them: what Triton's
argument binder and launcher cost. scankit's share is the difference (validation, dispatch,
autograd, allocation, geometry). ``wrap_fwd_us`` / ``wrap_bwd_us``: the time inside the kernel
wrappers (geometry, allocations and the launches), forward and backward; the rest is the op's
validation, dispatch and autograd. fwd+bwd back-propagates a fixed grad output, made once.

On a GPU the calls run (the shapes' device time is far below their host time at ``lab``: the
GPU is kept fed, the host is what is measured). Without one, Triton compiles each launch for
sm_90 (scripts/compile_for_gpu.py's target) and the replay stops before the launch, so the
Triton column is the binder and its cache lookup, not the driver's launch; nothing runs (the
outputs are uninitialised memory, which fwd+bwd's backward takes as it comes: only its host
path is timed).

Each direction also gets a ``torch floor`` row: one elementwise torch op (``x * 2``) on the
first input (one element of it without a GPU), called the same way (fwd under no_grad; fwd+bwd through ``torch.autograd.grad``
with a fixed grad output): what any op costs on this host before it does anything of its own.
``--profile DIR`` writes each cell's torch.profiler table (host activity of every thread, the
autograd engine's included) to ``DIR/<op>-<direction>.txt``.

``--graphs`` (GPU only) also times each cell as a ``torch.compile(mode="reduce-overhead")``
function (inductor, CUDA graphs, shapes fixed) after its recording: what a user whose shapes
do not change can have instead of the eager call (compiles take ~10-20 s a cell);
``graph_skips``: how often inductor declined to graph the cell (then its time is no graph's;
``TORCH_LOGS=perf_hints`` prints why).
"""
import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
    sys.exit("host_cost: unset TRITON_INTERPRET (interpreted launches are not host cost)")

import torch  # noqa: E402
from tabulate import tabulate  # noqa: E402


def _per_call_us(fn, calls: int) -> float:
    """Median over 5 blocks of ``calls`` back-to-back calls, microseconds per call."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    fn()
    sync()
    blocks = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        blocks.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(blocks)


def _recorded_launches(fn) -> list:
    """(kernel, grid, args, meta) of each launch one call of ``fn`` makes."""
    from benchmarks.harness.launches import Launches

    with Launches(record=True) as seen:
        fn()
    return seen.calls


def _inside_wrappers_us(fn, calls: int) -> tuple[float, float]:
    """Microseconds per call spent inside the kernel wrappers (``_forward`` / ``_backward`` of
    scankit.triton's elementwise and affine modules: geometry, allocations, launches), forward
    and backward apart; the rest of a call is validation, dispatch and autograd (the engine's
    thread included, where the backward runs on a GPU)."""
    from scankit.triton import affine, elementwise

    spent = {"_forward": 0.0, "_backward": 0.0}
    saved = []

    def timed(name, inner):
        def run(*a, **kw):
            t0 = time.perf_counter()
            try:
                return inner(*a, **kw)
            finally:
                spent[name] += time.perf_counter() - t0
        return run

    for module in (elementwise, affine):
        for name in spent:
            saved.append((module, name, getattr(module, name)))
            setattr(module, name, timed(name, getattr(module, name)))
    try:
        fn()
        spent.update({k: 0.0 for k in spent})
        for _ in range(calls):
            fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    finally:
        for module, name, inner in saved:
            setattr(module, name, inner)
    return spent["_forward"] / calls * 1e6, spent["_backward"] / calls * 1e6


def _floor(x, direction: str):
    """One torch op on ``x``, called as a cell is (``measure.callable_workload``)."""
    from benchmarks.harness import measure

    return measure.callable_workload(lambda t: t * 2, (x,), direction)


def _profile(fn, path: Path, calls: int = 50) -> None:
    """torch.profiler's host table of ``calls`` calls of ``fn``, most total time first."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities, with_stack=True) as prof:  # CUDA: the runtime calls too; Python functions (every thread)
        for _ in range(calls):
            fn()
    path.write_text(prof.key_averages().table(sort_by="cpu_time_total", row_limit=80))


def _graphed(op_name: str, direction: str, xs):
    """The cell as a reduce-overhead compiled function, recorded (three calls) before timing,
    and how many times inductor declined to graph it (its ``cudagraph_skips`` counter: a
    skipped cell runs its compiled graph without CUDA graphs, so its time is no graph's)."""
    from torch._dynamo.utils import counters

    from benchmarks.harness import measure
    from benchmarks.harness.cases import OPS

    torch._dynamo.reset()  # each op's cases share one code object: a fresh cache, not dynamo's recompile limit
    skips = counters["inductor"]["cudagraph_skips"]
    compiled = torch.compile(OPS[op_name].fn, mode="reduce-overhead", fullgraph=True)
    fn = measure.callable_workload(compiled, xs, direction)
    for _ in range(3):
        fn()
    return fn, counters["inductor"]["cudagraph_skips"] - skips


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="lab", help="a registry shape (benchmarks.harness.grid.SHAPES)")
    parser.add_argument("--calls", type=int, default=2000, help="calls per timed block")
    parser.add_argument("--graphs", action="store_true", help="also time torch.compile(mode='reduce-overhead')")
    parser.add_argument("--profile", help="write each cell's torch.profiler host table under this folder")
    parser.add_argument("--json", help="write the rows here too")
    parser.add_argument("--ops", nargs="*", help="only these ops (default: every op of the registry)")
    args = parser.parse_args(argv)

    on_gpu = torch.cuda.is_available()
    if args.graphs and not on_gpu:
        parser.error("--graphs needs a GPU (CUDA graphs)")
    if not on_gpu:
        import compile_for_gpu

        compile_for_gpu.gpu_target()
        compile_for_gpu.compile_instead_of_launching()  # bind, look up (compile once), do not launch
    from benchmarks.harness import grid, measure
    from benchmarks.harness.cases import OPS
    from scankit.triton import common

    device = "cuda" if on_gpu else "cpu"
    os.environ["MINGRU_SCAN"] = "triton"
    if not on_gpu:  # the CPU tensors go to the kernels, compiled for the GPU target, never run
        import scankit.dispatch

        scankit.dispatch.interpreting = lambda: True
    unknown = [op for op in args.ops or () if op not in grid.OP_NAMES]
    if unknown:
        parser.error(f"--ops takes {', '.join(grid.OP_NAMES)}; got {', '.join(map(repr, unknown))}")
    rows = []
    for op_name in args.ops or grid.OP_NAMES:
        for direction in grid.DIRECTIONS:
            xs = OPS[op_name].inputs(OPS[op_name].dims_at(grid.SHAPES[args.shape]), device=device,
                                     requires_grad=direction == "fwdbwd")
            fn = measure.workload(op_name, "triton", direction, xs)
            total = _per_call_us(fn, args.calls)
            launches = _recorded_launches(fn)

            def replay():
                with common.direct():
                    for kernel, grid_, a, meta in launches:
                        common.launch(kernel, grid_, *a, **meta)
            triton_us = _per_call_us(replay, args.calls)
            in_fwd, in_bwd = _inside_wrappers_us(fn, args.calls)
            rows.append(dict(op=op_name, direction=direction, launches=len(launches), total_us=round(total, 1),
                             triton_us=round(triton_us, 1), scankit_us=round(total - triton_us, 1),
                             wrap_fwd_us=round(in_fwd, 1), wrap_bwd_us=round(in_bwd, 1)))
            if args.graphs and on_gpu:
                graphed, skips = _graphed(op_name, direction, xs)
                rows[-1].update(graphs_us=round(_per_call_us(graphed, args.calls), 1), graph_skips=skips)
            if args.profile:
                Path(args.profile).mkdir(parents=True, exist_ok=True)
                _profile(fn, Path(args.profile) / f"{op_name}-{direction}.txt")
            print(*rows[-1].values(), flush=True)
    for direction in grid.DIRECTIONS:
        x = OPS[grid.OP_NAMES[0]].inputs(OPS[grid.OP_NAMES[0]].dims_at(grid.SHAPES[args.shape]), device=device,
                                         requires_grad=direction == "fwdbwd")[0]
        if not on_gpu:  # the CPU would compute x * 2 itself: one element keeps it a host cost
            x = x.detach().reshape(-1)[:1].clone().requires_grad_(direction == "fwdbwd")
        rows.append(dict(op="torch floor", direction=direction, launches=None,
                         total_us=round(_per_call_us(_floor(x, direction), args.calls), 1), triton_us=None,
                         scankit_us=None, wrap_fwd_us=None, wrap_bwd_us=None))
        print(*rows[-1].values(), flush=True)
    where = torch.cuda.get_device_name() if on_gpu else "CPU (sm_90 compiled, not launched)"
    print(f"\nhost time per call at {args.shape}, {where}, median of 5 blocks of {args.calls} calls")
    print(tabulate(rows, headers="keys"))
    if args.json:
        Path(args.json).write_text(json.dumps(dict(device=where, shape=args.shape, rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
