"""The gate's confirm mode (benchmarks.harness.confirm): its statistics against values worked
out by hand, its verdicts on synthetic rounds, the gate downgrading an unconfirmed slowdown,
and one real round of fresh measuring processes over two commits (a CPU smoke run)."""
import itertools
import json
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.harness import confirm

ROOT = Path(__file__).resolve().parents[1]


def test_midranks_share_tied_ranks():
    assert confirm.midranks([3.0, 1.0, 3.0, 2.0]) == [3.5, 1.0, 3.5, 2.0]


@pytest.mark.parametrize("n,m", [(5, 5), (3, 4), (6, 2)])
def test_fully_separated_rounds_give_the_smallest_p(n, m):
    base = [1.0 + 0.01 * i for i in range(n)]
    head = [2.0 + 0.01 * i for i in range(m)]
    assert confirm.mann_whitney_greater(base, head) == pytest.approx(1 / math.comb(n + m, m))
    assert confirm.mann_whitney_greater(head, base) == pytest.approx(1.0)  # the other way: no evidence
    assert confirm.smallest_p(n, m) == pytest.approx(1 / math.comb(n + m, m))


def test_exact_p_against_a_brute_force_count():
    """P(U >= observed) over every assignment, counted independently of the function's walk."""
    rng = random.Random(7)
    for _ in range(20):
        base = [round(rng.gauss(1, 0.1), 2) for _ in range(4)]
        head = [round(rng.gauss(1.05, 0.1), 2) for _ in range(5)]
        pooled = base + head

        def u(hs):  # head values above base values, ties a half
            bs = [pooled[i] for i in range(9) if i not in hs]
            return sum((pooled[h] > b) + 0.5 * (pooled[h] == b) for h in hs for b in bs)

        observed = u(range(4, 9))
        counts = [u(hs) >= observed - 1e-9 for hs in itertools.combinations(range(9), 5)]
        assert confirm.mann_whitney_greater(base, head) == pytest.approx(sum(counts) / len(counts))


def test_normal_approximation_beyond_the_exact_limit(monkeypatch):
    rng = random.Random(3)
    base = [rng.gauss(1, 0.05) for _ in range(8)]
    head = [rng.gauss(1.1, 0.05) for _ in range(8)]
    exact = confirm.mann_whitney_greater(base, head)
    monkeypatch.setattr(confirm, "EXACT_LIMIT", 10)
    assert confirm.mann_whitney_greater(base, head) == pytest.approx(exact, abs=0.01)


def test_ratio_interval_holds_the_true_ratio_and_is_deterministic():
    rng = random.Random(11)
    base = [rng.gauss(100, 1) for _ in range(7)]
    head = [1.3 * rng.gauss(100, 1) for _ in range(7)]
    lo, hi = confirm.ratio_interval(base, head)
    assert lo < 1.3 < hi and hi - lo < 0.1
    assert confirm.ratio_interval(base, head) == (lo, hi)


def test_verdicts():
    rng = random.Random(5)
    base = [rng.gauss(400e-6, 2e-6) for _ in range(5)]
    slower = [1.2 * x for x in base[::-1]]
    same = [rng.gauss(400e-6, 2e-6) for _ in range(5)]
    assert confirm.verdict(base, slower, min_ratio=1.05)["slower"]
    assert not confirm.verdict(base, slower, min_ratio=1.25)["slower"]  # real, but under the cell's threshold
    assert not confirm.verdict(base, same, min_ratio=1.05)["slower"]


def _gate():
    sys.path.insert(0, str(ROOT))
    from tools import check_regressions
    return check_regressions


def test_the_gate_keeps_a_confirmed_slowdown_and_drops_the_rest():
    gate = _gate()
    rows = [dict(benchmark=gate.TIME_GATED[0], params="a", cell=("linear_scan", "large", "triton", "fwd"),
                 limit=1.05, change="slower", regression=True),
            dict(benchmark=gate.TIME_GATED[0], params="b", cell=("matrix_scan", "lab", "triton", "fwdbwd"),
                 limit=1.05, change="slower", regression=True),
            dict(benchmark=gate.CALL_FORMS, params="c", cell=("matrix_scan", "packed", "fwd"), limit=1.05,
                 change="slower", regression=True),
            dict(benchmark="mem", params="d", cell=("x",), change="larger", regression=True)]  # memory: as is
    asked = []

    def rounds(base, head, cells, n):
        asked.append((base, head, cells, n))
        b = [1.00, 1.01, 0.99, 1.00, 1.02]
        return {cells[0]: dict(base=b, head=[1.3 * x for x in b]), cells[1]: dict(base=b, head=b[::-1]),
                cells[2]: dict(base=b, head=[])}

    gate.confirm_slowdowns(rows, "A", "B", 5, rounds=rounds)
    assert asked == [("A", "B", [r["cell"] for r in rows[:3]], 5)]
    assert rows[0]["regression"] and "confirmed by 5 rounds: 1.300x" in rows[0]["change"]
    assert not rows[1]["regression"] and "not confirmed by 5 rounds" in rows[1]["change"]
    assert rows[2]["regression"] and "not confirmed: 5 / 0 rounds measured" in rows[2]["change"]
    assert rows[3]["regression"]


def test_too_few_rounds_are_refused():
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "check_regressions.py"), "--base", "HEAD", "--head",
                          "HEAD", "--confirm", "3"], capture_output=True, text=True)
    assert out.returncode == 2 and "needs at least 5" in out.stderr, out.stderr


def test_rounds_measure_each_commit_in_its_own_fresh_process(monkeypatch, tmp_path):
    """One round over two commits on the CPU (interpreter, smoke timing): each side a fresh
    python importing that commit's scankit under this checkout's harness; a cell the older
    commit lacks (reverse=) is n/a there."""
    monkeypatch.setenv("SCANKIT_BENCH_SMOKE", "1")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    old = "6d7ba83"  # the Triton kernels landed: no reverse= form yet
    cells = [("linear_scan_state", "lab", "triton", "fwd"), ("linear_scan_state", "reverse", "fwd")]
    lines = []
    got = confirm.rounds(old, "HEAD", cells, 1, workdir=tmp_path, progress=lines.append)
    assert [len(got[cells[0]][s]) for s in ("base", "head")] == [1, 1]
    assert all(v > 0 for s in ("base", "head") for v in got[cells[0]][s])
    assert got[cells[1]] == dict(base=[], head=got[cells[1]]["head"]) and len(got[cells[1]]["head"]) == 1
    assert [line.split(":")[0] for line in lines] == ["confirm round 1/1 base", "confirm round 1/1 head"]
    views = sorted(p.name for p in tmp_path.iterdir())
    assert len(views) == 2 and all((tmp_path / v / "scankit" / "__init__.py").exists() for v in views)
    assert all((tmp_path / v / "benchmarks").resolve() == ROOT / "benchmarks" for v in views)
    with pytest.raises(ValueError, match="is not a commit"):
        confirm.commit_view("no-such-commit", tmp_path)
    json.dumps({str(k): v for k, v in got.items()})  # plain data
