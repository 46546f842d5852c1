#!/usr/bin/env python3
"""The regression gate: compare the asv results of two commits on one machine.

Prints a markdown table of every benchmark that changed beyond --factor (slower or larger,
faster or smaller, newly failing, parity now failing). Exit status: 1 when anything got
slower (or larger) than the factor, a benchmark that had a value has none now, or a parity
track now fails; 0 otherwise; 2 on bad arguments or missing results (saying which).
Where asv recorded a 99% confidence interval for both sides and the intervals overlap, the
change is inside the noise and not a regression.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.harness.asv_results import ResultsError, benchmarks, columns, load_run, pick_machine, values  # noqa: E402

PARITY_FAILING = "track_failing_cases"
PARITY_MARGIN = "track_worst_error_over_gate"


def _ci(run, name):
    lo, hi = columns(run, name, "stats_ci_99_a"), columns(run, name, "stats_ci_99_b")
    return {k: (lo[k], hi.get(k)) for k in lo if lo[k] is not None and hi.get(k) is not None}


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


def compare(base: dict, head: dict, known: dict, factor: float, spread: dict | None = None) -> list[dict]:
    """Every change beyond ``factor`` between two runs, each with ``regression`` True/False.
    ``spread`` (``rerun_spread``): a cell whose two runs of one commit read s apart counts
    only beyond s x factor, and a slowdown within it is marked as inside the rerun spread."""
    changes = []
    for name in sorted(set(base["results"]) | set(head["results"])):
        if name not in known:
            continue
        b, h = values(base, name), values(head, name)
        b_ci, h_ci = _ci(base, name), _ci(head, name)
        parity = name.endswith(PARITY_FAILING) or name.endswith(PARITY_MARGIN)
        for params in sorted(set(b) | set(h), key=repr):
            old, new = b.get(params), h.get(params)
            row = dict(benchmark=name, params=", ".join(map(str, params)), base=old, head=new,
                       unit=known[name].get("unit", ""))
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
            if new is None:
                changes.append(dict(row, change="newly failing (no value)", regression=True))
                continue
            if old is None:
                changes.append(dict(row, change="new", regression=False))
                continue
            if old <= 0 or new <= 0:
                continue
            ratio = new / old
            noise = params in b_ci and params in h_ci and b_ci[params][1] >= h_ci[params][0] \
                and h_ci[params][1] >= b_ci[params][0]
            rerun = (spread or {}).get((name, params), 1.0)
            grows = "slower" if row["unit"] == "seconds" else "larger"
            shrinks = "faster" if row["unit"] == "seconds" else "smaller"
            if ratio > factor:
                within = ratio <= rerun * factor
                why = " (inside the noise)" if noise else f" (inside the rerun spread {rerun:.2f}x)" if within else ""
                changes.append(dict(row, ratio=ratio, change=grows + why, regression=not (noise or within)))
            elif ratio < 1 / factor:
                changes.append(dict(row, ratio=ratio, change=shrinks, regression=False))
    return changes


def _fmt(value, unit):
    if value is None:
        return "n/a"
    if unit == "seconds":
        return f"{value * 1e6:,.1f} us"
    if unit == "bytes":
        return f"{value / 2**20:,.2f} MiB"
    return f"{value:.4g}"


def table(changes: list[dict]) -> str:
    lines = ["| benchmark | params | base | head | ratio | change |", "|---|---|---|---|---|---|"]
    for c in changes:
        ratio = f"{c['ratio']:.2f}×" if "ratio" in c else ""
        flag = f"**{c['change']}**" if c["regression"] else c["change"]
        lines.append(f"| {c['benchmark']} | {c['params']} | {_fmt(c['base'], c['unit'])} | "
                     f"{_fmt(c['head'], c['unit'])} | {ratio} | {flag} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", required=True, help="the commit to compare against")
    parser.add_argument("--head", required=True, help="the commit under test")
    parser.add_argument("--factor", type=float, default=1.10, help="change that counts (default 1.10)")
    parser.add_argument("--results-dir", default=str(ROOT / "experiments" / "asv" / "results"))
    parser.add_argument("--head-results-dir", help="take the head run from this results dir instead (a rerun "
                        "of the same commit kept apart: the gate then measures the run-to-run noise)")
    parser.add_argument("--noise-dir", help="a results dir holding a rerun of a commit that --results-dir also holds "
                        "(experiments/asv/reruns/...): each cell's factor widens by how far those two runs read apart")
    parser.add_argument("--machine", help="asv machine name (needed when the results hold several)")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return 2 if exc.code else 0
    if args.factor <= 1.0:
        print("check_regressions: --factor must be > 1", file=sys.stderr)
        return 2
    results = Path(args.results_dir)
    try:
        machine = pick_machine(results, args.machine)
        _, base = load_run(results, machine, args.base)
        _, head = load_run(Path(args.head_results_dir) if args.head_results_dir else results, machine, args.head)
        known = benchmarks(results)
        spread = None
        if args.noise_dir:
            _, rerun = load_run(Path(args.noise_dir), machine)
            _, first = load_run(results, machine, rerun["commit_hash"])
            spread = rerun_spread(first, rerun)
    except ResultsError as exc:
        print(f"check_regressions: {exc}", file=sys.stderr)
        return 2
    changes = compare(base, head, known, args.factor, spread)
    regressions = [c for c in changes if c["regression"]]
    print(f"{machine}: {base['commit_hash'][:12]} -> {head['commit_hash'][:12]}, factor {args.factor}: "
          f"{len(changes)} changed, {len(regressions)} regressions\n")
    if changes:
        print(table(changes))
    return 1 if regressions else 0


if __name__ == "__main__":
    sys.exit(main())
