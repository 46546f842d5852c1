"""What one benchmark run measures, as plain data (dicts of floats and rows).

``scripts/bench_scans.py`` renders these directly; the asv suites return them from their
``setup_cache`` (one process measures everything, the tracks only read). On a machine
without CUDA, ``SCANKIT_BENCH_SMOKE=1`` runs every body once on tiny CPU shapes
(kernels through TRITON_INTERPRET=1) so a broken benchmark shows before a GPU run;
without it, the GPU-only measurements raise ``NotImplementedError`` (asv: skipped).
"""
from __future__ import annotations

import functools
import itertools
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

from . import grid

REPO = Path(__file__).resolve().parents[2]
SMOKE_ENV = "SCANKIT_BENCH_SMOKE"
# processes at once for compile-bound work on CUDA (prewarm, parity_rows): Triton compiles on one core each
WORKERS = max(1, min(8, (os.cpu_count() or 2) // 2))


def note(msg: str) -> None:
    """One line of the harness's account of itself (a phase and its seconds, a dead worker):
    on stderr, which asv shows only after a benchmark ends, and appended to ``harness.log``
    beside the reference cache, which a run cut off mid-setup still leaves behind."""
    line = f"{time.strftime('%H:%M:%S')} [{os.getpid()}] {msg}"
    print(line, file=sys.stderr, flush=True)
    cache = _reference_cache()
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        with open(cache.parent / "harness.log", "a") as log:
            log.write(line + "\n")


def smoke() -> bool:
    return os.environ.get(SMOKE_ENV, "0") not in ("", "0")


def device() -> str:
    """'cuda', or 'cpu' in a smoke run; otherwise there is nothing to measure here."""
    import torch

    if torch.cuda.is_available():
        return "cuda"
    if smoke():
        os.environ.setdefault("TRITON_INTERPRET", "1")
        try:  # the interpreter's scan a slice per step, the same numbers (a commit before it: as is)
            from scankit.triton.interpret import speed_up
        except ImportError:
            pass
        else:
            speed_up()
        return "cpu"
    raise NotImplementedError("no CUDA device (set SCANKIT_BENCH_SMOKE=1 for a CPU smoke run)")


def _smoke_dims(op_name: str, shape: str) -> dict:
    from .cases import OPS

    dims = dict(OPS[op_name].dims_at(grid.SHAPES[shape]), B=2, T=8)
    for key, cap in (("D", 8), ("n", 2)):
        if key in dims:
            dims[key] = min(dims[key], cap)
    return dims


def _wall(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _cpu_seconds(fn, repeats=3) -> float:
    fn()
    return statistics.median(_wall(fn) for _ in range(repeats))


def cell_skip(op_name: str, shape: str, impl: str):
    reason = grid.skip_reason(op_name, shape, impl)
    if reason is None and smoke() and impl == "torch_compile":
        reason = "smoke run on the CPU"
    return reason


def measure_cell(op_name: str, shape: str, impl: str, direction: str) -> dict:
    """One registry cell: ``device_time`` and ``call_latency`` (asv samples dicts, see
    ``measure``), ``peak_bytes`` (None on the CPU), ``seconds`` (device time's median) and
    ``launches`` (kernels per call, glue included: torch.profiler on the GPU, the
    interpreter's count in a CPU smoke run). A smoke run times the call's wall time for both."""
    import torch

    from . import measure

    dev = device()
    if dev == "cpu":
        fn = cell_workload(op_name, shape, impl, direction, dev)
        latency = timed(fn, dev)
        from .launches import Launches

        with Launches() as counted:
            fn()
        # the smoke run's device is the CPU: both quantities are its wall time
        return dict(device_time=latency, call_latency=latency, peak_bytes=None, seconds=measure.median_of(latency),
                    launches=counted.total)
    fn = cell_workload(op_name, shape, impl, direction, dev)
    with measure.scan_mode("triton"):  # once, not per call (``measure.implementation``); the references ignore it
        cell = dict(device_time=measure.device_time(fn), call_latency=measure.call_latency(fn),
                    peak_bytes=measure.peak_bytes(fn))
    cell["seconds"] = measure.median_of(cell["device_time"])
    try:
        cell["launches"] = measure.gpu_launches(fn)
    except Exception as exc:  # the profiler is optional to the timing: n/a, and why, not a failed cell
        note(f"launches of {op_name} {shape} {impl} {direction}: {type(exc).__name__}: {exc}")
        cell["launches"] = None
    del fn
    torch.cuda.empty_cache()
    return cell


def timed(fn, dev: str) -> dict:
    """``fn``'s device time (asv samples dict), or in a CPU smoke run its wall time."""
    from . import measure

    if dev == "cpu":
        fn()
        return dict(samples=[_wall(fn) for _ in range(3)], number=1)
    return measure.device_time(fn)


def cell_workload(op_name: str, shape: str, impl: str, direction: str, dev: str):
    """The call a registry cell times, on its inputs (the smoke run's small ones on the CPU)."""
    from . import measure
    from .cases import OPS

    if dev == "cpu":
        xs = OPS[op_name].inputs(_smoke_dims(op_name, shape), device="cpu", requires_grad=direction == "fwdbwd")
    else:
        xs = measure.inputs_for(op_name, shape, direction)
    return measure.workload(op_name, impl, direction, xs)


def cell_device_time(op_name: str, shape: str, impl: str, direction: str) -> dict:
    """A registry cell's device time alone (asv samples dict; the smoke run's wall time)."""
    dev = device()
    return timed(cell_workload(op_name, shape, impl, direction, dev), dev)


def _warm_share(keys: list) -> int:
    """Call each cell once (its kernels compile into Triton's disk cache); the cells that ran."""
    import torch

    from . import measure

    ran = 0
    for op_name, shape, impl, direction in keys:
        try:
            t0 = time.perf_counter()
            xs = measure.inputs_for(op_name, shape, direction, device=device())
            measure.workload(op_name, impl, direction, xs)()
            note(f"warm-up of {op_name} {shape} {impl} {direction}: {time.perf_counter() - t0:.1f} s")
            ran += 1
        except Exception as exc:  # best effort: the measuring pass reports what fails
            note(f"warm-up of {op_name} {shape} {impl} {direction}: {type(exc).__name__}: {exc}"[:240])
        xs = None
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return ran


def prewarm(keys: list, workers: int | None = None) -> int:
    """Compile the kernels of these cells in ``workers`` processes at once (default
    WORKERS), each op x shape x impl in one process, before they are timed one by one here:
    a commit's cold Triton compile (~36 of a ~68 s Scans setup on the H200, session 7) runs
    on that many cores, and Triton's disk cache serves this process. The cells that ran."""
    shares = _kernel_shares(keys, workers)
    return sum(in_workers(_warm_share, [(share,) for share in shares])) if shares else 0


def _kernel_shares(keys: list, workers: int | None) -> list[list]:
    """Cell keys in at most ``workers`` (at most WORKERS) shares, each op x shape x impl whole,
    balanced by what warming them costs: a torch.compile cell compiles, an eager one does not."""
    groups = defaultdict(list)
    for key in keys:
        groups[key[:3]].append(key)
    cost = lambda members: sum(1 if key[2] == "eager" else COMPILE_WEIGHT for key in members)  # noqa: E731
    return _balanced(groups.values(), min(workers or WORKERS, WORKERS), cost) if keys else []


COMPILE_WEIGHT = 8  # a compiled cell's warm-up against an eager one's (a few s of tracing vs a call)


REFERENCE_IMPLS = ("eager", "torch_compile")


def _reference_cache_key(op_name: str, shape: str, impl: str, direction: str, source=None) -> str:
    """What a reference cell's time depends on: the GPU, torch and triton, the harness's
    method and the reference's own source (the module ``source``; by default the eager
    references, scankit.reference at the measured commit)."""
    import hashlib
    import inspect

    import torch
    import triton

    import scankit.reference

    src = hashlib.sha256(inspect.getsource(source or scankit.reference).encode()).hexdigest()[:16]
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return "|".join((gpu, torch.__version__, triton.__version__, grid.METHOD, src, op_name, shape, impl, direction))


def _reference_cache() -> Path | None:
    """Where reference cells (eager, torch.compile) are kept between commits of one machine:
    ``$SCANKIT_BENCH_CACHE`` (default ~/.cache/scankit-bench); off in a smoke run."""
    if smoke():
        return None
    base = Path(os.environ.get("SCANKIT_BENCH_CACHE") or Path.home() / ".cache" / "scankit-bench")
    return base / "references.json"


def _known_references() -> dict:
    path = _reference_cache()
    return json.loads(path.read_text()) if path is not None and path.exists() else {}


def _cached_reference(key: tuple, measure_fn, source=None) -> dict:
    """A reference cell from the machine's cache, else measured now and added to it: they
    measure torch and the host, not the commit, so every commit's result carries the same
    numbers and none of them is re-measured per commit (``source``: _reference_cache_key's)."""
    path = _reference_cache()
    if path is None:
        return measure_fn()
    name = _reference_cache_key(*key, source=source)
    known = _known_references()
    if name not in known:
        known[name] = measure_fn()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(known, sort_keys=True))
        os.replace(tmp, path)
    return known[name]


def op_cells(ops=grid.OP_NAMES, shapes=tuple(grid.SHAPES), progress=iter, impls=grid.IMPLS) -> dict:
    """Every op x shape x impl x direction cell: device_time, call_latency (samples), seconds
    (device time's median), peak bytes, skips, failures, bytes moved. An op the measured commit
    lacks (its scankit has no such function) is skipped with the reason; a scankit cell that
    raises at this commit is failed with its error (``failing``)."""
    from . import measure
    from .cases import bytes_moved

    keys = [(o, s, i, d) for o in ops for s in shapes for d in grid.DIRECTIONS for i in impls]
    out = dict(seconds={}, device_time={}, call_latency={}, peak_bytes={}, launches={}, skipped={}, failed={})
    reasons = {key: cell_skip(*key[:3]) or missing_in_commit(key[0]) for key in keys}
    fresh = {}
    if device() == "cuda":
        t0 = time.perf_counter()
        warmed = prewarm([key for key in keys if key[2] == "triton" and not reasons[key]])
        note(f"op_cells: prewarm of {warmed} triton cells {time.perf_counter() - t0:.1f} s")
        t0, todo = time.perf_counter(), uncached_references(keys, reasons)
        fresh = reference_cells_in_workers(todo)
        note(f"op_cells: {len(fresh)} of {len(todo)} uncached reference cells measured in workers "
             f"{time.perf_counter() - t0:.1f} s")
    t0 = time.perf_counter()
    for key in progress(keys):
        reason = reasons[key]
        if reason:
            out["skipped"][key] = reason
            continue
        if key[2] in REFERENCE_IMPLS:
            cell = _cached_reference(key, lambda: fresh.get(key) or measure_cell(*key))
        else:
            cell = failing(out, key, lambda: measure_cell(*key))
            if cell is None:
                continue
        for field in ("seconds", "device_time", "call_latency", "peak_bytes"):
            out[field][key] = cell[field]
        out["launches"][key] = cell.get("launches")  # reference cells cached before it have none
    note(f"op_cells: {len(keys)} cells timed here (cached and fresh references looked up) {time.perf_counter() - t0:.1f} s")
    out["bytes"] = {}
    for o in ops:
        for s in shapes:
            ins, outs = measure.meta_inputs_outputs(o, s)
            for d in grid.DIRECTIONS:
                out["bytes"][o, s, d] = bytes_moved(ins, outs, d)
    return out


def failing(out: dict, key, measure):
    """``measure()``, or None with ``out["failed"][key]`` its error: a kernel that fails to
    compile or run at the measured commit fails its own cells (asv: no value, which the gate
    reports as newly failing) while the rest of the suite is measured."""
    try:
        return measure()
    except Exception as exc:
        out["failed"][key] = f"{type(exc).__name__}: {exc}"[:400]
        note(f"failed: {' '.join(map(str, key))}: {out['failed'][key]}"[:240])
        return None


def uncached_references(keys: list, reasons: dict) -> list:
    """The reference cells (eager, torch.compile) of ``keys`` that run and that the
    machine's reference cache lacks: what a setup must measure."""
    known = _known_references()
    return [key for key in keys if key[2] in REFERENCE_IMPLS and not reasons[key]
            and _reference_cache_key(*key) not in known]


BARRIER_S = 1800  # a worker waits this long for the others' compiles, then times anyway


def reference_cells_in_workers(keys: list, workers: int | None = None) -> dict:
    """``{key: measure_cell(*key)}``, measured in up to ``workers`` spawned processes
    (default WORKERS), each op x shape x impl in one: every process first calls its cells
    once (torch.compile's tracing and inductor's compiles, ~100 of ~260 s of a cold
    References setup even after a prewarm, H200 session 8, since a cache hit still traces),
    all at once; then, when all have, they time their cells one process at a time, so
    each timing has the GPU and the host to itself. Cells of a process that died are
    missing (the caller measures them itself)."""
    import multiprocessing as mp

    shares = _kernel_shares(keys, workers)
    if not shares:
        return {}
    with mp.get_context("spawn").Manager() as manager:
        gate = manager.Barrier(len(shares)), manager.Lock()
        got = in_workers(_compile_then_measure, [(share, gate) for share in shares], here=False)
    return {key: cell for share in got if share for key, cell in share.items()}


def _compile_then_measure(keys: list, gate) -> dict:
    """A worker's share of ``reference_cells_in_workers``: warm, wait for the others, time under the lock."""
    barrier, lock = gate
    t0 = time.perf_counter()
    # eager cells have nothing to compile: warming them would only crowd the GPU's memory
    # while the others compile (an eager doubling at large holds tens of GiB)
    warmed = _warm_share([key for key in keys if key[2] != "eager"])
    t1 = time.perf_counter()
    try:
        barrier.wait(BARRIER_S)
    except Exception as exc:  # broken or timed out (a worker died): time anyway, still one at a time
        note(f"reference worker: barrier {type(exc).__name__}")
    t2 = time.perf_counter()
    with lock:
        t3, cells = time.perf_counter(), {}
        for key in keys:
            t = time.perf_counter()
            cells[key] = measure_cell(*key)
            note(f"timed {' '.join(key)}: {time.perf_counter() - t:.1f} s")
    note(f"reference worker: warmed {warmed} of {len(keys)} cells {t1 - t0:.1f} s, barrier {t2 - t1:.1f} s, "
         f"lock {t3 - t2:.1f} s, timed {time.perf_counter() - t3:.1f} s")
    return cells


def packed_lengths(T: int, n: int, seed: int = 0) -> list[int]:
    """``n`` seeded random sequence lengths in 1 .. 2 T / n that sum to ``T``."""
    import random

    rng = random.Random(seed)
    raw = [rng.randint(1, max(1, 2 * T // n)) for _ in range(n)]
    lengths = [max(1, round(r * T / sum(raw))) for r in raw]
    lengths[-1] += T - sum(lengths)
    while lengths[-1] < 1:  # rounding took too much: give the last one back from the longest
        longest = lengths.index(max(lengths[:-1]))
        lengths[longest] -= 1
        lengths[-1] += 1
    return lengths


def _form_workload(op_name: str, form: str, direction: str, dims: dict, dev: str):
    """The triton state-form call of ``op_name`` in ``form`` (grid.FORMS) on seeded inputs at
    ``dims``, as ``measure.callable_workload`` runs it: dense; ``reverse=True``; packed
    (``cu_seqlens=``, h_0 = 0); ``time_last``: the inputs stored with time at dim 2 (after the
    batch and D, or after the block ops' n: (B, D, T), (B, n, T, k, k)), called with ``dim=2``;
    ``looped``: the packed call's sequences one call each, as a caller without cu_seqlens does."""
    import torch

    import scankit

    from . import measure
    from .cases import OPS

    xs = OPS[op_name].inputs(dims, device=dev, requires_grad=direction == "fwdbwd")
    kwargs = dict(reverse=True) if form == "reverse" else {}
    time = 1
    if form == "time_last":
        xs = [x.detach().movedim(1, 2).contiguous().requires_grad_(x.requires_grad) for x in xs]
        time = kwargs["dim"] = 2
    bounds = [0]
    if form in ("packed", "looped"):
        for n in packed_lengths(dims["T"], grid.PACKED_SEQUENCES if dev == "cuda" else 3):
            bounds.append(bounds[-1] + n)
    if form == "packed":
        kwargs = dict(cu_seqlens=torch.tensor(bounds))  # on the host: no synchronisation per call

    def at(x, lo, hi):  # steps lo .. hi - 1 along time
        return x.narrow(time, lo, hi - lo)

    if op_name == "parallel_scan_log":
        def one(lc, lv, log_h0, **kw):
            return scankit.parallel_scan_log(lc, lv, log_h0=log_h0, **kw)

        def call(lc, lv):
            T = lc.shape[time]
            if form == "looped":  # h_0 = 0 as packed: log h_0 = -inf
                zero = torch.full_like(lv.select(time, 0), float("-inf"))
                return tuple(one(at(lc, lo, hi), at(lv, lo + 1, hi + 1), zero) for lo, hi in zip(bounds, bounds[1:]))
            return one(lc, at(lv, 1, T + 1), None if form == "packed" else lv.select(time, 0), **kwargs)
    else:
        public = getattr(scankit, OPS[op_name].public)

        def call(a, b):
            if form == "looped":
                return tuple(public(at(a, lo, hi), at(b, lo, hi), return_prefix=False)
                             for lo, hi in zip(bounds, bounds[1:]))
            return public(a, b, return_prefix=False, **kwargs)
    return measure.callable_workload(call, xs, direction)


def form_cells() -> dict:
    """Device time of each op's state form, dense, reverse=True and cu_seqlens=, at
    grid.FORMS_SHAPE (tiny, interpreted, on the CPU): the call forms beside the dense call. A
    commit whose scankit lacks a form records its cells n/a with the reason."""
    from . import measure

    dev = device()
    out = dict(device_time={}, skipped={}, failed={})
    with measure.scan_mode("triton"):  # the kernels (interpreted on the CPU), set once, not per call
        for op in grid.FORM_OPS:
            for form in grid.FORMS:
                for direction in grid.DIRECTIONS:
                    _form_cell(op, form, direction, _form_dims(op, dev), dev, out)
    return out


def _form_dims(op: str, dev: str) -> dict:
    s = grid.FORMS_SHAPE
    dims = (dict(B=1, T=s.T, D=s.D) if op in ("parallel_scan_log", grid.STATE_OP) else
            dict(B=1, T=s.T, n=s.d // 2) if op == "matrix_scan" else dict(B=1, T=s.T, n=s.d // 8, k=8, v=1))
    return dims if dev == "cuda" else dict(dims, T=13, **({"D": 4} if "D" in dims else {"n": 1}))


def _form_cell(op: str, form: str, direction: str, dims: dict, dev: str, out: dict) -> None:
    import torch

    key = (op, form, direction)

    def time_it():
        fn = _form_workload(op, form, direction, dims, dev)
        try:
            fn()
        except TypeError as exc:  # an older commit's op has no reverse= / cu_seqlens=: n/a, not failed
            if "unexpected keyword argument" not in str(exc):
                raise
            out["skipped"][key] = f"scankit at this commit has no {form} form: {exc}"[:200]
            return None
        return timed(fn, dev)

    cell = failing(out, key, time_it)
    if cell is not None:
        out["device_time"][key] = cell
    if dev == "cuda":
        torch.cuda.empty_cache()


def missing_in_commit(op_name: str):
    """Why the installed scankit cannot run ``op_name`` (an older commit), or None."""
    import scankit

    from .cases import OPS

    public = OPS[op_name].public
    return None if hasattr(scankit, public) else f"scankit at this commit has no {public}()"


def copy_bandwidth() -> float:
    from . import measure

    if device() == "cpu":
        raise NotImplementedError("copy bandwidth needs a CUDA device")
    return measure.copy_bandwidth()


def spawn_pool(max_workers: int):
    """A pool of spawned processes that can import this package. asv puts the folder above
    ``benchmarks/`` on sys.path only while it imports the suite, and a spawned child unpickles
    each call by module path, so without the folder every child dies on its first call
    (``No module named 'benchmarks'``); the initializer adds it first."""
    import concurrent.futures as cf
    import multiprocessing as mp
    import site

    return cf.ProcessPoolExecutor(max_workers=max_workers, mp_context=mp.get_context("spawn"),
                                  initializer=site.addsitedir, initargs=(str(REPO),))


def in_workers(fn, arg_lists: list[tuple], progress=iter, here=True) -> list:
    """``[fn(*args) for args in arg_lists]``, the calls at once in up to WORKERS spawned
    processes; a call whose process dies (or cannot start) runs here instead, saying
    so (after one death the pool is broken, so every call not yet done runs here), or with
    ``here=False`` gives None (work whose fault must not reach this process's CUDA context)."""
    import concurrent.futures as cf

    out = []
    with spawn_pool(max(1, min(len(arg_lists), WORKERS))) as pool:
        futures = [pool.submit(fn, *args) for args in arg_lists]
        for args, future in progress(list(zip(arg_lists, futures))):
            try:
                out.append(future.result())
            except cf.process.BrokenProcessPool as exc:
                note(f"{fn.__name__}: a worker process died ({exc}); "
                     + ("its share runs here" if here else "its share is not run"))
                out.append(fn(*args) if here else None)
    return out


def _parity_share(cases: list, dev: str) -> list[list[dict]]:
    """The rows of each parity case of one worker's share."""
    from . import measure

    return [measure.parity_case(op_name, dims, device=dev, dtype=dtype) for op_name, dims, dtype in cases]


def parity_shares(cases: list, workers: int) -> list[list[int]]:
    """Indices of ``cases`` split into at most ``workers`` shares, the cases of one kernel
    specialization (op, k, v, dtype) together, so that each compiles in one process only;
    largest groups first onto the lightest share."""
    groups = defaultdict(list)
    for i, (op_name, dims, dtype) in enumerate(cases):
        groups[op_name, dims.get("k"), dims.get("v"), str(dtype)].append(i)
    return [sorted(share) for share in _balanced(groups.values(), workers)]


def _balanced(groups, workers: int, cost=len) -> list[list]:
    """Groups (lists) packed whole into at most ``workers`` shares, costliest first onto the
    least loaded (``cost`` of a group: its length unless given)."""
    groups = list(groups)
    shares = [[] for _ in range(max(1, min(workers, len(groups))))]
    load = [0] * len(shares)
    for members in sorted(groups, key=cost, reverse=True):
        i = load.index(min(load))
        shares[i].extend(members)
        load[i] += cost(members)
    return [share for share in shares if share]


def parity_rows(progress=iter, workers: int | None = None) -> list[dict]:
    """Every parity row: the seed grid (fp32), bf16 cases and the mixer cases.

    On CUDA the grid's cases run in ``workers`` spawned processes at once (default
    WORKERS), each taking whole kernel specializations: a cold run is mostly Triton
    compiling ~100 of them, one CPU core each. Parity is not timed, so sharing the GPU is
    harmless; a share whose process dies is computed here instead."""
    from . import measure

    dev = device()
    grid_cases = list(measure.parity_grid())
    if dev == "cpu":  # smoke: the first case of each op, tiny
        firsts = {}
        for op_name, dims, dtype in grid_cases:
            firsts.setdefault(op_name, (op_name, dict(dims, T=min(dims["T"], 5)), dtype))
        grid_cases = list(firsts.values())
    if workers is None:
        workers = WORKERS if dev == "cuda" else 1
    shares = parity_shares(grid_cases, workers)
    by_case = {}
    if len(shares) == 1:
        for i in progress(shares[0]):
            by_case[i] = _parity_share([grid_cases[i]], dev)[0]
    else:
        got = in_workers(_parity_share, [([grid_cases[i] for i in share], dev) for share in shares], progress)
        for share, share_rows in zip(shares, got):
            by_case.update(zip(share, share_rows))
    rows = [row for i in range(len(grid_cases)) for row in by_case[i]]
    for label in progress(grid.MIXER_LABELS):
        rows += measure.mixer_parity_case(label, device=dev, batch=2 if dev == "cpu" else 128, T=5 if dev == "cpu" else 64)
    return rows


def parity_summary(rows) -> dict:
    """Per (op or mixer, direction): number of failing rows and the worst error / gate."""
    out = {}
    for case in grid.OP_NAMES + grid.MIXER_LABELS:
        for direction in grid.PARITY_DIRECTIONS:
            mine = [r for r in rows if r["op"] == case and r["direction"] == direction]
            if mine:
                out[case, direction] = dict(failing=sum(not r["passed"] for r in mine),
                                            margin=max(r["margin"] for r in mine))
    return out


def write_parity_sidecar(rows, env) -> Path:
    """Keep an asv run's per-case parity rows beside its results:
    ``$SCANKIT_ASV_PARITY_DIR`` (default experiments/asv/parity) / machine / commit.json.

    The commit is asv's ``ASV_COMMIT`` where asv passes it (the commit it installed into its
    environment), else SCANKIT_ASV_COMMIT, else the checkout's HEAD (what an ``existing``
    environment runs); the machine comes from SCANKIT_ASV_MACHINE (``make bench`` sets it).
    """
    import subprocess

    commit = os.environ.get("ASV_COMMIT") or os.environ.get("SCANKIT_ASV_COMMIT") or subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    if not commit:
        raise RuntimeError("cannot tell which commit this asv run measures: set SCANKIT_ASV_COMMIT")
    base = Path(os.environ.get("SCANKIT_ASV_PARITY_DIR") or REPO / "experiments" / "asv" / "parity")
    path = base / os.environ.get("SCANKIT_ASV_MACHINE", "default") / f"{commit}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(dict(env=dict(env, commit=commit), rows=rows), indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return path


def mixer_cells() -> dict:
    """Seconds and peak bytes of one training step of the memory mixer, per shape and path."""
    from . import measure

    dev = device()
    seconds, peak = {}, {}
    for shape in grid.MEMORY_SHAPES:
        s = grid.SHAPES[shape]
        B, T = (2, 5) if dev == "cpu" else (s.B, s.T)
        for path in grid.MIXER_PATHS:
            fn = measure.mixer_train_step(grid.MEMORY_MIXER, path, B=B, T=T, device=dev)
            if dev == "cpu":
                seconds[shape, path], peak[shape, path] = _cpu_seconds(fn), None
            else:
                seconds[shape, path], peak[shape, path] = measure.median_of(measure.device_time(fn)), measure.peak_bytes(fn)
    return dict(seconds=seconds, peak_bytes=peak)


def _step_cell(make_step, dev: str) -> dict:
    """Seconds (median device time; the CPU's wall clock in a smoke run) and peak bytes of the
    training step ``make_step()`` builds, its memory released after."""
    import torch

    from . import measure

    fn = make_step()
    if dev == "cpu":
        return dict(seconds=_cpu_seconds(fn), peak_bytes=None)
    cell = dict(seconds=measure.median_of(measure.device_time(fn)), peak_bytes=measure.peak_bytes(fn))
    del fn
    torch.cuda.empty_cache()
    return cell


def _step_cells(cells) -> dict:
    """Seconds and peak bytes of training-step cells: ``cells`` yields (key, skip reason or None,
    make_step, reference cache key or None). A cell with a reference key is looked up in the
    machine's reference cache (measured there once); the others are measured now, under the
    kernel mode (the commit's kernels). A cell that raises is failed with its error."""
    from . import layers, measure

    dev = device()
    out = dict(seconds={}, peak_bytes={}, skipped={}, failed={})
    for key, reason, make_step, reference in cells:
        if reason is not None:
            out["skipped"][key] = reason
            continue

        def measure_it(make_step=make_step):
            return _step_cell(make_step, dev)

        if reference is None:
            with measure.scan_mode(measure._kernel_mode(dev)):
                cell = failing(out, key, measure_it)
        else:
            cell = failing(out, key, lambda: _cached_reference(reference, measure_it, source=layers))
        if cell is not None:
            out["seconds"][key], out["peak_bytes"][key] = cell["seconds"], cell["peak_bytes"]
    return out


def layer_cells(mixers=None, shapes=None, impls=None, dtypes=None) -> dict:
    """Seconds and peak bytes of one training step of each mixer's layer, shape, impl and dtype
    (grid.LAYER_*, or the subsets named; benchmarks.harness.layers; keys (mixer, shape, impl,
    dtype)): the kernel layer measured at this commit, the plain-torch and cuDNN layers looked up
    in the machine's reference cache (measured once per machine and torch, keyed by the layers
    module's source; the cuDNN GRU once for every mixer). A CPU smoke run: tiny dims, fp32,
    seconds only, no torch.compile."""
    from . import layers

    picked = []
    for name, given, known in (("mixers", mixers, grid.LAYER_MIXERS), ("shapes", shapes, grid.LAYER_SHAPES),
                               ("impls", impls, grid.LAYER_IMPLS), ("dtypes", dtypes, grid.LAYER_DTYPES)):
        unknown = [g for g in given or () if g not in known]
        if unknown:
            raise ValueError(f"layer_cells: {name} must be among {list(known)}, got {unknown}")
        picked.append(list(known) if given is None else list(given))
    dev = device()

    def cells():
        for mixer, shape, impl, dtype in itertools.product(*picked):
            B, T, d = (2, 7, 8) if dev == "cpu" else grid.LAYER_SHAPES[shape]
            if dev == "cpu":
                reason = "smoke run on the CPU" if impl == "plain_compile" or dtype == "bf16" else None
            else:
                reason = grid.layer_skip_reason(mixer, shape, impl)
            name = "layer:GRU" if impl == "cudnn_gru" else f"layer:{mixer}"
            yield ((mixer, shape, impl, dtype), reason,
                   functools.partial(layers.train_step, impl, B, T, d, dtype, dev, mixer),
                   None if impl == "kernel" else (name, shape, impl, dtype))

    return _step_cells(cells())


def stack_cells() -> dict:
    """Seconds and peak bytes of one training step of the mixer stack (grid.STACK_*; keys (shape,
    impl, dtype)), eager and compiled, both on the kernels at this commit. A CPU smoke run: tiny
    dims, eager fp32, seconds only."""
    from . import layers

    dev = device()

    def cells():
        for (shape, dims), impl, dtype in itertools.product(grid.STACK_SHAPES.items(), grid.STACK_IMPLS,
                                                            grid.LAYER_DTYPES):
            B, T, d = (2, 7, 16) if dev == "cpu" else dims
            cpu_skip = dev == "cpu" and (impl == "kernel_compile" or dtype == "bf16")
            yield ((shape, impl, dtype), "smoke run on the CPU" if cpu_skip else None,
                   functools.partial(layers.stack_step, impl, B, T, d, dtype, dev), None)

    return _step_cells(cells())


class IsolatedWorker:
    """A spawned process that runs calls one at a time, so that a CUDA fault there
    (third-party kernels) cannot poison this process's context. ``close()`` retires it (the
    next call starts a fresh one): after a fault, whose sticky error would fail every later
    call in that process. A call that kills the process raises RuntimeError saying so."""

    def __init__(self):
        self._pool = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def __call__(self, fn, *args):
        import concurrent.futures as cf

        if self._pool is None:
            self._pool = spawn_pool(1)
        try:
            return self._pool.submit(fn, *args).result()
        except cf.process.BrokenProcessPool as exc:
            self.close()
            raise RuntimeError(f"the measuring process died: {exc}") from None


def isolated(fn, *args):
    """``fn(*args)`` in a fresh spawned process (``IsolatedWorker``); its result, or the
    exception it raised, or RuntimeError saying how that process ended."""
    with IsolatedWorker() as worker:
        return worker(fn, *args)


def _peer_workload(name: str, direction: str, shape: str):
    """The no-argument call of one peer cell (``measure.callable_workload``)."""
    from . import measure, peers

    run, args = peers.peer_fn(name, *measure.inputs_for(grid.STATE_OP, shape, direction))
    return measure.callable_workload(run, args, direction)


def _warm_peer(name: str, direction: str, shape: str) -> bool:
    """One call of a peer's cell (its compiles land in the disk caches); whether it ran."""
    try:
        _peer_workload(name, direction, shape)()
        return True
    except Exception:  # the timing pass says why
        return False


def _peer_direction_cells(name: str, direction: str, shapes: tuple) -> tuple[dict, dict]:
    """One peer, one direction, every shape: ({shape: seconds}, {shape: why not})."""
    import torch

    from . import measure

    seconds, skipped = {}, {}
    for shape in shapes:
        try:
            seconds[shape] = measure.median_of(measure.device_time(_peer_workload(name, direction, shape)))
        except Exception as exc:  # a peer that cannot do this cell: say so in the table
            skipped[shape] = f"{type(exc).__name__}: {exc}"[:160]
        try:
            torch.cuda.empty_cache()
        except Exception:  # the context is gone (a fault above): the next cells say so themselves
            pass
    return seconds, skipped


def peer_cells(shapes=tuple(grid.SHAPES)) -> dict:
    """Seconds of each peer on STATE_OP per shape x direction; skipped cells with the reason
    (not installed, no CUDA, or the error the peer raised on that cell). Each peer and
    direction is measured in a worker process (``IsolatedWorker``), replaced after any CUDA
    error: a peer that faults takes only its own cells down, and the others do not pay a
    fresh process (torch import, CUDA context) each."""
    from . import peers

    dev = device()
    seconds, skipped = {}, {}
    available = [(name, direction) for name in grid.PEERS for direction in grid.DIRECTIONS
                 if not peers.unavailable(name, dev, direction)]
    if dev == "cuda" and available:  # their compiles (torch.compile, Triton, autotuning) at once, then timed one by one
        in_workers(_warm_peer, [(name, direction, shape) for name, direction in available for shape in shapes], here=False)
    with IsolatedWorker() as worker:
        for name in grid.PEERS:
            for direction in grid.DIRECTIONS:
                reason = peers.unavailable(name, dev, direction)
                if reason:
                    got, why = {}, dict.fromkeys(shapes, reason)
                else:
                    try:
                        got, why = worker(_peer_direction_cells, name, direction, tuple(shapes))
                    except Exception as exc:
                        got, why = {}, dict.fromkeys(shapes, f"{type(exc).__name__}: {exc}"[:160])
                    if any("cuda" in w.lower() for w in why.values()):
                        worker.close()  # a fault's sticky error would fail every later cell there
                seconds.update({(shape, name, direction): v for shape, v in got.items()})
                skipped.update({(shape, name, direction): v for shape, v in why.items()})
    return dict(seconds=seconds, skipped=skipped)


def roofline_cells() -> dict:
    """Device time of issue 16's cells (grid.ROOFLINE_*): scankit's STATE_OP kernels and
    accelerated-scan on its native layout, per shape, dtype and direction, each with the bytes
    it must move; tiny shapes and wall time in a CPU smoke run, where the peer is n/a."""
    import torch

    from . import measure, peers

    dev = device()
    out = dict(device_time={}, bytes={}, skipped={}, failed={})
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    with measure.scan_mode("triton"):
        for shape, (B, T, D) in grid.ROOFLINE_SHAPES.items():
            dims = dict(B=B, T=T, D=D) if dev == "cuda" else dict(B=1, T=13, D=8)
            for dtype in grid.ROOFLINE_DTYPES:
                for impl in grid.ROOFLINE_IMPLS:
                    for direction in grid.DIRECTIONS:
                        key = (shape, impl, dtype, direction)
                        why = None if impl == "triton" else peers.unavailable(impl, dev, direction)
                        if why:
                            out["skipped"][key] = why
                            continue
                        cell = failing(out, key, lambda: _roofline_cell(impl, direction, dims, dtypes[dtype], dev))
                        if cell is not None:
                            out["device_time"][key], out["bytes"][key] = cell
                        if dev == "cuda":
                            torch.cuda.empty_cache()
    return out


def _roofline_cell(impl: str, direction: str, dims: dict, dtype, dev: str) -> tuple[dict, int]:
    from . import measure, peers
    from .cases import OPS

    a, b = OPS[grid.STATE_OP].inputs(dims, dtype=dtype, device=dev, requires_grad=direction == "fwdbwd")
    if impl == "triton":
        fn = measure.workload(grid.STATE_OP, "triton", direction, (a, b))
    else:
        fn = measure.callable_workload(*peers.peer_fn(impl, a, b), direction)
    # issue 16's bytes: read a, b, write h; the backward reads grad, a, h and writes da, db
    moved = a.numel() * a.element_size() * (3 if direction == "fwd" else 8)
    return timed(fn, dev), moved


def cliff_cells() -> dict:
    """Device time of issue 16's cliff sweep (grid.cliff_shapes): STATE_OP's fp32 forward from
    h_0 = 0 per (B, T, D), each with the bytes it must move (read a, b, write h); a cell whose
    tensors do not fit the GPU's free memory is skipped, saying so; tiny shapes and wall time
    in a CPU smoke run."""
    import torch

    from . import measure

    dev = device()
    out = dict(device_time={}, bytes={}, skipped={}, failed={})
    with measure.scan_mode("triton"):
        for shape, (B, T, D) in grid.cliff_shapes().items():
            key = (shape,)
            if dev == "cuda":
                need, free = 5 * 4 * B * T * D, torch.cuda.mem_get_info()[0]  # a, b, h, h in flight, a's build
                if need > 0.95 * free:
                    out["skipped"][key] = (f"needs ~{need / 2 ** 30:.0f} GiB (a, b, h and temporaries); "
                                           f"{free / 2 ** 30:.0f} GiB free on the GPU")
                    continue
            dims = dict(B=B, T=T, D=D) if dev == "cuda" else dict(B=1, T=13, D=8)
            cell = failing(out, key, lambda: _roofline_cell("triton", "fwd", dims, torch.float32, dev))
            if cell is not None:
                out["device_time"][key], out["bytes"][key] = cell
            if dev == "cuda":
                torch.cuda.empty_cache()
    return out


def block_dims(shape: str, k: int, v: int) -> dict:
    """A block-width cell's (B, T, n, k, v): n = d / k blocks of the grid shape's state width d."""
    s = grid.SHAPES[shape]
    return dict(B=s.B, T=s.T, n=s.d // k, k=k, v=v)


def block_workload(dims: dict, direction: str, dev: str):
    """(workload, bytes it must move) of a block-width cell: matrix_affine_scan's states only, on
    fresh inputs (``measure.callable_workload``); the states are b's shape and dtype (B, T, n, k,
    v), so the bytes need no call."""
    from . import measure
    from .cases import OPS, bytes_moved

    op = OPS["matrix_affine_scan"]
    M, b = op.inputs(dims, device=dev, requires_grad=direction == "fwdbwd")
    fn = measure.callable_workload(lambda M, b: op.fn(M, b, return_prefix=False), (M, b), direction)
    return fn, bytes_moved((M, b), (b,), direction)


def block_cells() -> dict:
    """Device time of issue 17's block-width cells (grid.BLOCK_*): matrix_affine_scan's states
    only, per shape, (k, v) and direction, each with the bytes it must move (read M and b, write
    h; the backward also reads grad, M, b and h and writes dM, db); tiny shapes and wall time in
    a CPU smoke run."""
    import torch

    from . import measure

    dev = device()
    out = dict(device_time={}, bytes={}, skipped={}, failed={})

    def cell(shape, k, v, direction):
        dims = block_dims(shape, k, v) if dev == "cuda" else dict(B=1, T=13, n=1, k=k, v=v)
        fn, moved = block_workload(dims, direction, dev)
        return timed(fn, dev), moved

    with measure.scan_mode("triton"):
        for shape in grid.BLOCK_SHAPES:
            for width, (k, v) in grid.BLOCK_WIDTHS.items():
                for direction in grid.DIRECTIONS:
                    key = (shape, width, direction)
                    got = failing(out, key, lambda: cell(shape, k, v, direction))
                    if got is not None:
                        out["device_time"][key], out["bytes"][key] = got
                    if dev == "cuda":
                        torch.cuda.empty_cache()
    return out


def scaling_cells() -> dict:
    """Forward seconds of the triton kernels at B = 1, D = 1024, T = 2^10 .. 2^20 (tiny in a smoke run)."""
    import torch

    from . import measure
    from .cases import OPS

    dev = device()
    seconds = {}
    for op in grid.SCALING_OPS:
        for log2t in grid.SCALING_LOG2T:
            dims = dict(B=grid.SCALING_B, T=2 ** log2t, D=grid.SCALING_D)
            if dev == "cpu":
                dims = dict(B=1, T=log2t, D=4)  # tiny, interpreted
            xs = OPS[op].inputs(dims, device=dev)
            fn = measure.workload(op, "triton", "fwd", xs)
            seconds[op, log2t] = _cpu_seconds(fn) if dev == "cpu" else measure.median_of(measure.device_time(fn))
            del xs, fn
            if dev == "cuda":
                torch.cuda.empty_cache()
    return dict(seconds=seconds)
