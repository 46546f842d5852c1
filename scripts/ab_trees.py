#!/usr/bin/env python3
"""A/B the Triton kernels of two source trees on one GPU: the same cells, each tree in its
own fresh process, alternating A B A B, so drift between runs shows as the A-A spread.

    python scripts/ab_trees.py BASELINE_TREE [CANDIDATE_TREE=.] [--rounds 2] [--warm] [--only SUBSTRING ...] [--out FILE]

A tree is a directory holding a ``scankit`` package (e.g. ``git archive REV | tar -x -C DIR``).
Times are ``triton.testing.do_bench`` medians (us); fwd+bwd takes a fixed random grad output
per output (no ``sum()`` loss). Each cell's outputs are checked against the baseline's (max
relative difference) in the same run. Prints one table: baseline, candidate, ratio, spread.

``--budget S`` bounds the whole A/B to S seconds of wall time: a worker still running then is
stopped, and the table (and ``--out``) holds every cell measured in both trees so far, its
spread over the rounds it has (a cut run loses only what it had not measured). A SIGTERM (an
outer ``timeout``) cuts the same way.
"""
import argparse
import json
import os
import statistics
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CELLS = [  # (op, (B, T, width[, k[, v]]), direction[, dtype: fp32 unless named]); matrix_affine_scan's k defaults
    # to 8 and v to 1; an op named "<op>+state" is called with return_prefix=False (the states only: what the
    # mixers call)
    ("parallel_scan_log", (32, 4096, 1024), "fwd"), ("parallel_scan_log", (32, 4096, 1024), "fwdbwd"),
    ("parallel_scan_log", (1, 65536, 1024), "fwd"), ("parallel_scan_log", (1, 65536, 1024), "fwdbwd"),
    ("parallel_scan_log", (16, 1024, 64), "fwdbwd"), ("parallel_scan_log", (128, 64, 64), "fwdbwd"),
    ("linear_scan_state", (32, 4096, 1024), "fwd"), ("linear_scan_state", (32, 4096, 1024), "fwdbwd"),
    ("linear_scan_state", (1, 65536, 1024), "fwd"), ("linear_scan_state", (1, 65536, 1024), "fwdbwd"),
    ("linear_scan_state", (1, 65536, 1024), "fwd", "bfloat16"),
    ("linear_scan_state", (1, 65536, 1024), "fwdbwd", "bfloat16"),
    ("linear_scan", (32, 4096, 1024), "fwd"), ("linear_scan", (128, 64, 64), "fwdbwd"),
    # D not a multiple of 16: the (64, 32, 4) tiles walk (no in-thread tile), one chunk
    ("linear_scan_state", (32, 4096, 1000), "fwd"), ("linear_scan_state", (32, 4096, 1000), "fwdbwd"),
    ("linear_scan", (32, 4096, 1000), "fwd"),
    # T no multiple of the tile's 16 rows: a partial last tile; 64 programs walk forward
    ("linear_scan_state", (8, 4097, 1024), "fwd"), ("linear_scan_state", (8, 7777, 1024), "fwd"),
    ("linear_scan_state", (8, 7777, 1024), "fwdbwd"), ("linear_scan_state", (8, 4096, 1024), "fwd"),
    ("linear_scan", (32, 4097, 1024), "fwd"), ("linear_scan_state", (32, 4097, 1000), "fwdbwd"),
    # rows of 16 bytes whose D is no multiple of 16 (D = 1000, 3000 in fp32: 4-byte loads unless
    # the kernels are told); the log op's tiles and the look-back at B = 1 there too
    ("linear_scan_state", (8, 7777, 3000), "fwd"), ("linear_scan_state", (8, 7777, 3000), "fwdbwd"),
    ("parallel_scan_log", (32, 4096, 1000), "fwd"), ("parallel_scan_log", (32, 4096, 1000), "fwdbwd"),
    ("linear_scan_state", (1, 65536, 1000), "fwd"),
    ("matrix_scan", (32, 4096, 128), "fwd"), ("matrix_scan", (32, 4096, 128), "fwdbwd"),
    ("matrix_scan", (1, 65536, 128), "fwd"), ("matrix_scan", (1, 65536, 128), "fwdbwd"),
    ("matrix_scan", (16, 1024, 32), "fwdbwd"), ("matrix_scan", (128, 64, 32), "fwdbwd"),
    ("matrix_affine_scan", (32, 4096, 32), "fwd"), ("matrix_affine_scan", (128, 64, 8), "fwdbwd"),
    ("matrix_affine_scan", (32, 4096, 128, 2), "fwd"), ("matrix_affine_scan", (32, 4096, 128, 2), "fwdbwd"),
    ("matrix_affine_scan", (32, 4096, 32), "fwdbwd"), ("matrix_affine_scan", (32, 4096, 64, 4), "fwd"),
    ("matrix_affine_scan", (32, 4096, 64, 4), "fwdbwd"),
    ("matrix_affine_scan+state", (32, 4096, 32), "fwd"), ("matrix_affine_scan+state", (32, 4096, 32), "fwdbwd"),
    ("matrix_affine_scan+state", (1, 65536, 32), "fwd"), ("matrix_affine_scan+state", (1, 65536, 32), "fwdbwd"),
    ("matrix_affine_scan", (32, 4096, 16, 16), "fwd"), ("matrix_affine_scan", (32, 4096, 16, 16), "fwdbwd"),
    ("matrix_affine_scan+state", (32, 4096, 16, 16), "fwd"), ("matrix_affine_scan+state", (32, 4096, 16, 16), "fwdbwd"),
    ("matrix_affine_scan", (32, 4096, 16, 16, 16), "fwd"), ("matrix_affine_scan", (32, 4096, 16, 16, 16), "fwdbwd"),
    ("matrix_affine_scan+state", (32, 4096, 16, 16, 16), "fwd"),
    ("matrix_affine_scan+state", (32, 4096, 16, 16, 16), "fwdbwd"),
]

