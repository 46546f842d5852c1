"""scripts/ab_trees.py keeps what it measured when its time runs out (``--budget`` or a SIGTERM
from an outer ``timeout``): the cells measured in both trees are compared and written whole."""
import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
sys.path.insert(0, str(SCRIPTS))
import ab_trees  # noqa: E402

# a worker that "measures" each cell in 0.01 s in the baseline tree ("a"), 1 s in the candidate
# ("bb"): its time is the tree's name length, its check 1.0
FAKE = textwrap.dedent(r'''
    import json, sys, time
    for label, *cell in json.loads(sys.argv[2]):
        time.sleep(0.01 if sys.argv[1].endswith("a") else 1.0)
        print("CELL " + json.dumps([label, dict(us=float(len(sys.argv[1])), check=[1.0])]), flush=True)
    print("DONE", flush=True)
''')


@pytest.fixture
def trees(tmp_path):
    a, b = tmp_path / "a", tmp_path / "bb"
    a.mkdir(), b.mkdir()
    return str(a), str(b)


def test_a_whole_run_compares_every_cell(monkeypatch, trees, tmp_path, capsys):
    monkeypatch.setattr(ab_trees, "WORKER", FAKE)
    out = tmp_path / "ab.json"
    before = signal.getsignal(signal.SIGTERM)
    assert ab_trees.main([*trees, "--only", "16, 16, 16] fwdbwd", "--rounds", "1", "--out", str(out)]) == 0
    assert signal.getsignal(signal.SIGTERM) is before  # the caller's handler is back
    got = json.loads(out.read_text())
    assert not got["cut"] and len(got["rows"]) == 2
    assert all(r["ratio"] == pytest.approx(len(trees[1]) / len(trees[0])) for r in got["rows"])


def test_cells_of_another_dtype_carry_it_in_their_label(monkeypatch, trees, tmp_path):
    """A cell that names a dtype is selected and reported by it; one that names none keeps the
    label it had (op, [dims], direction)."""
    monkeypatch.setattr(ab_trees, "WORKER", FAKE)
    out = tmp_path / "ab.json"
    assert ab_trees.main([*trees, "--only", "bfloat16", "--rounds", "1", "--budget", "30", "--out", str(out)]) == 0
    cells = [r["cell"] for r in json.loads(out.read_text())["rows"]]
    assert cells and all(c.endswith(" bfloat16") for c in cells)
    assert ab_trees.label(("linear_scan_state", (1, 65536, 1024), "fwd")) == "linear_scan_state [1, 65536, 1024] fwd"


def test_a_budget_keeps_the_cells_both_trees_measured(monkeypatch, trees, tmp_path, capsys):
    monkeypatch.setattr(ab_trees, "WORKER", FAKE)
    out = tmp_path / "ab.json"
    # 8 cells: the baseline's run takes ~0.1 s, the candidate's 8 s, stopped near its third cell
    rc = ab_trees.main([*trees, "--only", "16, 16", "--rounds", "2", "--budget", "3.5", "--out", str(out)])
    got = json.loads(out.read_text())
    assert rc == 3 and got["cut"]
    assert len(got["runs"]["A"]) == 1 and len(got["runs"]["A"][0]) == 8
    measured = set(got["runs"]["B"][0])
    assert 0 < len(measured) < 8 and {r["cell"] for r in got["rows"]} == measured
    assert "cut before the end" in capsys.readouterr().out


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="SIGTERM and /proc")
def test_a_sigterm_cuts_the_same_way_at_once_and_leaves_no_worker(trees, tmp_path):
    out = tmp_path / "ab.json"
    driver = (f"import sys; sys.path.insert(0, {str(SCRIPTS)!r}); import ab_trees; ab_trees.WORKER = {FAKE!r}; "
              f"sys.exit(ab_trees.main({[*trees, '--only', '16, 16', '--out', str(out)]!r}))")
    proc = subprocess.Popen([sys.executable, "-c", driver], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(3.5)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=3)  # at once: the worker (5 s from its end) is stopped
    assert proc.returncode == 3, stderr
    got = json.loads(out.read_text())
    assert got["cut"] and got["rows"] and "cut before the end" in stdout
    assert not _running(trees[1])  # the worker is gone


def _running(arg: str) -> list:
    """Pids of the processes whose command line holds ``arg``."""
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if arg.encode() in cmdline.read_bytes().split(b"\0"):
                pids.append(cmdline.parent.name)
        except OSError:  # gone meanwhile
            pass
    return pids
