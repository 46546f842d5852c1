"""Render a task run's result rows (``python -m tasks.run --out X.json``) to X.md.

    python -m tasks.render experiments/tasks/tiny-cpu.json      # writes experiments/tasks/tiny-cpu.md

Deterministic: the same rows give the same bytes (a test keeps the committed page so).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import run, train

EXPECTED = """\
What the literature expects (Grazzi et al., "Unlocking State-Tracking in Linear RNNs Through
Negative Eigenvalues", ICLR 2025; Merrill et al., "The Illusion of State in State-Space
Models", ICML 2024): a diagonal recurrence with positive coefficients (MinGRU) cannot track the
state of a non-solvable group word problem (S5) at any length, nor parity-like states; allowing
negative coefficients (SignedMinGRU) gives parity, and transitions that rotate (RotationMinGRU,
GivensMinGRU) can represent permutations. On S3 (the CPU configuration) the same order shows at
small scale. MQAR rewards recall capacity (state size), the pendulum irregular time steps (the
decay option), the permuted digits long-range mixing."""


def render(rows: list, source: str) -> str:
    configs = sorted({r["config"] for r in rows})
    devices = sorted({r["device"] for r in rows})
    seeds = sorted({r["seed"] for r in rows})
    lines = [f"# Task validation: {', '.join(configs)} configuration", "",
             f"Rendered by `python -m tasks.render {source}` from its rows ({len(rows)} runs; seeds "
             f"{', '.join(map(str, seeds))}; device {', '.join(devices)}). A run is fitted when its score "
             "on held-out data (accuracy, or R^2 for the pendulum) reaches the threshold within the "
             "step budget.", ""]
    for name in configs:
        lines.append(f"Configuration `{name}`:")
        lines.append("")
        for task_name, task in train.TASKS.items():
            if any(r["task"] == task_name and r["config"] == name for r in rows):
                cfg = {k: v for k, v in task.configs[name].items() if k != "chance"}
                lines.append(f"- {task_name}: " + ", ".join(f"{k}={v}" for k, v in cfg.items()))
        lines.append("")
    lines += ["```", run.summary(rows), "```", "", EXPECTED, ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path)
    args = ap.parse_args(argv)
    rows = json.loads(args.results.read_text())
    if not rows:
        print(f"tasks.render: {args.results} holds no rows", file=sys.stderr)
        return 2
    out = args.results.with_suffix(".md")
    out.write_text(render(rows, args.results.as_posix()))
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
