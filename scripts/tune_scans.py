#!/usr/bin/env python3
"""GPU experiments for the kernels' launch knobs, peers, scaling and host overhead.

    python scripts/tune_scans.py [--sections rotation widths gated gated_lookback lookback swing timing matrix2 chunking affine elementwise peers scaling host roofline few unaligned rows pipelining lanes] [--out DIR] [--budget S]

Each section prints a table as it goes and writes json under --out; a section stops when
the time budget (seconds, whole run) is spent. The knobs swept are the module-level ones
the kernels read (scankit.triton.common / affine), so a winner is adopted by editing them.
"""
import argparse
import contextlib
import cProfile
import io
import itertools
import json
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks.harness import grid, measure, suite  # noqa: E402
from benchmarks.harness.cases import OPS, bytes_moved  # noqa: E402
from scankit.triton import affine, common  # noqa: E402

START = time.time()


def tbps(op, shape, direction, us):
    ins, outs = measure.meta_inputs_outputs(op, shape)
    return bytes_moved(ins, outs, direction) / us / 1e6


def timed(op, shape, direction, impl="triton"):
    xs = measure.inputs_for(op, shape, direction)
    try:
        return measure.median_us(measure.workload(op, impl, direction, xs))
    finally:
        del xs
        torch.cuda.empty_cache()


@contextlib.contextmanager
def knobs(*tables):
    """Restore the given module-level knob dicts on leaving, however a sweep ends (its
    budget spent midway included), so later sections measure the adopted settings."""
    saved = [dict(t) for t in tables]
    try:
        yield
    finally:
        for table, values in zip(tables, saved):
            table.clear()
            table.update(values)


def affine_sweep(budget, log):
    """The generic block kernels' knobs (matrix_affine_scan, k = 8, v = 1, prefix form) at
    `large` / `vlong`: warps (one first: the k = 8 state then never crosses warps,
    scripts/block_sync_probe.py), programs per SM (one-warp programs are small, so more of them
    fit an SM) and the shortest T-chunk. matrix_scan takes the 2x2 kernels (matrix2's knobs)."""
    with knobs(affine.TUNING, common.PROGRAMS_PER_SM):
        for warps, per_sm, min_chunk in itertools.product((1, 2), (4, 8, 16, 32), (32, 8)):
            for shape, direction in itertools.product(("large", "vlong"), ("fwd", "fwdbwd")):
                if time.time() - START > budget:
                    return
                affine.TUNING.update(min_chunk=min_chunk, num_warps=warps)
                common.PROGRAMS_PER_SM["affine"] = per_sm
                us = timed("matrix_affine_scan", shape, direction)
                log(dict(section="affine", per_sm=per_sm, min_chunk=min_chunk, product_elems=affine.TUNING["product_elems"],
                         warps=warps, op="matrix_affine_scan", shape=shape, direction=direction, us=us,
                         tbps=tbps("matrix_affine_scan", shape, direction, us)))


def widths_sweep(budget, log):
    """Issue 17's block widths (suite.block_workload: matrix_affine_scan states only at
    grid.BLOCK_SHAPES): blocks per program (affine.TUNING's product_elems set so that
    ``_block_lanes`` gives 1, 2, 4, 8) x warps (1, 2, 4), the adopted point first, fwd and fwd+bwd
    device time with % of the copy bandwidth, each cell checked against the adopted point's
    outputs / grads. k = 16 first: its products run on the tensor cores (tl.dot), to which more
    blocks and warps a program give more rows than one 16 x 16 block does."""
    copy = None
    reference = {}
    for width, (k, v) in reversed(grid.BLOCK_WIDTHS.items()):
        # each width from the adopted table: its first point is then production's
        with knobs(affine.TUNING):
            kb, vb = common.next_pow2(k), common.next_pow2(v)
            n = suite.block_dims(grid.BLOCK_SHAPES[0], k, v)["n"]
            adopted = (affine._block_lanes(n, k, v), affine.TUNING["num_warps"])
            points = [adopted] + [p for p in itertools.product((1, 2, 4, 8), (1, 2, 4)) if p != adopted]
            for lanes, warps in points:
                affine.TUNING.update(product_elems=lanes * kb * kb * max(kb, vb), num_warps=warps)
                for shape, direction in itertools.product(grid.BLOCK_SHAPES, grid.DIRECTIONS):
                    if time.time() - START > budget:
                        return
                    copy = copy or measure.copy_bandwidth()
                    dims = suite.block_dims(shape, k, v)
                    fn, moved = suite.block_workload(dims, direction, "cuda")
                    us, err = _checked(fn, reference, (width, shape, direction))
                    log(dict(section="widths", width=width, shape=shape, direction=direction,
                             lanes=affine._block_lanes(dims["n"], k, v), warps=warps, us=us,
                             pct_copy=100 * moved / (us * 1e-6) / copy, rel_err=err,
                             adopted=(lanes, warps) == adopted))
                    del fn  # its inputs, before the next cell's


def timing_ab(budget, log):
    """measure.median_us (back-to-back blocks) beside triton's do_bench (per call, L2 flushed)
    on the same cells in one process: how far apart the two methods are, per shape."""
    import triton.testing

    for op, shape, direction in itertools.product(("linear_scan_state", "matrix_scan"), grid.SHAPES, grid.DIRECTIONS):
        if time.time() - START > budget:
            return
        xs = measure.inputs_for(op, shape, direction)
        fn = measure.workload(op, "triton", direction, xs)
        blocks = measure.median_us(fn)
        per_call = 1e3 * triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
        log(dict(section="timing", op=op, shape=shape, direction=direction, blocks_us=blocks, do_bench_us=per_call,
                 ratio=blocks / per_call))
        del xs, fn
        torch.cuda.empty_cache()


