#!/usr/bin/env python3
"""The regression gate: compare the asv results of two commits on one machine.

Gated: the device time of scankit's own kernels (``Scans``; the block-median ``track_time``
of older runs likewise; ``CallForms``' dense, reversed, packed and time-last calls), their
peak memory (more than 1.00x + 1 MiB), and parity (any newly failing case). A benchmark that
one of the two runs did not run at all (``asv run -b``) is listed as not compared. Everything
else (the references, call latency, peers, mixers, copy bandwidth) is reported as a trend and never fails the gate: it measures torch and the host.

A time cell counts as slower beyond its class's threshold. The threshold comes from the
history (``noise_model``): the log-ratios of every cell between runs of unchanged kernel
code on this machine, pooled by (benchmark, shape, direction), give a robust spread sigma
(1.4826 x median |log ratio|), and the threshold is exp(max(log FLOOR, Z sigma, MARGIN x the
widest |log ratio| seen)): a cell such as the bimodal 2x2 kernel at vlong, which read 11%
apart in one run of unchanged code, gets a threshold above that. A class with too little
history takes --factor. Where asv recorded a 99% confidence interval for both
sides and they overlap, a change is inside the noise. Exit status: 1 on any regression, 0
otherwise, 2 on bad arguments or missing results (saying which).
"""
from __future__ import annotations

import argparse
import itertools
import math
import statistics
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.harness import confirm  # noqa: E402
from benchmarks.harness.asv_results import (ResultsError, benchmarks, columns, load_run, pick_machine, runs,  # noqa: E402
                                            values, version)
from benchmarks.harness.confirm import ALPHA, smallest_p  # noqa: E402

# What a kernel commit can change: a pair of runs of commits that differ in none of these
# measured the same code (its spread is the noise). packed.py: the packed calls (CallForms);
# not distributed.py, which no one-GPU cell calls (its measurement needs a multi-GPU machine).
KERNEL_PATHS = ("scankit/triton", "scankit/ops.py", "scankit/mixers.py", "scankit/dispatch.py", "scankit/reference.py",
                "scankit/packed.py")
CALL_FORMS = "bench_scans.CallForms.track_device_time"  # the packed, reversed and time-last calls
TIME_GATED = ("bench_scans.Scans.track_device_time", "bench_scans.Scans.track_time", CALL_FORMS)
MEMORY_GATED = ("bench_scans.Scans.track_peak_cuda_memory",)
MEMORY_SLACK = 1 << 20
FLOOR = 1.05      # no time threshold below this ratio
Z = 4.0           # robust sigmas of the unchanged-code spread
MARGIN = 1.1      # and 10% beyond the widest log-ratio seen between runs of unchanged code
MIN_RESIDUALS = 8  # history needed before a class's threshold replaces --factor

PARITY_FAILING = "track_failing_cases"
PARITY_MARGIN = "track_worst_error_over_gate"


def _ci(run, name):
    lo, hi = columns(run, name, "stats_ci_99_a"), columns(run, name, "stats_ci_99_b")
    return {k: (lo[k], hi.get(k)) for k in lo if lo[k] is not None and hi.get(k) is not None}


def kernels_unchanged(a: str, b: str) -> bool:
    """Whether commits ``a`` and ``b`` have the same kernel code (git; unknown commits: no)."""
    out = subprocess.run(["git", "diff", "--quiet", a, b, "--", *KERNEL_PATHS], cwd=ROOT, capture_output=True)
    return out.returncode == 0


def _gated_time(name: str, params: tuple) -> bool:
    """scankit's own kernels: Scans' triton cells, and every call form but the looped one (64
    calls back to back: the host's time, not the kernels')."""
    if name == CALL_FORMS:
        return len(params) == 3 and params[1] != "looped"
    return name in TIME_GATED and len(params) == 4 and params[2] == "triton"


def cell_class(name: str, params: tuple) -> tuple:
    """Cells that share a noise level: one benchmark, one shape (Scans) or call form
    (CallForms), one direction."""
    return name, params[1], params[-1]


def residuals(history: list[dict], unchanged=kernels_unchanged) -> dict:
    """{class: [|log ratio|, ...]} of the gated time cells over every pair of runs of
    unchanged kernel code with the same benchmark version."""
    out = defaultdict(list)
    for a, b in itertools.combinations(history, 2):
        if not unchanged(a["commit_hash"], b["commit_hash"]):
            continue
        for name in TIME_GATED:
            if name not in a["results"] or name not in b["results"]:
                continue
            if version(a, name) != version(b, name):
                continue
            va, vb = values(a, name), values(b, name)
            for params in set(va) & set(vb):
                if _gated_time(name, params) and va[params] and vb[params] and va[params] > 0 and vb[params] > 0:
                    out[cell_class(name, params)].append(abs(math.log(vb[params] / va[params])))
    return dict(out)


