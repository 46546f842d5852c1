#!/usr/bin/env python3
"""Direct benchmark driver: parity (--check), timing (--bench), mixer memory (--memory), whole
layers (--layers: one training step against plain torch eager / compiled and cuDNN's GRU), a
whole MinGRUStack on the kernels, eager and compiled (--stacks), and issue 16's elementwise cells
beside accelerated-scan on its own layout with the cliff sweep (--roofline, + scan_cliffs.png).

Writes experiments/bench/scan_{parity,bench,memory,layers,issue16}.{json,md} (or --out DIR), measured by
the same code as the asv suites (benchmarks.harness.suite). Needs a CUDA device; without one
it says so loudly and exits 2.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

from benchmarks.harness import grid, report, suite  # noqa: E402


def bar(desc):
    return lambda items: tqdm(list(items), desc=desc, unit="case", mininterval=5)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="Triton vs eager parity grid")
    parser.add_argument("--bench", action="store_true", help="timing matrix")
    parser.add_argument("--memory", action="store_true", help="mixer training step: peak memory, kernel path vs generic")
    parser.add_argument("--layers", action="store_true",
                        help="one training step of whole layers (issue 19); --mixers / --layer-shapes / --dtypes pick rows")
    parser.add_argument("--stacks", action="store_true",
                        help="one training step of a MinGRUStack on the kernels, eager and torch.compile'd")
    parser.add_argument("--roofline", action="store_true",
                        help="issue 16: linear_scan_state beside accelerated-scan native, and the cliff sweep")
    parser.add_argument("--mixers", nargs="+", default=list(grid.LAYER_MIXERS), choices=list(grid.LAYER_MIXERS))
    parser.add_argument("--layer-shapes", nargs="+", default=list(grid.LAYER_SHAPES), choices=list(grid.LAYER_SHAPES))
    parser.add_argument("--dtypes", nargs="+", default=list(grid.LAYER_DTYPES), choices=list(grid.LAYER_DTYPES))
    parser.add_argument("--shapes", nargs="+", default=list(grid.SHAPES), choices=list(grid.SHAPES))
    parser.add_argument("--ops", nargs="+", default=list(grid.OP_NAMES), choices=list(grid.OP_NAMES))
    parser.add_argument("--out", default=str(ROOT / "experiments" / "bench"), help="output folder")
    args = parser.parse_args(argv)
    if not (args.check or args.bench or args.memory or args.layers or args.stacks or args.roofline):
        parser.error("pass at least one of --check, --bench, --memory, --layers, --stacks, --roofline")
    if not torch.cuda.is_available():
        print("=" * 72 + "\nSKIPPED: no CUDA device. --check compares against the Triton kernels on the GPU;\n"
              "--bench and --memory need a GPU to produce numbers. Nothing was written.\n" + "=" * 72,
              file=sys.stderr)
        return 2
    env = report.environment()
    ok = True
    if args.check:
        rows = suite.parity_rows(progress=bar("parity"))
        report.write("scan_parity", report.parity_payload(env, rows), args.out)
        failed = [r for r in rows if not r["passed"]]
        print(f"parity: {len(rows) - len(failed)}/{len(rows)} pass")
        for r in failed:
            print(f"  FAIL {r['op']} {r['shape']} {r['dtype']} {r['direction']}: error/gate {r['margin']:.2f}")
        ok = not failed
    if args.memory:
        payload = report.memory_payload(env, suite.mixer_cells())
        report.write("scan_memory", payload, args.out)
        for r in payload["rows"]:
            print(f"{r['mixer']} {r['shape']} {r['path']}: {r['peak_bytes'] / 2**20:.2f} MiB, {r['time_us']:.1f} us")
    if args.bench:
        cells = suite.op_cells(args.ops, args.shapes, progress=bar("bench"))
        payload = report.bench_payload(env, cells, suite.copy_bandwidth())
        print(report.bench_table(payload))
        report.write("scan_bench", payload, args.out)
    if args.layers or args.stacks:
        cells = suite.layer_cells(args.mixers, args.layer_shapes, dtypes=args.dtypes) if args.layers else \
            dict(seconds={}, peak_bytes={}, failed={})
        payload = report.layers_payload(env, cells, suite.stack_cells() if args.stacks else None)
        report.write("scan_layers", payload, args.out)
        print(report.layers_table(payload))
        for cell, error in payload["failed"].items():
            print(f"  FAILED {cell}: {error}")
        ok = ok and not payload["failed"]
    if args.roofline:
        ok = roofline(env, args.out) and ok
    return 0 if ok else 1


def roofline(env: dict, out: str) -> bool:
    """Issue 16's cells and cliff sweep (asv's Roofline and Cliffs cells): scan_issue16.{json,md}
    and scan_cliffs.png under ``out``, a short table printed; False where a cell failed."""
    from tabulate import tabulate

    from benchmarks.harness import measure
    from benchmarks.harness import roofline as rl

    copy_bw = suite.copy_bandwidth()
    seconds = lambda cells: {k: measure.median_of(v) for k, v in cells["device_time"].items()}  # noqa: E731
    cells, cliffs = suite.roofline_cells(), suite.cliff_cells()
    failed = {" ".join(map(str, k)): e for k, e in {**cells["failed"], **cliffs["failed"]}.items()}
    payload = dict(env=env, copy_bw=copy_bw, issue16=rl.issue16_rows(seconds(cells), cells["bytes"], copy_bw),
                   cliffs=rl.cliff_rows(seconds(cliffs), copy_bw), cliff_bar=grid.CLIFF_BAR,
                   cliff_min_mib=grid.CLIFF_MIN_BYTES // 2 ** 20, failed=failed,
                   skipped={" ".join(map(str, k)): why for k, why in {**cells["skipped"], **cliffs["skipped"]}.items()})
    report.write("scan_issue16", payload, out)
    rl.plot_cliffs(payload["cliffs"], env, Path(out) / "scan_cliffs.png")
    fmt = lambda v, f: "n/a" if v is None else format(v, f)  # noqa: E731
    print(f"copy {copy_bw / 1e12:.2f} TB/s")
    print(tabulate([(r["shape"], r["dtype"], r["direction"], fmt(r["us"], ".1f"), fmt(r["pct"], ".0f"),
                     fmt(r["peer_us"], ".1f"), fmt(r["ratio"], ".2f")) for r in payload["issue16"]],
                   headers=["shape", "dtype", "dir", "scankit us", "% copy", "acc-scan native us", "peer/scankit"]))
    measured = [r for r in payload["cliffs"] if r["pct"] is not None]
    if measured:
        worst = min(measured, key=lambda r: r["pct"])
        print(f"cliff sweep: {sum(r['met'] for r in measured)} of {len(measured)} cells >= {grid.CLIFF_BAR}% of copy; "
              f"lowest {worst['pct']:.0f}% at {worst['shape']}")
    for cell, error in failed.items():
        print(f"  FAILED {cell}: {error}")
    return not failed


if __name__ == "__main__":
    sys.exit(main())
