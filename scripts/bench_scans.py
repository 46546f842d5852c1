#!/usr/bin/env python3
"""Direct benchmark driver: parity (--check), timing (--bench), mixer memory (--memory).

Writes experiments/bench/scan_{parity,bench,memory}.{json,md} (or --out DIR). Needs a
CUDA device; without one it says so loudly and exits 2.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

from scankit.bench import cases, measure, report  # noqa: E402


def run_check(out_dir, env):
    grid = list(measure.parity_grid())
    rows = []
    for op_name, dims, dtype in tqdm(grid, desc="parity", unit="case"):
        rows += measure.parity_case(op_name, dims, dtype=dtype)
    for label in tqdm(list(cases.MIXER_CASES), desc="mixer parity", unit="case"):
        rows += measure.mixer_parity_case(label)
    report.write("scan_parity", dict(env=env, rows=rows), out_dir)
    failed = [r for r in rows if not r["passed"]]
    print(f"parity: {len(rows) - len(failed)}/{len(rows)} pass")
    for r in failed:
        print(f"  FAIL {r['op']} {r['shape']} {r['dtype']} {r['direction']}: abs {r['max_abs_err']:.2e}")
    return not failed


def bench_cell(op_name, shape, impl, direction):
    xs = measure.inputs_for(op_name, shape, direction)
    fn = measure.workload(op_name, impl, direction, xs)
    us = measure.median_us(fn)
    peak = measure.peak_bytes(fn)
    del xs, fn
    torch.cuda.empty_cache()
    return us, peak


def run_bench(out_dir, env, shapes, ops):
    copy_bw = measure.copy_bandwidth()
    cells = [(o, s, d, i) for o in ops for s in shapes for d in measure.DIRECTIONS for i in measure.IMPLS]
    results, skipped = {}, []
    for op_name, shape, direction, impl in tqdm(cells, desc="bench", unit="cell"):
        reason = cases.skip_reason(op_name, shape, impl)
        if reason:
            if direction == "fwd":
                skipped.append(dict(op=op_name, shape=shape, impl=impl, reason=reason))
            continue
        results[op_name, shape, direction, impl] = bench_cell(op_name, shape, impl, direction)
    rows = []
    for op_name in ops:
        for shape in shapes:
            for direction in measure.DIRECTIONS:
                get = lambda impl: results.get((op_name, shape, direction, impl), (None, None))  # noqa: E731
                ins, outs = measure.meta_inputs_outputs(op_name, shape)
                rows.append(dict(
                    op=op_name, shape=shape, direction=direction,
                    bytes=cases.bytes_moved(ins, outs, direction),
                    **{f"{impl}_us": get(impl)[0] for impl in measure.IMPLS},
                    **{f"{impl}_peak_bytes": get(impl)[1] for impl in measure.IMPLS},
                ))
    print(f"copy bandwidth {copy_bw / 1e12:.2f} TB/s")
    print(f"{'op':20} {'shape':6} {'dir':7} {'triton us':>10} {'eager us':>10} {'compile us':>10} {'%copy':>6}")
    for r in rows:
        fmt = lambda x: f"{x:10.1f}" if x is not None else f"{'-':>10}"  # noqa: E731
        pct = 100 * r["bytes"] / (r["triton_us"] * 1e-6) / copy_bw
        print(f"{r['op']:20} {r['shape']:6} {r['direction']:7} {fmt(r['triton_us'])} {fmt(r['eager_us'])} "
              f"{fmt(r['torch_compile_us'])} {pct:5.0f}%")
    report.write("scan_bench", dict(env=env, rows=rows, skipped=skipped, copy_bw=copy_bw), out_dir)
    return True


def run_memory(out_dir, env):
    """Peak memory and time of one training step of the registry's memory mixer,
    generic path (matrices + eager scan) vs kernel path (what ``auto`` runs on CUDA)."""
    rows, ratios = [], []
    label = cases.MEMORY_MIXER
    for shape in ("lab", "longT"):
        s = cases.SHAPES[shape]
        for path in ("generic", "kernel"):
            fn = measure.mixer_train_step(label, path, B=s.B, T=s.T)
            rows.append(dict(mixer=label, shape=f"{shape} (B={s.B}, T={s.T})", path=path,
                             peak_bytes=measure.peak_bytes(fn), time_us=measure.median_us(fn)))
            del fn
        generic, kernel = rows[-2], rows[-1]
        ratios.append(dict(mixer=label, shape=generic["shape"], ratio=generic["peak_bytes"] / kernel["peak_bytes"],
                           speedup=generic["time_us"] / kernel["time_us"]))
    report.write("scan_memory", dict(env=env, rows=rows, ratios=ratios), out_dir)
    for r in rows:
        print(f"memory {r['mixer']} {r['shape']} {r['path']}: {r['peak_bytes'] / 2**20:.2f} MiB, {r['time_us']:.1f} us")
    return True


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="Triton vs eager parity grid")
    parser.add_argument("--bench", action="store_true", help="timing matrix")
    parser.add_argument("--memory", action="store_true", help="mixer peak memory, kernel path vs generic")
    parser.add_argument("--shapes", nargs="+", default=list(cases.SHAPES), choices=list(cases.SHAPES))
    parser.add_argument("--ops", nargs="+", default=list(cases.OPS), choices=list(cases.OPS))
    parser.add_argument("--out", default=str(ROOT / "experiments" / "bench"), help="output folder")
    args = parser.parse_args(argv)
    if not (args.check or args.bench or args.memory):
        parser.error("pass at least one of --check, --bench, --memory")
    if not torch.cuda.is_available():
        print("=" * 72 + "\nSKIPPED: no CUDA device. --check compares against the Triton kernels on the GPU;\n"
              "--bench and --memory need a GPU to produce numbers. Nothing was written.\n" + "=" * 72,
              file=sys.stderr)
        return 2
    env = report.environment()
    ok = True
    if args.check:
        ok &= run_check(args.out, env)
    if args.memory:
        ok &= run_memory(args.out, env)
    if args.bench:
        ok &= run_bench(args.out, env, args.shapes, args.ops)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