def chunking_sweep(budget, log):
    """common.CHUNKING: when to split T (min_tiles) and how many programs per SM once split."""
    cells = [(op, shape, direction) for op in ("linear_scan_state", "parallel_scan_log")
             for shape in ("longT", "vlong") for direction in ("fwd", "fwdbwd")]
    with knobs(common.CHUNKING):
        for min_tiles, per_sm in itertools.product((0, 32, 128), (None, 8, 16)):
            for op, shape, direction in cells:
                if time.time() - START > budget:
                    return
                common.CHUNKING.update(min_tiles=min_tiles, programs_per_sm=per_sm)
                us = timed(op, shape, direction)
                log(dict(section="chunking", min_tiles=min_tiles, per_sm=per_sm, op=op, shape=shape,
                         direction=direction, us=us, tbps=tbps(op, shape, direction, us)))


def matrix2_sweep(budget, log):
    """matrix_scan: the generic block kernels against the 2x2 ones (affine.TWO_BY_TWO) at
    (lanes per program, warps, programs per SM, pipelining) points, each checked against the
    first point's (the adopted 2x2 geometry) outputs / grads."""
    points = [(32, 1, 32, None), None, (32, 1, 32, 2), (64, 2, 16, None), (64, 1, 32, None), (128, 4, 8, None),
              (16, 1, 64, None)]
    reference = {}
    with knobs(affine.TWO_BY_TWO):
        affine.TWO_BY_TWO["min_t"] = 0  # every shape, lab's T = 64 included
        for point in points:
            for shape, direction in itertools.product(("large", "vlong", "longT", "lab"), ("fwd", "fwdbwd")):
                if time.time() - START > budget:
                    return
                if point is None:
                    affine.TWO_BY_TWO.update(enabled=False)
                else:
                    block_n, warps, per_sm, stages = point
                    affine.TWO_BY_TWO.update(enabled=True, block_n=block_n, num_warps=warps, per_sm=per_sm,
                                             stages=stages)
                us, err = _checked_us("matrix_scan", shape, direction, reference, (shape, direction))
                log(dict(section="matrix2", kernel="generic" if point is None else "2x2", point=point, shape=shape,
                         direction=direction, us=us, tbps=tbps("matrix_scan", shape, direction, us), rel_err=err))


def _checked_us(op, shape, direction, reference, key):
    """(median us, max relative difference against ``reference[key]``) of one cell at the
    current knobs; the first result of a key becomes its reference (relative error None).
    ``shape`` is a grid shape name or a dims dict."""
    dims = shape if isinstance(shape, dict) else None
    xs = (OPS[op].inputs(dims, device="cuda", requires_grad=direction == "fwdbwd") if dims
          else measure.inputs_for(op, shape, direction))
    return _checked(measure.workload(op, "triton", direction, xs), reference, key)


def _checked(fn, reference, key):
    """``_checked_us`` of any workload ``fn`` (measure.callable_workload)."""
    result = [t.detach().clone() for t in _flat(fn())]  # outputs, or input grads
    err = None
    if key in reference:
        err = max(((r - q).abs().max() / q.abs().max().clamp_min(1e-30)).item()
                  for r, q in zip(result, reference[key]))
    else:
        reference[key] = result
    us = 1e6 * measure.median_of(measure.device_time(fn))
    del fn, result
    torch.cuda.empty_cache()
    return us, err


