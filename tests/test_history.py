"""tools/run_history.py: skips what is measured or has no suite; runs a commit in a worktree
and merges its (partial, here) result into the database."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MEASURED = "d75d36eecc67a32c41cdde8e0c03d79b77819a9f"  # the committed H200 run
pytestmark = pytest.mark.xdist_group(name="asv")


def history(*args, **env):
    return subprocess.run([sys.executable, str(ROOT / "tools" / "run_history.py"), *args], capture_output=True,
                          text=True, env=dict(os.environ, **env), cwd=ROOT)


def git(*args):
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()


def test_dry_run_skips_measured_and_suiteless_commits():
    if not git("cat-file", "-t", MEASURED):
        pytest.skip("history without the measured commit")
    first = git("rev-list", "--max-parents=0", "HEAD")
    out = history(f"{first}..{MEASURED}", "--dry-run")
    assert out.returncode == 0, out.stderr
    assert f"skip  {MEASURED[:12]}" in out.stdout and "already measured on h200" in out.stdout
    assert "no asv suite at this commit" in out.stdout


def test_bad_range_exits_2():
    out = history("nonexistent..alsonot", "--dry-run")
    assert out.returncode == 2 and "bad range" in out.stderr


def test_runs_a_commit_in_a_worktree_and_merges_it(tmp_path):
    head = git("rev-parse", "HEAD")
    results = tmp_path / "experiments" / "asv" / "results"
    out = history("HEAD", "--machine", "smoke", "--bench", "MixerStep", "--results-dir", str(results),
                  SCANKIT_BENCH_SMOKE="1", TRITON_INTERPRET="1", HOME=str(tmp_path))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert f"done  {head[:12]}" in out.stdout and "partial" in out.stdout
    assert list((results / "smoke").glob(f"{head[:8]}-*.json"))
    assert len(git("worktree", "list").splitlines()) == 1, "the worktree was left behind"
