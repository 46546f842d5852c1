"""Render a task run's result rows (``python -m tasks.run --out X.json``) to X.md and X.png.

    python -m tasks.render experiments/tasks/tiny-cpu.json      # writes experiments/tasks/tiny-cpu.{md,png}

Deterministic: the same rows give the same page (a test keeps the committed page so). The plot:
every run's score per task and mixer, beside the task's threshold and chance.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from . import run, train

EXPECTED = """\
What the theory says (Merrill et al., "The Illusion of State in State-Space Models", ICML 2024;
Grazzi et al., "Unlocking State-Tracking in Linear RNNs Through Negative Eigenvalues", ICLR
2025): a layer's recurrence tracks a group's state only if its transitions can represent the
group. MinGRU's are positive diagonal (no group but the trivial one), SignedMinGRU's diagonal
+-1 at most (parity, Z2 per channel), RotationMinGRU's 2 x 2 blocks rotations and reflections
(finite groups cyclic or dihedral): all three are solvable, so none can track S5 (not solvable)
at every length, only learn its first steps; S3 (the CPU page) is solvable and within reach of the
block mixers. GivensMinGRU's 8 x 8 blocks are non-commuting rotations: SO(8) holds S5 (a
permutation times its sign, on 5 of the 8 coordinates), but 3 brick-wall rounds set 12 of SO(8)'s
28 angles, so whether its transitions reach those matrices is open here; the table measures what
training finds within the step budget. MQAR rewards recall capacity (state size), the pendulum
irregular time steps (the decay option), the permuted digits long-range mixing."""


def render(rows: list, source: str) -> str:
    configs = sorted({r["config"] for r in rows})
    devices = sorted({r.get("gpu") or r["device"] for r in rows})  # rows before 2026-12-05 name no GPU
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
    lines += ["```", run.summary(rows), "```", "", f"![every run's score]({Path(source).with_suffix('.png').name})", "",
              EXPECTED, ""]
    return "\n".join(lines)


def plot(rows: list, path: Path) -> None:
    """One panel per task: each run's score (a dot per seed) per mixer, the threshold dashed,
    chance dotted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = run.groups(rows)
    tasks = list(dict.fromkeys(task for task, _ in groups))
    cols = min(4, len(tasks))
    nrows = -(-len(tasks) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(3.2 * cols, 2.8 * nrows), dpi=100, squeeze=False)
    for ax, task in zip(axes.flat, tasks):
        labels = [mixer for t, mixer in groups if t == task]
        for i, mixer in enumerate(labels):
            rs = groups[task, mixer]
            ax.scatter([i] * len(rs), [r["score"] for r in rs], s=18, alpha=0.8, marker="^" if "decay" in mixer else "o",
                       color=f"C{train.MIXERS.index(mixer.split()[0])}")
        first = groups[task, labels[0]][0]
        ax.axhline(first["threshold"], color="k", linestyle="--", linewidth=1)
        ax.axhline(first["chance"], color="grey", linestyle=":", linewidth=1)
        ax.set_xticks(range(len(labels)), labels, rotation=45, ha="right", fontsize=7)
        ax.set_title(f"{task} ({first['metric']})", fontsize=9)
        ax.set_ylim(min(0.0, *(r["score"] for key in groups if key[0] == task for r in groups[key])) - 0.02, 1.02)
        ax.grid(True, axis="y", alpha=0.3)
    for ax in list(axes.flat)[len(tasks):]:
        ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(path, format="png", metadata={"Software": None})
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path)
    args = ap.parse_args(argv)
    rows = json.loads(args.results.read_text())
    if not rows:
        print(f"tasks.render: {args.results} holds no rows", file=sys.stderr)
        return 2
    out, png = args.results.with_suffix(".md"), args.results.with_suffix(".png")
    tmp_md, tmp_png = (p.with_name(f"{p.stem}.{os.getpid()}.tmp{p.suffix}") for p in (out, png))
    tmp_md.write_text(render(rows, args.results.as_posix()))
    plot(rows, tmp_png)
    os.replace(tmp_md, out)  # each page whole or not at all
    os.replace(tmp_png, png)
    print(out, png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
