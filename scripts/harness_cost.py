"""Where a suite run's time goes, per cell and phase (GPU): first call (compile), device_time,
call_latency, peak memory, wall-clock seconds each. For sizing the harness's budgets.

    python scripts/harness_cost.py [--ops linear_scan matrix_affine_scan] [--shapes lab large]
        [--impls triton eager torch_compile] [--prewarm]

Each row is printed as it finishes (a run cut off still tells); the table comes last.
"""
import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from tabulate import tabulate  # noqa: E402

from benchmarks.harness import grid, measure, suite  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", nargs="*", default=["linear_scan", "matrix_affine_scan"])
    ap.add_argument("--shapes", nargs="*", default=["lab", "large"])
    ap.add_argument("--impls", nargs="*", default=["triton"], choices=grid.IMPLS)
    ap.add_argument("--prewarm", action="store_true", help="first compile the cells in the worker pool, as a suite run does")
    args = ap.parse_args()
    keys = [(op, shape, impl, d) for op in args.ops for shape in args.shapes for impl in args.impls
            for d in grid.DIRECTIONS if not suite.cell_skip(op, shape, impl)]
    if args.prewarm:
        t0 = time.perf_counter()
        ran = suite.prewarm([key for key in keys if key[2] != "eager"])
        print(f"prewarm: {ran} cells in {time.perf_counter() - t0:.1f} s ({suite.WORKERS} workers)", flush=True)
    rows = []
    for op, shape, impl, direction in keys:
        t0 = time.perf_counter()
        xs = measure.inputs_for(op, shape, direction)
        fn = measure.workload(op, impl, direction, xs)
        fn()
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        dev = measure.device_time(fn)
        t2 = time.perf_counter()
        lat = measure.call_latency(fn)
        t3 = time.perf_counter()
        measure.peak_bytes(fn)
        t4 = time.perf_counter()
        rows.append([op, shape, impl, direction, t1 - t0, t2 - t1, dev["number"], t3 - t2, lat["number"], t4 - t3,
                     measure.median_of(dev) * 1e6, measure.median_of(lat) * 1e6])
        print(*(f"{v:.3g}" if isinstance(v, float) else v for v in rows[-1]), flush=True)
        del xs, fn
    print(tabulate(rows, headers=["op", "shape", "impl", "dir", "first s", "device_time s", "n", "call_latency s", "n",
                                  "peak s", "device us", "latency us"], floatfmt=".3g"))


if __name__ == "__main__":
    main()
