#!/usr/bin/env python3
"""Host-inclusive time per call (the tracker's ``call_latency``) of each scan op inside a
torch.compile'd function (inductor, default mode: no CUDA graphs), fwd and fwd+bwd, at one
shape: what a compiled caller pays for the way the ops enter inductor's graph (opaque custom
ops, or triton_ops traced into launches). Run it at two commits to compare them.

    python scripts/compiled_call_cost.py [--shape lab] [--json OUT]
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
from tabulate import tabulate  # noqa: E402

from benchmarks.harness import grid, measure  # noqa: E402
from benchmarks.harness.cases import OPS  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="lab", choices=list(grid.SHAPES))
    ap.add_argument("--json")
    args = ap.parse_args()
    records = []
    with measure.scan_mode("triton"):
        for name, op in OPS.items():
            for direction in grid.DIRECTIONS:
                torch._dynamo.reset()
                xs = measure.inputs_for(name, args.shape, direction)
                compiled = torch.compile(op.fn, fullgraph=True)
                cell = measure.call_latency(measure.callable_workload(compiled, xs, direction))
                us = [1e6 * s for s in cell["samples"]]  # seconds per call, each sample
                records.append(dict(op=name, shape=args.shape, direction=direction,
                                    median_us=1e6 * measure.median_of(cell), min_us=min(us), max_us=max(us)))
                print(json.dumps(records[-1]), flush=True)
    if args.json:
        with open(args.json + ".tmp", "w") as f:
            json.dump(records, f, indent=1)
        os.replace(args.json + ".tmp", args.json)
    print(tabulate([(r["op"], r["direction"], f"{r['median_us']:.1f}", f"{r['min_us']:.1f}-{r['max_us']:.1f}")
                    for r in records], headers=("op", "direction", "us / call (median)", "range")))


if __name__ == "__main__":
    main()
