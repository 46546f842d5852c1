#!/usr/bin/env python3
"""Sweep the elementwise kernels' (BLOCK_T, BLOCK_D, num_warps) at the large shapes (GPU).

Prints a table of medians (us) per tile and workload; --out writes it as json.
"""
import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from scankit.bench import measure  # noqa: E402
from scankit.triton import common  # noqa: E402

TILES = [(32, 32, 4), (64, 32, 4), (128, 32, 4), (64, 64, 4), (64, 128, 4), (32, 128, 4),
         (64, 64, 8), (128, 64, 8), (16, 128, 4), (64, 16, 2)]
WORKLOADS = [("linear_scan", "fwd"), ("linear_scan", "fwdbwd"), ("parallel_scan_log", "fwd"),
             ("parallel_scan_log", "fwdbwd")]


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shapes", nargs="+", default=["large", "vlong"])
    parser.add_argument("--out")
    args = parser.parse_args()
    results = []
    for shape in args.shapes:
        for op, direction in WORKLOADS:
            xs = measure.inputs_for(op, shape, direction)
            ins, outs = measure.meta_inputs_outputs(op, shape)
            from scankit.bench.cases import bytes_moved
            nbytes = bytes_moved(ins, outs, direction)
            for tile in TILES:
                common.ELEMENTWISE_TILES = {"linear": tile, "log": tile}
                us = measure.median_us(measure.workload(op, "triton", direction, xs))
                results.append(dict(shape=shape, op=op, direction=direction, tile=tile, us=us, tbps=nbytes / us / 1e6))
                print(f"{shape:6} {op:18} {direction:7} {str(tile):14} {us:9.1f} us {nbytes / us / 1e6:6.2f} TB/s", flush=True)
            del xs
            torch.cuda.empty_cache()
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
