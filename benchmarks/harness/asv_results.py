"""Reading asv's results database (results_dir/MACHINE/*.json + benchmarks.json) without asv."""
from __future__ import annotations

import ast
import itertools
import json
import math
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


class ResultsError(Exception):
    """The results do not hold what was asked for (machine, commit, benchmarks)."""


def machines(results_dir: Path) -> list[str]:
    """Machines with at least one run (a failed ``asv run`` leaves a machine.json alone)."""
    return sorted(p.parent.name for p in Path(results_dir).glob("*/machine.json")
                  if any(q.name != "machine.json" for q in p.parent.glob("*.json")))


def resolve(rev: str) -> str:
    """A full commit hash for ``rev`` where git knows it, else ``rev`` itself (a hash prefix)."""
    try:
        out = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], cwd=REPO,
                             capture_output=True, text=True)
        return out.stdout.strip() or rev
    except OSError:
        return rev


def runs_of(results_dir: Path, machine: str, commit: str | None) -> list[dict]:
    """The machine's runs of ``commit`` (a hash, its prefix or a git revision; None: every run)."""
    found = runs(results_dir, machine)
    if commit is None:
        return found
    full = resolve(commit)
    return [r for r in found if r["commit_hash"].startswith(full) or full.startswith(r["commit_hash"])]


def pick_machine(results_dir: Path, machine: str | None, commits: tuple = ()) -> str:
    """``machine``, or without one the machine of ``results_dir``: the only one, else the only
    one that holds a run of each of ``commits``."""
    known = machines(results_dir)
    if machine is None:
        if len(known) > 1 and commits:
            for commit in commits:
                if not any(runs_of(results_dir, m, commit) for m in known):
                    raise ResultsError(f"no run of commit {commit} on any machine in {results_dir} ({known})")
            holding = [m for m in known if all(runs_of(results_dir, m, c) for c in commits)]
            if len(holding) == 1:
                return holding[0]
            raise ResultsError(f"--machine is needed: {results_dir} holds machines {known}, "
                               f"{holding or 'none'} with runs of {', '.join(commits)}")
        if len(known) != 1:
            raise ResultsError(f"--machine is needed: {results_dir} holds machines {known or 'none'}")
        return known[0]
    if machine not in known:
        raise ResultsError(f"no results for machine {machine!r} in {results_dir} (have: {known or 'none'})")
    return machine


def runs(results_dir: Path, machine: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((Path(results_dir) / machine).glob("*.json"))
            if p.name != "machine.json"]


def load_run(results_dir: Path, machine: str | None, commit: str | None = None) -> tuple[str, dict]:
    """(machine, result json) of the newest run on the machine, or of ``commit``."""
    machine = pick_machine(results_dir, machine, (commit,) if commit else ())
    found = runs_of(results_dir, machine, commit or None)
    if commit and not found:
        raise ResultsError(f"no run of commit {commit} on machine {machine!r}")
    if not found:
        raise ResultsError(f"machine {machine!r} has no runs in {results_dir}")
    return machine, max(found, key=lambda r: (r.get("date") or 0, r["commit_hash"]))


def _clean(value):
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else value


def columns(run: dict, name: str, column: str) -> dict:
    """{param tuple: value of ``column``} of one benchmark in a run (None where not recorded)."""
    entry = run["results"].get(name)
    if entry is None:
        return {}
    cols = run["result_columns"]
    params = entry[cols.index("params")]
    combos = list(itertools.product(*[[ast.literal_eval(p) for p in ps] for ps in params])) if params else [()]
    idx = cols.index(column)
    data = entry[idx] if idx < len(entry) else None
    if not isinstance(data, list):
        data = [data] * len(combos) if column != "result" or data is None else [data]
    return {combo: _clean(v) for combo, v in zip(combos, data)}


def version(run: dict, name: str):
    """The benchmark's version (asv's per-result ``version`` column: its method) in a run, or None."""
    entry, cols = run["results"].get(name), run.get("result_columns", [])
    if entry is None or "version" not in cols or cols.index("version") >= len(entry):
        return None
    return entry[cols.index("version")]


def values(run: dict, name: str) -> dict:
    """{param tuple: result} of one benchmark in a run (None where asv recorded no value)."""
    return columns(run, name, "result")


def benchmarks(results_dir: Path) -> dict:
    path = Path(results_dir) / "benchmarks.json"
    if not path.exists():
        raise ResultsError(f"{path} is missing: run `asv run` (or `asv check`) first")
    return {k: v for k, v in json.loads(path.read_text()).items() if isinstance(v, dict)}
