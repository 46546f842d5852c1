"""The gate's confirm mode: re-measure the cells a comparison flagged, base and head in turn
(A B A B ...), each measurement in a fresh process on this machine's GPU, and call a cell
slower only where the rounds say so: a one-sided Mann-Whitney U test on the per-process
medians (exact, ties by midranks) and a bootstrap confidence interval of the median ratio.

Each commit is measured by this checkout's harness (``benchmarks/``, the one fixed harness)
over that commit's ``scankit/`` (``git archive``), so the two sides differ only in the code
under test. A cell is a Scans cell ``(op, shape, "triton", direction)`` or a CallForms cell
``(op, form, direction)``.

    python tools/check_regressions.py --base main --head HEAD --confirm 5
"""
from __future__ import annotations

import itertools
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ALPHA = 0.01        # one-sided significance of "head slower"
LEVEL = 0.99        # bootstrap interval of the median ratio
BOOTSTRAP = 10000
EXACT_LIMIT = 200_000  # assignments enumerated for the exact U distribution; beyond it, the normal approximation


def midranks(values: list[float]) -> list[float]:
    """Ranks 1..n of ``values``, ties given the mean of the ranks they span."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def mann_whitney_greater(base: list[float], head: list[float]) -> float:
    """One-sided p-value of "head's values are larger than base's" (Mann-Whitney U on the
    pooled midranks): exact, by enumerating every assignment of the pooled ranks to head
    (ties included), up to EXACT_LIMIT assignments; the normal approximation with the tie
    correction beyond."""
    n, m = len(base), len(head)
    if not n or not m:
        raise ValueError(f"both sides need values; got {n} base and {m} head")
    ranks = midranks(list(base) + list(head))
    observed = sum(ranks[n:])
    if math.comb(n + m, m) <= EXACT_LIMIT:
        hits = total = 0
        for chosen in itertools.combinations(range(n + m), m):
            total += 1
            hits += sum(ranks[i] for i in chosen) >= observed - 1e-9
        return hits / total
    mean = m * (n + m + 1) / 2
    ties = sum(c ** 3 - c for c in _tie_counts(ranks))
    var = n * m / 12 * ((n + m + 1) - ties / ((n + m) * (n + m - 1)))
    z = (observed - mean - 0.5) / math.sqrt(var) if var > 0 else 0.0
    return 0.5 * math.erfc(z / math.sqrt(2))


def _tie_counts(ranks):
    counts = {}
    for r in ranks:
        counts[r] = counts.get(r, 0) + 1
    return counts.values()


def smallest_p(n: int, m: int) -> float:
    """The smallest one-sided p-value the exact test can give with n base and m head values."""
    return 1 / math.comb(n + m, m)


def ratio_interval(base: list[float], head: list[float], level: float = LEVEL, draws: int = BOOTSTRAP,
                   seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of median(head) / median(base), each side resampled on
    its own (seeded: the same values give the same interval)."""
    rng = random.Random(seed)
    ratios = sorted(statistics.median(rng.choices(head, k=len(head))) / statistics.median(rng.choices(base, k=len(base)))
                    for _ in range(draws))
    lo = ratios[int((1 - level) / 2 * (draws - 1))]
    hi = ratios[int((1 + level) / 2 * (draws - 1))]
    return lo, hi


def verdict(base: list[float], head: list[float], min_ratio: float, alpha: float = ALPHA) -> dict:
    """Slower when head's rounds are larger than base's at ``alpha`` and the median ratio
    reaches ``min_ratio`` (the gate's threshold for the cell)."""
    ratio = statistics.median(head) / statistics.median(base)
    p = mann_whitney_greater(base, head)
    lo, hi = ratio_interval(base, head)
    return dict(ratio=ratio, p=p, ci=(lo, hi), slower=p <= alpha and ratio >= min_ratio)


# --- measuring, one fresh process per side and round ----------------------------------


