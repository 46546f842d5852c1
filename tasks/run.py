"""Train every mixer on every task over seeds; write the result rows and print the fit rates.

    python -m tasks.run --config tiny --out experiments/tasks/tiny-cpu.json     # CPU, ~1 minute
    python -m tasks.run --config full --out experiments/tasks/results.json     # one GPU

Rows go to ``--out`` as they finish (the file is replaced whole each time, never half-written),
so a run cut off keeps what it finished, and the same command run again continues it: the
cells ``--out`` already holds are kept and skipped (a results file of another configuration
is refused), so the full page can be built over several shorter GPU sessions. The pendulum
runs each mixer with and without decay (``delta_t``), the other tasks without.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict
from pathlib import Path

import torch
from tabulate import tabulate

from . import train


def grid(tasks, mixers, seeds):
    for task in tasks:
        for mixer in mixers:
            for decay in ((False, True) if train.TASKS[task].uses_dt else (False,)):
                for seed in seeds:
                    yield task, mixer, decay, seed


def write(path: Path, rows: list) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(rows, indent=1) + "\n")
    os.replace(tmp, path)


def cell(row: dict) -> tuple:
    return row["task"], row["mixer"], row["decay"], row["seed"]


def earlier(path: Path, config: str) -> list:
    """The rows a previous run of ``config`` left in ``path`` (none if there is no file)."""
    if not path.exists():
        return []
    try:
        rows = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise SystemExit(f"{path}: not a results file of tasks.run ({exc}); move it away or pick another --out")
    configs = {r.get("config") for r in rows}
    if configs - {config}:
        raise SystemExit(f"{path} holds rows of config {sorted(map(str, configs))}, not {config!r}: "
                         f"pick another --out")
    return rows


def groups(rows: list) -> dict:
    """The rows per (task, mixer label): "mingru" or "mingru +decay", in the registries' order."""
    out = defaultdict(list)
    for r in rows:
        out[r["task"], r["mixer"] + (" +decay" if r["decay"] else "")].append(r)
    order = lambda key: (list(train.TASKS).index(key[0]), train.MIXERS.index(key[1].split()[0]), key[1])  # noqa: E731
    return {key: out[key] for key in sorted(out, key=order)}


def summary(rows: list) -> str:
    """Fit rate (fitted seeds / seeds), median score and step time per task x mixer (x decay)."""
    table = []
    for (task, mixer), rs in groups(rows).items():
        scores = sorted(r["score"] for r in rs)
        table.append((task, mixer, f"{sum(r['fitted'] for r in rs)}/{len(rs)}", rs[0]["metric"],
                      scores[len(scores) // 2], rs[0]["threshold"], rs[0]["chance"],
                      sorted(r["ms_per_step"] for r in rs)[len(rs) // 2]))
    return tabulate(table, headers=["task", "mixer", "fit", "metric", "median score", "threshold", "chance",
                                    "ms/step"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", choices=("tiny", "full"), default="tiny")
    ap.add_argument("--tasks", nargs="+", choices=sorted(train.TASKS), help="default: every task the configuration has")
    ap.add_argument("--mixers", nargs="+", choices=train.MIXERS, default=list(train.MIXERS))
    ap.add_argument("--seeds", type=int, default=3, help="seeds 0 .. N-1 per cell")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    tasks = args.tasks or [t for t, task in train.TASKS.items() if args.config in task.configs]
    missing = [t for t in tasks if args.config not in train.TASKS[t].configs]
    if missing:
        ap.error(f"--tasks {' '.join(missing)}: no {args.config!r} configuration (they run in "
                 f"{', '.join(sorted({c for t in missing for c in train.TASKS[t].configs}))})")
    rows = earlier(args.out, args.config)
    done = {cell(r) for r in rows}
    if done:
        print(f"{args.out}: {len(done)} cells already there, continuing", flush=True)
    for task, mixer, decay, seed in grid(tasks, args.mixers, range(args.seeds)):
        if (task, mixer, decay, seed) in done:
            continue
        rows.append(train.run(task, mixer, seed, args.config, decay=decay, device=args.device))
        write(args.out, rows)
        r = rows[-1]
        print(f"{task} {mixer}{' +decay' if decay else ''} seed {seed}: {r['metric']} {r['score']} "
              f"({'fitted' if r['fitted'] else 'not fitted'}), {r['ms_per_step']} ms/step", flush=True)
    print(summary(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
