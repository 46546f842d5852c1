"""Where one training step of a whole layer spends its GPU time: the step of
``benchmarks.harness.layers`` (the cells of asv's ``bench_mixers.Layers`` and ``Stacks``) under
torch.profiler, its kernels grouped and summed.

    python scripts/profile_layer.py --mixer SignedMinGRU --shape 16x2048x512 --dtype bf16 \
        [--impl kernel] [--steps 10] [--out DIR]

Prints the kernels that take most of the step's device time (each a row: calls per step, us per
step, share), then the step's device total against the bytes its layer must move at the
machine's copy bandwidth (x, the projection's output and h forward; their grads backward, and
the weights). ``--impl plain_compile`` profiles torch.compile of the plain layer instead;
``--mixer stack`` the MinGRUStack of the Stacks cells (impl kernel or kernel_compile).
``--out DIR`` also writes the table and a chrome trace of one step there. On a machine without
a GPU it profiles the CPU step (a smoke run: tiny dims, the kernels through the interpreter).
"""
from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from tabulate import tabulate  # noqa: E402

from benchmarks.harness import grid, layers, measure  # noqa: E402


# the projection's outputs per channel of width d: [k | v], [s | zk | v], [theta | u | zk | v], 3
# rounds of k/2 angles per k-block + [zk | v]
PROJECTION_WIDTH = {"MinGRU": 2, "SignedMinGRU": 3, "RotationMinGRU": 3, "GivensMinGRU": 3.5}


def step_fn(mixer: str, impl: str, B: int, T: int, d: int, dtype: str, device: str):
    if mixer == "stack":
        return layers.stack_step(impl, B, T, d, dtype, device)
    return layers.train_step(impl, B, T, d, dtype, device, mixer)


def kernel_rows(prof, steps: int, device: bool) -> list[tuple[str, float, float]]:
    """(name, calls per step, us per step) of every kernel (device) or op (CPU), largest first."""
    calls, total = collections.Counter(), collections.Counter()
    for e in prof.key_averages():
        t = (e.self_device_time_total if device else e.self_cpu_time_total) / steps
        if t > 0 and (not device or e.device_type == torch.autograd.DeviceType.CUDA):
            calls[e.key] += e.count / steps
            total[e.key] += t
    return [(k, calls[k], total[k]) for k, _ in total.most_common()]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mixer", default="MinGRU", choices=[*grid.LAYER_MIXERS, "stack"])
    parser.add_argument("--shape", default="16x2048x512", choices=sorted({*grid.LAYER_SHAPES, *grid.STACK_SHAPES}))
    parser.add_argument("--impl", default="kernel", choices=sorted({*grid.LAYER_IMPLS, *grid.STACK_IMPLS}))
    parser.add_argument("--dtype", default="fp32", choices=grid.LAYER_DTYPES)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--out", help="folder for the table and one step's chrome trace")
    args = parser.parse_args(argv)
    impls = grid.STACK_IMPLS if args.mixer == "stack" else grid.LAYER_IMPLS
    if args.impl not in impls:
        parser.error(f"--mixer {args.mixer} takes --impl {' / '.join(impls)}; got {args.impl}")
    if args.steps < 1:
        parser.error(f"--steps must be >= 1; got {args.steps}")
    gpu = torch.cuda.is_available()
    device = "cuda" if gpu else "cpu"
    B, T, d = ({**grid.LAYER_SHAPES, **grid.STACK_SHAPES}[args.shape] if gpu else (2, 7, 16))
    with measure.scan_mode(measure._kernel_mode(device)):
        fn = step_fn(args.mixer, args.impl, B, T, d, args.dtype, device)
        for _ in range(3):  # compiled, autotuned, allocator warm
            fn()
        if gpu:
            torch.cuda.synchronize()
        activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if gpu else [])
        with torch.profiler.profile(activities=activities) as prof:
            for _ in range(args.steps):
                fn()
            if gpu:
                torch.cuda.synchronize()
    rows = kernel_rows(prof, args.steps, gpu)
    total = sum(r[2] for r in rows)
    unit = "device" if gpu else "CPU (self)"
    table = tabulate([(name[:90], f"{n:.1f}", us, f"{100 * us / total:.1f}%") for name, n, us in rows[:args.top]],
                     ["kernel" if gpu else "op", "calls/step", f"{unit} us/step", "share"], floatfmt=".1f")
    head = (f"{args.mixer} {args.impl} ({B}, {T}, {d}) {args.dtype}: {unit} time {total:.1f} us per step over "
            f"{len(rows)} distinct {'kernels' if gpu else 'ops'}, {sum(r[1] for r in rows):.0f} per step")
    print(head + "\n" + table)
    if gpu and args.mixer != "stack":
        from benchmarks.harness import suite

        bw = suite.copy_bandwidth()
        size = 2 if args.dtype == "bf16" else 4
        width = PROJECTION_WIDTH[args.mixer]
        moved = size * B * T * d * (2 * (1 + width + 1))  # x, projection out, h: written and read back
        print(f"copy bandwidth {bw / 1e12:.2f} TB/s: the step's activations alone (~{moved / 2**20:.0f} MiB) "
              f"take >= {moved / bw * 1e6:.0f} us")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        name = f"{args.mixer}-{args.impl}-{args.shape}-{args.dtype}"
        (out / f"{name}.txt").write_text(head + "\n" + table + "\n")
        with torch.profiler.profile(activities=activities) as one:
            fn()
            if gpu:
                torch.cuda.synchronize()
        one.export_chrome_trace(str(out / f"{name}.trace.json"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