WORKER = r"""
import functools, json, sys, torch, triton.testing
sys.path.insert(0, sys.argv[1])
import scankit
from benchmarks.harness.cases import OPS
cells = json.loads(sys.argv[2])
for label, op_name, shape, direction, *dtype in cells:  # (label: ``ab_trees.label``)
    base = op_name.removesuffix("+state")
    names = ("B", "T", "D") if "matrix" not in base else ("B", "T", "n", "k", "v")
    dims = dict(zip(names, shape))
    if base == "matrix_affine_scan":
        dims.setdefault("k", 8)
        dims.setdefault("v", 1)
    xs = [x.requires_grad_(direction == "fwdbwd") for x in OPS[base].inputs(dims, device="cuda", seed=0,
                                                                     dtype=getattr(torch, *dtype or ["float32"]))]
    fn = OPS[base].fn if base == op_name else functools.partial(OPS[base].fn, return_prefix=False)
    with torch.no_grad():
        ref = fn(*xs)
    ref = ref if isinstance(ref, tuple) else (ref,)
    if direction == "fwd":
        def run():
            with torch.no_grad():
                return fn(*xs)
    else:
        gen = torch.Generator("cuda").manual_seed(1)
        cots = [torch.randn(r.shape, device="cuda", dtype=r.dtype, generator=gen) for r in ref]
        def run():
            o = fn(*xs)
            return torch.autograd.grad(o if isinstance(o, tuple) else (o,), xs, cots)
    us = triton.testing.do_bench(run, warmup=25, rep=100, return_mode="median") * 1e3
    res = run()
    res = res if isinstance(res, tuple) else (res,)
    cell = dict(us=us, check=[float(t.float().abs().sum()) for t in res])
    print("CELL " + json.dumps([label, cell]), flush=True)
    print(f"  {label}: {us:.1f} us", file=sys.stderr, flush=True)
    del xs, ref, res
    torch.cuda.empty_cache()
print("DONE", flush=True)
"""


def label(cell) -> str:
    """A cell's name in the table and ``--only``: op, [dims], direction[, dtype]."""
    return " ".join(map(str, [cell[0], list(cell[1]), *cell[2:]]))


class Cut(Exception):
    """The A/B's time is up (``--budget`` or a SIGTERM)."""


def _on_sigterm(signum, frame):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: `timeout` signals its process group as well
    raise Cut("SIGTERM")