def noise_model(history: list[dict], unchanged=kernels_unchanged) -> dict:
    """{class: slowdown ratio beyond which a gated time cell of that class is a regression}."""
    model = {}
    for cls, rs in residuals(history, unchanged).items():
        if len(rs) >= MIN_RESIDUALS:
            sigma = 1.4826 * statistics.median(rs)
            model[cls] = math.exp(max(math.log(FLOOR), Z * sigma, MARGIN * max(rs)))
    return model


def rerun_spread(first: dict, rerun: dict) -> dict:
    """{(benchmark, params): max(r, 1/r)} of r = rerun / first: how far two runs of one
    commit read apart, per cell (the run-to-run noise of that cell)."""
    spread = {}
    for name in set(first["results"]) & set(rerun["results"]):
        a, b = values(first, name), values(rerun, name)
        for params in set(a) & set(b):
            if a[params] and b[params] and a[params] > 0 and b[params] > 0:
                r = b[params] / a[params]
                spread[name, params] = max(r, 1 / r)
    return spread


def compare(base: dict, head: dict, known: dict, factor: float, spread: dict | None = None,
            model: dict | None = None) -> list[dict]:
    """Every change beyond its threshold between two runs, each with ``regression`` True/False.
    ``model`` (``noise_model``): per-class thresholds of the gated time cells (else ``factor``).
    ``spread`` (``rerun_spread``): a cell whose two runs of one commit read s apart counts
    only beyond s x factor, and a slowdown within it is marked as inside the rerun spread.
    Cells that are not gated are reported beyond ``factor`` as trends, never as regressions."""
    changes = []
    for name in sorted(set(base["results"]) | set(head["results"])):
        versions = version(base, name), version(head, name)
        if None not in versions and versions[0] != versions[1]:
            # as asv compare: a benchmark whose method changed between the runs is not compared
            changes.append(dict(benchmark=name, params="", base=None, head=None, unit=known.get(name, {}).get("unit", ""),
                                change="not compared: the benchmark's version (method) differs", regression=False))
            continue
        if name not in known:  # retired from the suite (benchmarks.json), as asv's own pages do
            continue
        missing = [side for side, run in (("base", base), ("head", head)) if name not in run["results"]]
        if missing:  # a run of part of the suite (asv run -b ...): as asv compare, not compared
            changes.append(dict(benchmark=name, params="", base=None, head=None, unit=known[name].get("unit", ""),
                                change=f"not compared: not run at {missing[0]}", regression=False))
            continue
        b, h = values(base, name), values(head, name)
        b_ci, h_ci = _ci(base, name), _ci(head, name)
        parity = name.endswith(PARITY_FAILING) or name.endswith(PARITY_MARGIN)
        for params in sorted(set(b) | set(h), key=repr):
            old, new = b.get(params), h.get(params)
            row = dict(benchmark=name, params=", ".join(map(str, params)), base=old, head=new,
                       unit=known[name].get("unit", ""), cell=params)
            if parity:
                limit = 0 if name.endswith(PARITY_FAILING) else 1.0
                if new is None and old is not None:
                    changes.append(dict(row, change="parity not measured now", regression=True))
                elif new is not None and new > limit and (old is None or old <= limit):
                    changes.append(dict(row, change="parity now failing", regression=True))
                elif new is not None and old is not None and new > limit and new > old:
                    changes.append(dict(row, change="parity worse", regression=True))
                continue
            if old is None and new is None:
                continue
            gated_time = _gated_time(name, params)
            gated_memory = name in MEMORY_GATED and len(params) == 4 and params[2] == "triton"
            if new is None:
                changes.append(dict(row, change="newly failing (no value)", regression=gated_time or gated_memory))
                continue
            if old is None:
                changes.append(dict(row, change="new", regression=False))
                continue
            if name in MEMORY_GATED:
                if new > old + MEMORY_SLACK:
                    changes.append(dict(row, ratio=new / old if old else math.inf, change="larger",
                                        regression=gated_memory))
                elif new < old - MEMORY_SLACK:
                    changes.append(dict(row, ratio=new / old, change="smaller", regression=False))
                continue
            if old <= 0 or new <= 0:
                continue
            ratio = new / old
            limit = (model or {}).get(cell_class(name, params), factor) if gated_time else factor
            noise = params in b_ci and params in h_ci and b_ci[params][1] >= h_ci[params][0] \
                and h_ci[params][1] >= b_ci[params][0]
            rerun = (spread or {}).get((name, params), 1.0)
            grows = "slower" if row["unit"] == "seconds" else "larger"
            shrinks = "faster" if row["unit"] == "seconds" else "smaller"
            if ratio > limit:
                within = ratio <= rerun * limit
                why = (" (inside the noise)" if noise else f" (inside the rerun spread {rerun:.2f}x)" if within
                       else "" if gated_time else " (trend, not gated)")
                changes.append(dict(row, ratio=ratio, limit=limit, change=grows + why,
                                    regression=gated_time and not (noise or within)))
            elif ratio < 1 / limit:
                changes.append(dict(row, ratio=ratio, change=shrinks, regression=False))
    return changes


