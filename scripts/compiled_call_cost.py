#!/usr/bin/env python3
"""Wall time per call of each scan op inside a torch.compile'd function (inductor, default
mode: no CUDA graphs), fwd and fwd+bwd, back to back at one shape: what a compiled caller pays
for the way the ops enter inductor's graph (opaque custom ops, or triton_ops traced into
launches). One json line per cell, then a table.

    python scripts/compiled_call_cost.py [--shape lab] [--calls 300] [--json OUT]
"""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
os.environ.setdefault("MINGRU_SCAN", "triton")

import torch  # noqa: E402
from tabulate import tabulate  # noqa: E402

from benchmarks.harness.cases import OPS, SHAPES  # noqa: E402


def per_call_us(fn, calls: int, repeats: int = 5) -> list[float]:
    """``repeats`` medians-to-be: each the wall time of ``calls`` back-to-back calls + one sync."""
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        out.append(1e6 * (time.perf_counter() - start) / calls)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="lab", choices=list(SHAPES))
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--json")
    args = ap.parse_args()
    rows, records = [], []
    for name, op in OPS.items():
        xs = [x.cuda() for x in op.shape_inputs(args.shape)]
        for direction in ("fwd", "fwdbwd"):
            torch._dynamo.reset()
            if direction == "fwd":
                f = torch.compile(lambda *a: op.fn(*a), fullgraph=True)
                inputs = xs
                fn = lambda: f(*inputs)  # noqa: E731
            else:
                inputs = [x.detach().requires_grad_() for x in xs]
                f = torch.compile(lambda *a: sum(o.float().sum() for o in (lambda r: r if isinstance(r, tuple) else (r,))(op.fn(*a))),
                                  fullgraph=True)
                fn = lambda: torch.autograd.grad(f(*inputs), inputs)  # noqa: E731
            with torch.no_grad() if direction == "fwd" else torch.enable_grad():
                us = per_call_us(fn, args.calls)
            rec = dict(op=name, shape=args.shape, direction=direction, median_us=statistics.median(us),
                       min_us=min(us), max_us=max(us))
            records.append(rec)
            print(json.dumps(rec), flush=True)
            rows.append((name, direction, f"{rec['median_us']:.1f}", f"{rec['min_us']:.1f}-{rec['max_us']:.1f}"))
    if args.json:
        with open(args.json + ".tmp", "w") as f:
            json.dump(records, f, indent=1)
        os.replace(args.json + ".tmp", args.json)
    print(tabulate(rows, headers=("op", "direction", "us / call (median of 5)", "range")))


if __name__ == "__main__":
    main()