def measure(tree: str, cells: list, deadline: float) -> tuple[dict, bool]:
    """``({cell: {us, check}}, whole)`` of one fresh process over ``cells``; a worker stopped at
    ``deadline`` (or by a SIGTERM) gives the cells it had measured, ``whole`` False."""
    env = dict(os.environ, MINGRU_SCAN="triton", PYTHONPATH="")
    print(f"ab_trees: {tree}", file=sys.stderr, flush=True)  # the worker's progress goes to stderr
    with tempfile.TemporaryFile("w+") as log:  # each measured cell a line as it comes, kept by a kill
        work = json.dumps([[label(c), *c] for c in cells])  # each cell led by its label
        proc = subprocess.Popen([sys.executable, "-c", WORKER, str(Path(tree).resolve()), work],
                                stdout=log, text=True, env=env)
        cut = False
        try:
            left = deadline - time.monotonic()
            proc.wait(timeout=max(left, 0.1) if left < float("inf") else None)
        except (subprocess.TimeoutExpired, Cut):
            cut = True
            proc.kill()
            proc.wait()
        log.seek(0)
        lines = log.read().splitlines()
    got = dict(json.loads(x[len("CELL "):]) for x in lines if x.startswith("CELL "))
    if not cut and (proc.returncode or "DONE" not in lines):
        raise SystemExit(f"ab_trees: {tree} failed (its stderr is above):\n" + "\n".join(lines[-20:]))
    return got, not cut


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("baseline")
    parser.add_argument("candidate", nargs="?", default=".")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--only", nargs="*", help="keep the cells whose label contains one of these")
    parser.add_argument("--out")
    parser.add_argument("--warm", action="store_true",
                        help="run each tree once first, untimed (cold compiles out of round 1's processes)")
    parser.add_argument("--budget", type=float, default=float("inf"),
                        help="seconds for the whole A/B; a run cut by it keeps the cells measured in both trees")
    args = parser.parse_args(argv)
    cells = [c for c in CELLS if not args.only or any(o in label(c) for o in args.only)]
    deadline = time.monotonic() + args.budget
    before = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return _compare(args, cells, deadline)
    finally:
        signal.signal(signal.SIGTERM, before)  # a caller's own handler back (the tests call main)


def _compare(args, cells: list, deadline: float) -> int:
    """Run the schedule (warm-up, then A B per round) until done or cut; print and write the table."""
    runs, whole = {"A": [], "B": []}, True
    schedule = [(tree, None) for tree in (args.baseline, args.candidate)] if args.warm else []
    schedule += [(tree, side) for _ in range(args.rounds) for tree, side in ((args.baseline, "A"), (args.candidate, "B"))]
    for tree, side in schedule:
        got, whole = measure(tree, cells, deadline)
        if side is not None:
            runs[side].append(got)
        if not whole:
            break
    rows = []
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # what was measured is written whole
    for cell in map(label, cells):
        a = [r[cell] for r in runs["A"] if cell in r]
        b = [r[cell] for r in runs["B"] if cell in r]
        if not a or not b:
            continue
        diff = max(abs(x - y) / max(abs(x), 1e-30) for x, y in zip(a[0]["check"], b[0]["check"]))
        a, b = [x["us"] for x in a], [x["us"] for x in b]
        rows.append(dict(cell=cell, baseline_us=statistics.median(a), candidate_us=statistics.median(b),
                         ratio=statistics.median(b) / statistics.median(a), rounds=min(len(a), len(b)),
                         spread_a=max(a) / min(a), spread_b=max(b) / min(b), rel_diff_of_sums=diff))
    if args.out:  # whole or not at all: written beside, then renamed
        tmp = Path(args.out).with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(dict(runs=runs, rows=rows, cut=not whole), indent=1))
        os.replace(tmp, args.out)
    print(f"{'cell':58s} {'base us':>10s} {'cand us':>10s} {'ratio':>6s} {'A spr':>6s} {'B spr':>6s} {'diff':>8s}")
    for r in rows:
        print(f"{r['cell']:58s} {r['baseline_us']:10.1f} {r['candidate_us']:10.1f} {r['ratio']:6.3f} "
              f"{r['spread_a']:6.3f} {r['spread_b']:6.3f} {r['rel_diff_of_sums']:8.1e}")
    if not whole:
        print(f"cut before the end: {len(rows)} of {len(cells)} cells measured in both trees")
    return 0 if whole else 3


if __name__ == "__main__":
    sys.exit(main())