def confirm_slowdowns(changes: list[dict], base: str, head: str, n: int, rounds=confirm.rounds) -> None:
    """The confirm mode: each gated time regression in ``changes`` re-measured ``n`` rounds
    (base, head) in fresh processes; it stays a regression only where the rounds confirm it."""
    flagged = [c for c in changes if c["regression"] and "limit" in c]
    if not flagged:
        return
    cells = [tuple(c["cell"]) for c in flagged]
    measured = rounds(base, head, cells, n)
    for c, cell in zip(flagged, cells):
        got = measured[cell]
        if len(got["base"]) < 2 or len(got["head"]) < 2:
            c["change"] += f" (not confirmed: {len(got['base'])} / {len(got['head'])} rounds measured)"
            continue
        v = confirm.verdict(got["base"], got["head"], min_ratio=c["limit"])
        c["regression"] = v["slower"]
        c["change"] += (f" ({'confirmed' if v['slower'] else 'not confirmed'} by {n} rounds: "
                        f"{v['ratio']:.3f}x, 99% CI {v['ci'][0]:.3f}-{v['ci'][1]:.3f}, p = {v['p']:.3g})")


def _fmt(value, unit):
    if value is None:
        return "n/a"
    if unit == "seconds":
        return f"{value * 1e6:,.1f} us"
    if unit == "bytes":
        return f"{value / 2**20:,.2f} MiB"
    return f"{value:.4g}"


def table(changes: list[dict]) -> str:
    lines = ["| benchmark | params | base | head | ratio | threshold | change |", "|---|---|---|---|---|---|---|"]
    for c in changes:
        ratio = f"{c['ratio']:.2f}×" if "ratio" in c else ""
        limit = f"{c['limit']:.2f}×" if "limit" in c else ""
        flag = f"**{c['change']}**" if c["regression"] else c["change"]
        lines.append(f"| {c['benchmark']} | {c['params']} | {_fmt(c['base'], c['unit'])} | "
                     f"{_fmt(c['head'], c['unit'])} | {ratio} | {limit} | {flag} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", required=True, help="the commit to compare against")
    parser.add_argument("--head", required=True, help="the commit under test")
    parser.add_argument("--factor", type=float, default=1.10, help="change that counts where the history gives no "
                        "threshold, and for the trends (default 1.10)")
    parser.add_argument("--no-history", action="store_true", help="ignore the history's noise model: --factor everywhere")
    parser.add_argument("--results-dir", default=str(ROOT / "experiments" / "asv" / "results"))
    parser.add_argument("--head-results-dir", help="take the head run from this results dir instead (a rerun "
                        "of the same commit kept apart: the gate then measures the run-to-run noise)")
    parser.add_argument("--noise-dir", help="a results dir holding a rerun of a commit that --results-dir also holds "
                        "(experiments/asv/reruns/...): each cell's factor widens by how far those two runs read apart")
    parser.add_argument("--machine", help="asv machine name (needed when the results hold several)")
    parser.add_argument("--confirm", type=int, metavar="ROUNDS", help="on this machine's GPU, re-measure each "
                        "slower gated time cell: ROUNDS x (base, head), fresh processes, this checkout's harness over "
                        "each commit's scankit; a regression stands where Mann-Whitney (p <= 0.01) and the median "
                        "ratio (>= its threshold) agree")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return 2 if exc.code else 0
    if args.confirm is not None and smallest_p(args.confirm, args.confirm) > ALPHA:
        print(f"check_regressions: --confirm {args.confirm} rounds cannot reach p <= {ALPHA}: "
              f"needs at least {min(r for r in range(2, 50) if smallest_p(r, r) <= ALPHA)}", file=sys.stderr)
        return 2
    if args.factor <= 1.0:
        print("check_regressions: --factor must be > 1", file=sys.stderr)
        return 2
    results = Path(args.results_dir)
    try:
        # without --machine: the one machine that holds both runs (the head's may be elsewhere)
        machine = pick_machine(results, args.machine, (args.base,) if args.head_results_dir else (args.base, args.head))
        _, base = load_run(results, machine, args.base)
        _, head = load_run(Path(args.head_results_dir) if args.head_results_dir else results, machine, args.head)
        known = benchmarks(results)
        spread = None
        if args.noise_dir:
            _, rerun = load_run(Path(args.noise_dir), machine)
            _, first = load_run(results, machine, rerun["commit_hash"])
            spread = rerun_spread(first, rerun)
        model = None if args.no_history else noise_model(runs(results, machine))
    except ResultsError as exc:
        print(f"check_regressions: {exc}", file=sys.stderr)
        return 2
    changes = compare(base, head, known, args.factor, spread, model)
    if args.confirm:
        confirm_slowdowns(changes, base["commit_hash"], head["commit_hash"], args.confirm)
    regressions = [c for c in changes if c["regression"]]
    print(f"{machine}: {base['commit_hash'][:12]} -> {head['commit_hash'][:12]}, factor {args.factor}: "
          f"{len(changes)} changed, {len(regressions)} regressions\n")
    if changes:
        print(table(changes))
    return 1 if regressions else 0


if __name__ == "__main__":
    sys.exit(main())