def pipelining_sweep(budget, log):
    """The generic block kernels' step-loop pipelining (affine.TUNING["stages"], where the
    tree has it; 1 = no pipelining) at k = 4, 8, 16 and matrix_scan below the 2x2 kernels' T,
    fwd and fwd+bwd, device time, each checked against the stages = 1 outputs / grads."""
    if "stages" not in affine.TUNING:
        log(dict(section="pipelining", skipped="this tree's generic kernels have no stages knob"))
        return
    cells = [("matrix_affine_scan", dict(B=32, T=4096, n=256 // k, k=k, v=1)) for k in (4, 8, 16)]
    cells += [("matrix_affine_scan", dict(B=16, T=1024, n=8, k=8, v=1)), ("matrix_affine_scan", dict(B=128, T=64, n=8, k=8, v=1)),
              ("matrix_scan", dict(B=16, T=1024, n=32)), ("matrix_scan", dict(B=128, T=64, n=32))]
    reference = {}
    with knobs(affine.TUNING, affine.TWO_BY_TWO):
        affine.TWO_BY_TWO["enabled"] = False  # matrix_scan on the generic kernels at every T
        for stages in (1, 2, 3, 4):
            affine.TUNING["stages"] = stages
            for (op, dims), direction in itertools.product(cells, ("fwd", "fwdbwd")):
                if time.time() - START > budget:
                    return
                key = (op, tuple(dims.items()), direction)
                try:
                    us, err = _checked_us(op, dims, direction, reference, key)
                except Exception as exc:  # a stage count that fails to compile or run
                    log(dict(section="pipelining", stages=stages, op=op, dims=dims, direction=direction,
                             error=f"{type(exc).__name__}: {exc}"[:300]))
                    torch.cuda.empty_cache()
                    continue
                log(dict(section="pipelining", stages=stages, op=op, dims=dims, direction=direction, us=us,
                         rel_err=err))


def lanes_sweep(budget, log):
    """The lane-block backward (affine.LANE_BLOCKS, where the tree has it) against the generic
    kernels ("generic": lane blocks off), over programs per SM and the shortest chunk: k = 4 at
    `large`'s width (v = 1, 4) and at B = 1, k = 8 (lanes allowed up to k = 8 here), fwd+bwd
    (the forward is generic either way), each checked against the generic kernels' grads."""
    if not hasattr(affine, "LANE_BLOCKS"):
        log(dict(section="lanes", skipped="this tree has no lane-block kernels"))
        return
    cells = [dict(B=32, T=4096, n=64, k=4, v=1), dict(B=1, T=65536, n=64, k=4, v=1),
             dict(B=32, T=4096, n=64, k=4, v=4), dict(B=32, T=4096, n=32, k=8, v=1)]
    points = [None] + [(per_sm, min_chunk) for per_sm in (4, 8, 16, 32) for min_chunk in (16, 64)]
    reference = {}
    with knobs(affine.LANE_BLOCKS):
        for point in points:
            if point is None:
                affine.LANE_BLOCKS["max_k"] = 0  # every block on the generic kernels
            else:
                affine.LANE_BLOCKS.update(max_k=8, per_sm=point[0], min_chunk=point[1])
            for dims, direction in itertools.product(cells, ("fwdbwd",)):
                if time.time() - START > budget:
                    return
                us, err = _checked_us("matrix_affine_scan", dims, direction, reference,
                                      (tuple(dims.items()), direction))
                log(dict(section="lanes", kernel="generic" if point is None else "lanes", point=point, dims=dims,
                         direction=direction, us=us, rel_err=err))


def rotation_sweep(budget, log, points=None):
    """The angle-fused rotation kernels (scankit.triton.rotation_scan; givens.CHUNKS): one walk
    ("walk": chunking off) against T-chunking at (elements per program, programs per SM, shortest
    chunk, fewest chunks) points, for Givens k = 8, 3 rounds, and the Rotation mixer's k = 2
    (scale and decay), at the grid's large and vlong shapes (issue 17's goal 3: vlong's time per
    token within 2x of large's), fwd and fwd+bwd device time, each checked against the walk's
    outputs / grads. ``points`` (--rotation-points): the (elems, per_sm, min_chunk, min_chunks)
    points to sweep in place of the adopted one's neighbours."""
    from scankit.triton import givens, rotation_scan

    def inputs(B, T, d, k, R):
        n = d // k
        gen = torch.Generator("cuda").manual_seed(0)
        r = lambda *shape: torch.rand(*shape, device="cuda", generator=gen)  # noqa: E731
        names = ("scale", "gamma", "h0") if k == 2 else ("gamma", "h0")  # the Rotation mixer's scale: k = 2 only
        # decays near 1: a chunk's map keeps its carry-in (0.5 .. 1 made it 0 over a chunk, so the check
        # against the walk could not see the fold)
        xs = [r(B, T, n, R, k // 2) * 6 - 3, r(B, T, n, k) - 0.5] + ([r(B, T, n)] if k == 2 else []) \
            + [r(B, T, n) * 0.01 + 0.99, r(B, n, k)]
        fn = lambda angles, b, *rest: rotation_scan(angles, b, **dict(zip(names, rest)))  # noqa: E731
        return fn, [x.requires_grad_() for x in xs]

    cells = [((32, 4096, 1024, 8, 3), "givens"), ((1, 65536, 1024, 8, 3), "givens"),  # the grid's large and vlong
             ((32, 4096, 1024, 2, 1), "rotation"), ((1, 65536, 1024, 2, 1), "rotation"),
             ((16, 2048, 512, 8, 3), "givens"), ((64, 256, 512, 2, 1), "rotation"),  # issue 17's layer shape, a short-T batch
             ((64, 2048, 1024, 8, 3), "givens"), ((128, 1024, 1024, 8, 3), "givens"),  # fuller devices: 2 .. 4 chunks
             ((128, 4096, 1024, 2, 1), "rotation"),
             ((32, 4096, 1024, 16, 3), "givens"), ((1, 65536, 1024, 16, 3), "givens")]  # k = 16 blocks
    # (elems, per_sm, min_chunk, min_chunks): the walk, givens.CHUNKS, then its neighbours
    names = ("elems", "per_sm", "min_chunk", "min_chunks")
    adopted = tuple(givens.CHUNKS[name] for name in names)
    scaled = lambda axis, f: tuple(f(v) if j == axis else v for j, v in enumerate(adopted))  # noqa: E731
    points = [None, adopted] + (points or [scaled(axis, f) for axis in (3, 2, 1, 0)
                                           for f in (lambda v: v // 2, lambda v: v * 2)])
    reference = {}
    with knobs(givens.CHUNKS):
        for point in points:
            if point is None:
                givens.CHUNKS["min_chunk"] = 1 << 40  # one walk
            else:
                givens.CHUNKS.update(zip(names, point))
            for (dims, name), direction in itertools.product(cells, ("fwd", "fwdbwd")):
                if time.time() - START > budget:
                    return
                scan, xs = inputs(*dims)
                us, err = _checked(measure.callable_workload(scan, xs, direction), reference, (dims, direction))
                B, T = dims[:2]
                bn, nc, _ = givens._geometry(B, T, dims[2] // dims[3], dims[3], xs[1].device)
                log(dict(section="rotation", mixer=name, point=point or "walk", dims=dims, direction=direction, lanes=bn, chunks=nc,
                         us=us, ns_per_token=1e3 * us / (B * T), rel_err=err))
                del scan, xs


def _moved(op, shape, direction):
    if isinstance(shape, dict):  # the scaling cells: elementwise state-only forward, read a, b, write h
        return 3 * 4 * shape["B"] * shape["T"] * shape["D"]
    return bytes_moved(*measure.meta_inputs_outputs(op, shape), direction)


# Whole elementwise configurations (common.LOOKBACK / common.CHUNKING updates), first the
# one main measured in run 11; each checked against it.
ELEMENTWISE_CONFIGS = {
    "run11": ({}, {}),
    "lb-linear-128": (dict(linear="chunked", tile=(128, 32, 4)), {}),
    "lb-linear-128+ch128/16": (dict(linear="chunked", tile=(128, 32, 4)), dict(min_tiles=128, programs_per_sm=16)),
    "lb-linear-128+ch0/16": (dict(linear="chunked", tile=(128, 32, 4)), dict(programs_per_sm=16)),
    "lb-linear-256x8": (dict(linear="chunked", tile=(256, 32, 8)), {}),
    "lb-linear-128x8": (dict(linear="chunked", tile=(128, 32, 8)), {}),
}


def lookback_sweep(budget, log):
    """Whole configurations of the single-pass look-back kernels (common.LOOKBACK) and the
    T-chunking rule (common.CHUNKING) over the elementwise cells and the B = 1 scaling
    cells; each cell's outputs / grads checked against the first configuration's (the
    look-back spin-waits only run concurrently on a GPU)."""
    cells = list(itertools.product(("linear_scan_state", "parallel_scan_log", "linear_scan"),
                                   ("large", "vlong", "longT", "lab"), ("fwd", "fwdbwd")))
    scaling = [(op, dict(B=1, T=2 ** k, D=1024), "fwd") for op in ("linear_scan_state", "parallel_scan_log")
               for k in (10, 13, 16, 20)]
    reference = {}
    for name, (lookback, chunking) in ELEMENTWISE_CONFIGS.items():
        with knobs(common.LOOKBACK, common.CHUNKING):
            common.LOOKBACK.update(lookback)
            common.CHUNKING.update(chunking)
            for op, shape, direction in cells + scaling:
                if time.time() - START > budget:
                    return
                us, err = _checked_us(op, shape, direction, reference, (op, str(shape), direction))
                log(dict(section="lookback", config=name, op=op, shape=str(shape), direction=direction, us=us,
                         tbps=_moved(op, shape, direction) / us / 1e6, rel_err=err))


def _flat(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


def elementwise_sweep(budget, log):
    with knobs(common.ELEMENTWISE_STAGES, common.PROGRAMS_PER_SM):
        for stages, per_sm in itertools.product((None, 3), (4, 16)):
            for op, shape, direction in itertools.product(("linear_scan_state", "linear_scan", "parallel_scan_log"),
                                                          ("large", "vlong"), ("fwd", "fwdbwd")):
                if time.time() - START > budget:
                    return
                common.ELEMENTWISE_STAGES.update(dict.fromkeys(common.ELEMENTWISE_STAGES, stages))
                common.PROGRAMS_PER_SM["elementwise"] = per_sm
                us = timed(op, shape, direction)
                log(dict(section="elementwise", stages=stages, per_sm=per_sm, op=op, shape=shape,
                         direction=direction, us=us, tbps=tbps(op, shape, direction, us)))


def peer_sweep(budget, log):
    """The asv Peers cells (benchmarks.harness.suite.peer_cells) beside triton's time, per shape."""
    for shape in grid.SHAPES:
        if time.time() - START > budget:
            return
        cells = suite.peer_cells(shapes=(shape,))
        for direction in grid.DIRECTIONS:
            log(dict(section="peers", shape=shape, direction=direction, impl="triton",
                     us=timed(grid.STATE_OP, shape, direction)))
            for name in grid.PEERS:
                s = cells["seconds"].get((shape, name, direction))
                log(dict(section="peers", shape=shape, direction=direction, impl=name,
                         us=None if s is None else s * 1e6, error=cells["skipped"].get((shape, name, direction))))


def scaling_sweep(budget, log):
    """The asv Scaling cells (benchmarks.harness.suite.scaling_cells)."""
    for (op, log2t), s in suite.scaling_cells()["seconds"].items():
        log(dict(section="scaling", op=op, T=2 ** log2t, us=s * 1e6,
                 ns_per_elem=1e9 * s / (grid.SCALING_B * 2 ** log2t * grid.SCALING_D)))


def _one_process_cells(cells):
    """Median us of (op, shape, direction) cells, in this (fresh) process."""
    out = []
    for op, shape, direction in cells:
        out.append(timed(op, shape, direction))
    return out


def swing(budget, log):
    """Run-to-run swing: the same cells timed in several fresh processes, one after the other
    (runs 16-17 read the 2x2 matrix_scan fwd at `large` 1.54x apart; tune runs 374-573 us)."""
    cells = [("matrix_scan", "large", "fwd"), ("matrix_scan", "vlong", "fwd"), ("matrix_scan", "large", "fwdbwd"),
             ("linear_scan_state", "large", "fwd"), ("linear_scan_state", "lab", "fwdbwd")]
    for i in range(6):
        if time.time() - START > budget:
            return
        with suite.IsolatedWorker() as worker:
            for (op, shape, direction), us in zip(cells, worker(_one_process_cells, cells)):
                log(dict(section="swing", process=i, op=op, shape=shape, direction=direction, us=us))


def host_profile(budget, log):
    """Where the host time of one small fwd+bwd goes (cProfile), and its GPU launches."""
    for op in grid.OP_NAMES:
        if time.time() - START > budget:
            return
        xs = measure.inputs_for(op, "lab", "fwdbwd")
        fn = measure.workload(op, "triton", "fwdbwd", xs)
        us = measure.median_us(fn)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(50):
            fn()
        host_us = (time.perf_counter() - t0) / 50 * 1e6
        torch.cuda.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(50):
            fn()
        prof.disable()
        torch.cuda.synchronize()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(18)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as p:
            fn()
            torch.cuda.synchronize()
        kernels = sorted({e.name for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA})
        log(dict(section="host", op=op, us=us, host_us=host_us, kernels=kernels, profile=text.getvalue()[-3500:]))


# Issue 16's cells: linear_scan_state at its five (B, T, D), fp32 (and bf16 at the first), the
# prefix form and the log op at two of them; device time (the tracker's), each checked against
# the first configuration's outputs / grads, accelerated-scan on its (B, D, T) layout beside.
# Round 1 (experiments/logs/2026-12-03-h200-s16-call1-roofline.*) swept walking and look-back
# tiles over "wide" and "narrow"; round 2 (the default) the walking / look-back crossover over B
# ("crossover", "odd"), look-back windows of multi-warp tiles, bf16 and pipelining depths
# (experiments/logs/2026-12-03-h200-s16-call2-roofline.*).
ROOFLINE_CELLS = {
    "wide": [("linear_scan_state", (32, 4096, 1024)), ("linear_scan", (32, 4096, 1024)),
             ("parallel_scan_log", (32, 4096, 1024))],
    "narrow": [("linear_scan_state", (1, 65536, 1024)), ("linear_scan_state", (1, 2 ** 20, 1024)),
               ("linear_scan_state", (16, 2048, 512)), ("linear_scan_state", (8, 512, 256)),
               ("linear_scan", (1, 65536, 1024)), ("parallel_scan_log", (1, 65536, 1024))],
    "crossover": [("linear_scan_state", (B, 4096, 1024)) for B in (8, 16, 24, 48, 64)],
    "odd": [("linear_scan_state", (32, 4096, 768)), ("linear_scan_state", (5, 7777, 3000)),
            ("linear_scan_state", (2, 65536, 1024))],
    "bf16": [("linear_scan_state", (32, 4096, 1024))],
}
ROUND1 = [
    ("main", ("wide", "narrow"), {}),
    ("walk16x128w1", ("wide",), dict(tiles={"linear": (16, 128, 1), "log": (16, 128, 1)}, per_sm=1)),
    ("lb8x128w1win2", ("narrow",), dict(lookback=dict(tile=(8, 128, 1), window=2))),
    ("lb16x128w1win2", ("narrow",), dict(lookback=dict(tile=(16, 128, 1), window=2))),
    ("walk8x128w1", ("wide",), dict(tiles={"linear": (8, 128, 1), "log": (8, 128, 1)}, per_sm=1)),
    ("lb8x128w1win1", ("narrow",), dict(lookback=dict(tile=(8, 128, 1), window=1))),
    ("lb8x128w1win4", ("narrow",), dict(lookback=dict(tile=(8, 128, 1), window=4))),
    ("walk16x256w2", ("wide",), dict(tiles={"linear": (16, 256, 2), "log": (8, 256, 2)}, per_sm=0.5)),
    ("lb16x128w1win1", ("narrow",), dict(lookback=dict(tile=(16, 128, 1), window=1))),
    ("walk16x128w1s3", ("wide",), dict(tiles={"linear": (16, 128, 1), "log": (8, 128, 1)}, per_sm=1,
                                        stages={("linear", "fwd"): 3, ("log", "fwd"): 3})),
    ("lb128x32w4win4", ("narrow",), dict(lookback=dict(tile=(128, 32, 4), window=4))),
]
# (name, cell classes, knob updates: ELEMENTWISE_TILES, PROGRAMS_PER_SM["elementwise"], LOOKBACK,
# ELEMENTWISE_STAGES). Round 1: tiles with every lane along D keep the T-scan in one thread (no
# shuffles, no barriers: compile_for_gpu's ttgir), one warp per 128 columns of 4-wide loads;
# they need software pipelining (3 stages: large state fwd 650 -> 401 us) and lose as look-back
# tiles (one per program: 4-8x the tickets); smaller look-back windows won (16 -> 4).
WALK = dict(tiles={"linear": (16, 128, 1)}, per_sm=0.01, stages={("linear", "fwd"): 3, ("linear", "bwd"): 3})
ROUND2 = [
    ("main", ("crossover", "odd", "narrow"), dict(lookback=dict(window=4))),
    ("walk16x128s3", ("crossover", "odd", "bf16"), WALK),
    ("lb128x32w4win2", ("narrow",), dict(lookback=dict(tile=(128, 32, 4), window=2))),
    ("lb128x32w4win1", ("narrow",), dict(lookback=dict(tile=(128, 32, 4), window=1))),
    ("lb256x32w8win2", ("narrow",), dict(lookback=dict(tile=(256, 32, 8), window=2))),
    ("lb64x32w4win2", ("narrow",), dict(lookback=dict(tile=(64, 32, 4), window=2))),
    ("walk16x256s3", ("bf16", "odd"), dict(WALK, tiles={"linear": (16, 256, 1)})),
    ("walk16x128s4", ("bf16", "crossover"), dict(WALK, stages={("linear", "fwd"): 4, ("linear", "bwd"): 4})),
    ("walk16x128s2", ("bf16",), dict(WALK, stages={("linear", "fwd"): 2, ("linear", "bwd"): 2})),
    ("lb256x32w8win4", ("narrow",), dict(lookback=dict(tile=(256, 32, 8), window=4))),
    ("walk8x256s3", ("bf16",), dict(WALK, tiles={"linear": (8, 256, 1)})),
]
# Round 3 (the default): the adopted configuration (common.IN_THREAD walking, look-back window 1)
# over every class, accelerated-scan beside at issue 16's shapes.
ROOFLINE_CONFIGS = [("main", ("wide", "narrow", "crossover", "odd"), {})]
ROOFLINE_PEERS = True


def _device_us(op, dims, direction, reference, key, dtype=torch.float32):
    """(median device-time us, max relative difference against ``reference[key]``) of one cell."""
    B, T, D = dims
    xs = OPS[op].inputs(dict(B=B, T=T, D=D), device="cuda", dtype=dtype, requires_grad=direction == "fwdbwd")
    fn = measure.workload(op, "triton", direction, xs)
    result = [t.detach().float().clone() for t in _flat(fn())]
    err = None
    if key in reference:
        err = max(((r - q).abs().max() / q.abs().max().clamp_min(1e-30)).item()
                  for r, q in zip(result, reference[key]))
    else:
        reference[key] = result
    us = 1e6 * measure.median_of(measure.device_time(fn))
    del xs, fn, result
    torch.cuda.empty_cache()
    return us, err


def _state_bytes(op, dims, direction, dtype):
    B, T, D = dims
    n = B * T * D * (2 if dtype == torch.bfloat16 else 4)
    outs = 2 if op == "linear_scan" else 1
    # cases.bytes_moved's model: fwd reads a, b and writes the outputs; fwd+bwd adds grad-outs,
    # inputs and outputs read and the input grads written
    return n * (2 + outs) if direction == "fwd" else n * (6 + 3 * outs)


def roofline_sweep(budget, log):
    """Issue 16: elementwise tile geometries (ROOFLINE_CONFIGS) over its cells, and
    accelerated-scan on its native layout at the same cells, in one process."""
    from benchmarks.harness import peers

    copy = measure.copy_bandwidth()
    reference = {}
    if peers.unavailable("accelerated_scan_native") is None and ROOFLINE_PEERS:
        for op, dims in ROOFLINE_CELLS["wide"][:1] + ROOFLINE_CELLS["narrow"][:4]:
            for dtype in (torch.float32, torch.bfloat16) if dims == (32, 4096, 1024) else (torch.float32,):
                for direction in ("fwd", "fwdbwd"):
                    if time.time() - START > budget:
                        return
                    B, T, D = dims
                    a, b = OPS[op].inputs(dict(B=B, T=T, D=D), device="cuda", dtype=dtype,
                                          requires_grad=direction == "fwdbwd")
                    run, args = peers.peer_fn("accelerated_scan_native", a, b)
                    us = 1e6 * measure.median_of(measure.device_time(measure.callable_workload(run, args, direction)))
                    moved = _state_bytes(op, dims, direction, dtype)
                    log(dict(section="roofline", config="accelerated_scan_native", op=op, dims=dims,
                             dtype=str(dtype)[6:], direction=direction, us=us, pct_copy=100 * moved / us / 1e-6 / copy))
                    del a, b, run, args
                    torch.cuda.empty_cache()
    for name, classes, upd in ROOFLINE_CONFIGS:
        with knobs(common.ELEMENTWISE_TILES, common.PROGRAMS_PER_SM, common.LOOKBACK, common.ELEMENTWISE_STAGES):
            common.ELEMENTWISE_TILES.update(upd.get("tiles", {}))
            common.PROGRAMS_PER_SM["elementwise"] = upd.get("per_sm", common.PROGRAMS_PER_SM["elementwise"])
            common.LOOKBACK.update(upd.get("lookback", {}))
            common.ELEMENTWISE_STAGES.update(upd.get("stages", {}))
            for cls in classes:
                for op, dims in ROOFLINE_CELLS[cls]:
                    dtypes = ((torch.bfloat16,) if cls == "bf16" else (torch.float32, torch.bfloat16)
                              if (cls, op, dims) == ("wide",) + ROOFLINE_CELLS["wide"][0] else (torch.float32,))
                    for dtype in dtypes:
                        for direction in ("fwd", "fwdbwd"):
                            if time.time() - START > budget:
                                return
                            try:
                                us, err = _device_us(op, dims, direction, reference, (op, dims, direction, dtype), dtype)
                            except Exception as exc:  # a configuration that fails to compile or run
                                log(dict(section="roofline", config=name, op=op, dims=dims, direction=direction,
                                         error=f"{type(exc).__name__}: {exc}"[:300]))
                                torch.cuda.empty_cache()
                                continue
                            moved = _state_bytes(op, dims, direction, dtype)
                            log(dict(section="roofline", config=name, op=op, dims=dims, dtype=str(dtype)[6:],
                                     direction=direction, us=us, pct_copy=100 * moved / us / 1e-6 / copy, rel_err=err))


# Issue 16's cells where programs are few (session 37's --roofline, H100: bf16 (16, 2048, 512)
# fwd at 28% of copy, walking 64 one-warp programs; B = 1 fwd 72% fp32 / 46% bf16 on the
# look-back; (8, 7777, 1024) fp32 55%; measured in session 39: NOTES.md). The paths ({knob table in
# common: updates}): production; the forward's walk left to more programs (the backward's 1.25
# per SM), so these cells take the look-back tiles; those tiles at rows of 128 columns (512
# contiguous bytes of fp32 a row, a warp's 32 columns each: no replicas, unlike 64 columns over 4
# warps, which common.lookback_tiles refuses); a 2-byte dtype's backward walking only from twice
# its programs, as its forward does (IN_THREAD["two_byte"]); at B = 1 the look-back's tile on two
# warps, or reading 4 predecessors a step; or no look-back: a walk of one warp down narrow column
# strips (32 or 16 contiguous bytes a row: 128 or 256 programs at D = 1024), one chunk, the T-scan
# across lanes (accelerated-scan's layout walks one channel a program)
_TILES_FEW = {"programs_per_sm": {"fwd": 1.25, "bwd": 1.25}}
FEW_PATHS = {"main": {}, "tiles": {"IN_THREAD": _TILES_FEW},
             "tiles+lb64x128w4": {"IN_THREAD": _TILES_FEW, "LOOKBACK": dict(tile=(64, 128, 4))},
             "tiles+lb32x128w4": {"IN_THREAD": _TILES_FEW, "LOOKBACK": dict(tile=(32, 128, 4))},
             "bwd2.5": {"IN_THREAD": {"two_byte": {"fwd": 2.0, "bwd": 2.0}}},
             "lb128x32w2": {"LOOKBACK": dict(tile=(128, 32, 2))}, "lb-window4": {"LOOKBACK": dict(window=4)},
             **{f"walk{t}x{d}w1": {"LOOKBACK": dict(linear="off"), "ELEMENTWISE_TILES": dict(linear=(t, d, 1)),
                                   "CHUNKING": dict(min_tiles=1 << 30)} for t, d in ((256, 8), (512, 4), (256, 16))}}
STATE = "linear_scan_state"
# linear_scan_state cells where programs are few, each with the paths that question it
_CROSSOVER = ("main", "tiles", "tiles+lb64x128w4")
FEW_CELLS = [
    # fp32 at 64, 96 and 128 programs: the walk against the look-back tiles (session 38's H100
    # preferred the tiles at 64 programs, session 16's H200 the walk; at T = 7777 the walk paid a
    # row mask a tile until session 40)
    *((STATE, (B, T, 1024), torch.float32, _CROSSOVER) for T in (4096, 7777) for B in (8, 12, 16)),
    # bf16 at 64 programs: production takes the tiles since 0035524
    *((STATE, dims, torch.bfloat16, ("main", "tiles+lb64x128w4")) for dims in ((16, 2048, 512), (8, 4096, 1024))),
    # bf16 backward at 192-384 programs: walking from 1.25 programs per SM or from 2.5
    *((STATE, (B, 4096, 1024), torch.bfloat16, ("main", "bwd2.5")) for B in (24, 32, 48)),
    # B = 1: the look-back at every tile, 32 or 128 columns wide, or a walk down narrow strips
    *((STATE, (1, 65536, 1024), dtype, ("main", "tiles+lb64x128w4", "tiles+lb32x128w4", "lb128x32w2", "lb-window4",
                                 "walk256x8w1", "walk512x4w1", "walk256x16w1"))
      for dtype in (torch.float32, torch.bfloat16)),
]


# Rows whose D is no multiple of 16 (D = 1000, 3000) beside rows where it is (D = 1024). Rows
# without 16-byte loads run their tiles unpipelined since session 40 (``common.stages``): their
# pipelined copies were 4-byte cp.async (H100, this section then: the state's fwd+bwd at (32,
# 4096, 1000) 4350 us at 3 stages, 4300 at 2, 1823 unpipelined; the log op's 8251 against 2237;
# the forward at 3 stages 3.3x slower; NOTES.md). Since session 41 the linear kernels load such
# rows 16 bytes at a time where they are 16 bytes (``common.VECTOR_ROWS``: the state walks at D =
# 1000 and 3000), the log op keeps scalar loads. The paths, at D = 1024: the state's tiles where
# it would walk ("tiles": no pass walks), their backward at 3 stages or none; the log op's tiles
# (3 stages both passes) unpipelined
_NO_WALK = {"IN_THREAD": {"programs_per_sm": {"fwd": 1e9, "bwd": 1e9}}}
UNALIGNED_PATHS = {"main": {}, "tiles": _NO_WALK,
                   "tiles+bwd-stagesNone": {**_NO_WALK, "ELEMENTWISE_STAGES": {("linear", "bwd"): None}},
                   "log-stagesNone": {"ELEMENTWISE_STAGES": {("log", "fwd"): None, ("log", "bwd"): None}}}
UNALIGNED_CELLS = [*((op, dims, torch.float32, ("main",)) for op in (STATE, "parallel_scan_log")
                     for dims in ((32, 4096, 1000), (8, 7777, 3000))),
                   (STATE, (32, 4096, 1024), torch.float32, ("main", "tiles", "tiles+bwd-stagesNone")),
                   ("parallel_scan_log", (32, 4096, 1024), torch.float32, ("main", "log-stagesNone"))]

# The walk's forward at 64 and 96 programs (fp32, D = 1024) over T, the look-back tiles ("tiles")
# beside each. Session 39's H100 walked (8, 7777, 1024) at 59 ns a row against 38.5 at T = 4096;
# this section (session 40) found T = 4097 as slow: T no multiple of the tile's 16 rows, whose
# row mask the forward then paid on every tile (``elementwise._fwd_tile`` peels it since)
ROWS_CELLS = [(STATE, (B, T, 1024), torch.float32, ("main", "tiles")) for B in (8, 12)
              for T in (4096, 4097, 6144, 7777, 8192)]


def _paths_sweep(section, cells, paths, budget, log, directions=grid.DIRECTIONS):
    """Cells (op, dims, dtype, the paths they take), each on its paths (knob updates: {table in
    common: updates}) in turn, per direction: the op's device time and % of copy, checked
    against the cell's production result (its first path's)."""
    copy = None
    reference = {}
    for (op, dims, dtype, names), direction in itertools.product(cells, directions):
        for path in names:
            if time.time() - START > budget:
                return
            with knobs(common.IN_THREAD, common.LOOKBACK, common.ELEMENTWISE_TILES, common.CHUNKING,
                       common.ELEMENTWISE_STAGES):
                for table, upd in paths[path].items():
                    getattr(common, table).update(upd)
                copy = copy or measure.copy_bandwidth()
                us, err = _device_us(op, dims, direction, reference, (op, dims, dtype, direction), dtype)
            moved = _state_bytes(op, dims, direction, dtype)
            log(dict(section=section, op=op, path=path, dims=dims, dtype=str(dtype)[6:], direction=direction, us=us,
                     pct_copy=100 * moved / us / 1e-6 / copy, rel_err=err))


def few_sweep(budget, log):
    """Issue 16's few-program cells (``FEW_CELLS``) on their paths (``FEW_PATHS``)."""
    _paths_sweep("few", FEW_CELLS, FEW_PATHS, budget, log)


def unaligned_sweep(budget, log):
    """Issue 16's cells whose D is no multiple of 16 beside D = 1024 controls
    (``UNALIGNED_CELLS``, ``UNALIGNED_PATHS``)."""
    _paths_sweep("unaligned", UNALIGNED_CELLS, UNALIGNED_PATHS, budget, log)


def rows_sweep(budget, log):
    """Issue 16: the fp32 walk's forward over T at 64 and 96 programs (``ROWS_CELLS``)."""
    _paths_sweep("rows", ROWS_CELLS, FEW_PATHS, budget, log, directions=("fwd",))


GATED_DIMS = [(16, 2048, 512), (64, 256, 512), (4, 16384, 1024), (8, 512, 256), (32, 4096, 1024)]
# the gated kernels' paths, each a set of knob updates ({knob table's name in common: updates}):
# the default rule (the tiles), and the gates let walk (IN_THREAD["gates"]) in the in-thread
# tiles wherever they fit (per SM a tiny positive aim: 0 would read as "the family's default" in
# common.target_programs)
GATED_PATHS = {"default": {}, "walk": {"IN_THREAD": dict(gates=True, programs_per_sm={"fwd": 1e-9, "bwd": 1e-9})}}
# the look-back tiles (BLOCK_T, BLOCK_D, warps) the gated scans take where T is long and programs
# few (SignedMinGRU fp32 at (4, 16384, 1024): fwd ~51% of copy, session 23's profile), at the
# shapes where they run the look-back
GATED_LOOKBACK_DIMS = [(4, 16384, 1024), (1, 65536, 1024), (16, 2048, 512)]
GATED_LOOKBACK_TILES = {f"lb{t}x{d}w{w}": {"LOOKBACK": dict(tile=(t, d, w))}
                        for t, d, w in ((128, 32, 4), (64, 32, 4), (128, 32, 8), (256, 32, 8), (64, 32, 2))}


def gated_sweep(budget, log):
    """The gated scans (minGRU, signed) against their unfused form (the terms in torch, then the
    scan op) in one process, fp32 and bf16, each on every path (``GATED_PATHS``: where the
    in-thread walk takes over from the chunked / look-back tiles, IN_THREAD["programs_per_sm"]),
    checked against the first configuration. % of copy by the fewest bytes: fwd reads n D and
    writes D per token; fwd+bwd adds the grad out, proj and h read and the proj grad written."""
    _gated_cells(budget, log, "gated", GATED_DIMS, GATED_PATHS, unfused=True)


def gated_lookback_sweep(budget, log):
    """The gated scans on each look-back tile (``GATED_LOOKBACK_TILES``) where they look back."""
    _gated_cells(budget, log, "gated_lookback", GATED_LOOKBACK_DIMS, GATED_LOOKBACK_TILES, unfused=False)


def _gated_cells(budget, log, section, dims_list, paths, unfused):
    """Each gated cell (dims x dtype x gate x direction) on each path of ``paths`` (after the
    unfused form where asked), checked against the cell's first result."""
    import scankit
    from scankit import reference

    copy = measure.copy_bandwidth()
    ops = {"mingru": (scankit.mingru_scan, 2, lambda p: scankit.parallel_scan_log(
               *reference.mingru_log_terms(p), log_h0=p.new_full((p.shape[0], p.shape[2] // 2), -float("inf")))),
           "signed": (scankit.signed_mingru_scan, 3, lambda p: scankit.linear_scan(
               *reference.signed_mingru_terms(p, False), return_prefix=False))}
    reference_out = {}
    for dims, dtype, (gate, (fused, n, plain)), direction in itertools.product(
            dims_list, (torch.bfloat16, torch.float32), ops.items(), grid.DIRECTIONS):
        B, T, D = dims
        for impl, path in [("unfused", None)] * unfused + [("fused", p) for p in paths]:
            if time.time() - START > budget:
                return
            with knobs(common.IN_THREAD, common.LOOKBACK):
                for table, updates in (paths.get(path) or {}).items():
                    getattr(common, table).update(updates)
                gen = torch.Generator(device="cuda").manual_seed(0)  # one input per cell: the configs compared
                p = (torch.randn(B, T, n * D, device="cuda", generator=gen) * 2).to(dtype)
                p.requires_grad_(direction == "fwdbwd")
                fn = measure.callable_workload(fused if impl == "fused" else plain, (p,), direction)
                try:
                    result = [t.detach().float().clone() for t in _flat(fn())]
                except Exception as exc:  # a tile that fails to compile or run (resources)
                    log(dict(section=section, gate=gate, impl=impl, path=path, dims=dims, dtype=str(dtype)[6:],
                             direction=direction, error=f"{type(exc).__name__}: {exc}"[:300]))
                    del p, fn
                    torch.cuda.empty_cache()
                    continue
                key = (gate, dims, dtype, direction)
                err = None
                if key in reference_out:
                    err = max(((r - q).abs().max() / q.abs().max().clamp_min(1e-30)).item()
                              for r, q in zip(result, reference_out[key]))
                else:
                    reference_out[key] = result
                us = 1e6 * measure.median_of(measure.device_time(fn))
                del p, fn, result
                torch.cuda.empty_cache()
            p_bytes = B * T * D * (2 if dtype == torch.bfloat16 else 4)
            moved = p_bytes * ((n + 1) if direction == "fwd" else (2 * n + 3 + n))
            log(dict(section=section, gate=gate, impl=impl, path=path, dims=dims, dtype=str(dtype)[6:],
                     direction=direction, us=us, pct_copy=100 * moved / us / 1e-6 / copy, rel_err=err))


SECTIONS = dict(rotation=rotation_sweep, widths=widths_sweep, gated=gated_sweep, gated_lookback=gated_lookback_sweep, lookback=lookback_sweep, swing=swing, timing=timing_ab, matrix2=matrix2_sweep, chunking=chunking_sweep, host=host_profile, peers=peer_sweep, affine=affine_sweep, scaling=scaling_sweep,
                elementwise=elementwise_sweep, roofline=roofline_sweep, few=few_sweep, unaligned=unaligned_sweep, rows=rows_sweep, pipelining=pipelining_sweep, lanes=lanes_sweep)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=list(SECTIONS))
    parser.add_argument("--out", default=".")
    parser.add_argument("--budget", type=float, default=300.0, help="seconds for the whole run")
    parser.add_argument("--rotation-points", type=lambda text: [tuple(int(v) for v in point.split(",")) for point in text.split()],
                        help="the rotation section's points in place of the adopted one's neighbours: "
                             "'elems,per_sm,min_chunk,min_chunks ...'")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    records = []

    def log(rec):
        records.append(rec)
        short = {k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in rec.items() if k != "profile"}
        print(json.dumps(short), flush=True)
        (out / "tune_scans.json").write_text(json.dumps(records, indent=1))

    print(f"copy bandwidth {measure.copy_bandwidth() / 1e12:.2f} TB/s", flush=True)
    for name in args.sections:
        SECTIONS[name](args.budget, log, **({"points": args.rotation_points} if name == "rotation" else {}))
    for rec in records:
        if rec["section"] == "host":
            print(f"--- host profile {rec['op']}: {rec['us']:.0f} us GPU-timed, {rec['host_us']:.0f} us host\n{rec['profile']}")


if __name__ == "__main__":
    main()