def commit_view(commit: str, workdir: Path) -> Path:
    """A directory importing ``commit``'s scankit and this checkout's harness: scankit/ from
    ``git archive`` of the commit, benchmarks/ a link to this checkout's."""
    sha = subprocess.run(["git", "rev-parse", "--verify", f"{commit}^{{commit}}"], cwd=ROOT, capture_output=True,
                         text=True)
    if sha.returncode:
        raise ValueError(f"commit {commit!r} is not a commit of this repository: {sha.stderr.strip()}")
    view = workdir / sha.stdout.strip()[:12]
    if not view.exists():
        view.mkdir(parents=True)
        archive = subprocess.run(["git", "archive", "--format=tar", sha.stdout.strip(), "scankit"], cwd=ROOT,
                                 capture_output=True, check=True).stdout
        with tempfile.TemporaryFile() as f:
            f.write(archive)
            f.seek(0)
            with tarfile.open(fileobj=f) as tar:
                tar.extractall(view, filter="data")
        (view / "benchmarks").symlink_to(ROOT / "benchmarks", target_is_directory=True)
    return view


def measure_in_process(view: Path, cells: list[tuple]) -> dict:
    """Median device time of each cell, measured by a fresh python over ``view`` (None where
    the commit cannot run the cell, with the reason on stderr)."""
    env = dict(os.environ, PYTHONPATH=str(view))
    proc = subprocess.run([sys.executable, "-m", "benchmarks.harness.confirm", json.dumps(cells)], cwd=view, env=env,
                          capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"measuring {cells} over {view} failed:\n{proc.stderr[-4000:]}")
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    return {tuple(k): v for k, v in got}


def rounds(base: str, head: str, cells: list[tuple], n: int, measure=measure_in_process, workdir=None,
           progress=print) -> dict:
    """``n`` rounds of base then head, one fresh process each: {cell: {"base": [...], "head": [...]}}."""
    with tempfile.TemporaryDirectory(prefix="scankit-confirm-") as tmp:
        views = {side: commit_view(commit, Path(workdir or tmp)) for side, commit in (("base", base), ("head", head))}
        out = {cell: {"base": [], "head": []} for cell in cells}
        for r in range(n):
            for side in ("base", "head"):
                got = measure(views[side], cells)
                for cell in cells:
                    if got.get(cell) is not None:
                        out[cell][side].append(got[cell])
                progress(f"confirm round {r + 1}/{n} {side}: " + ", ".join(
                    f"{'/'.join(map(str, c))} {got.get(c) and got[c] * 1e6:.1f} us" if got.get(c) else f"{c} n/a"
                    for c in cells))
    return out


def _worker(cells: list[list]) -> list:
    """In the fresh process: each cell's median device time (seconds), None if n/a here."""
    import scankit

    from . import measure, suite

    if not Path(scankit.__file__).resolve().is_relative_to(Path.cwd().resolve()):
        raise RuntimeError(f"the commit's scankit was not the one imported: {scankit.__file__} (cwd {Path.cwd()})")
    dev = suite.device()
    results = []
    for cell in cells:
        if len(cell) == 4:  # Scans: (op, shape, impl, direction)
            op, shape, impl, direction = cell
            why = suite.cell_skip(op, shape, impl) or suite.missing_in_commit(op)
            value = None if why else measure.median_of(suite.cell_device_time(op, shape, impl, direction))
        else:  # CallForms: (op, form, direction)
            op, form, direction = cell
            out = dict(device_time={}, skipped={}, failed={})
            with measure.scan_mode("triton"):
                suite._form_cell(op, form, direction, suite._form_dims(op, dev), dev, out)
            why = out["skipped"].get(tuple(cell)) or out["failed"].get(tuple(cell))
            value = None if why else measure.median_of(out["device_time"][tuple(cell)])
        if why:
            print(f"{cell}: n/a: {why}", file=sys.stderr)
        results.append([cell, value])
    return results


if __name__ == "__main__":
    print(json.dumps(_worker(json.loads(sys.argv[1]))))
