"""tools/run_history.py: skips what is measured; runs a commit (installed into asv's
virtualenv environment, measured by this checkout's harness) and merges its (partial, here)
result into the database."""
import json
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


def test_dry_run_skips_commits_the_harness_measured_and_reruns_the_rest(tmp_path):
    """A complete result of this harness is skipped; one that a commit's own older suite
    recorded (no device time) is measured again, by the one harness."""
    if not git("cat-file", "-t", MEASURED):
        pytest.skip("history without the measured commit")
    sys.path.insert(0, str(ROOT / "tools"))
    from run_history import CORE

    first = git("rev-list", "--max-parents=0", "HEAD")
    out = history(f"{first}..{MEASURED}", "--dry-run")
    assert out.returncode == 0, out.stderr
    assert f"run   {MEASURED[:12]}" in out.stdout  # committed, but by its own suite: measured again
    results = tmp_path / "results"
    (results / "h200").mkdir(parents=True)
    (results / "h200" / "machine.json").write_text(json.dumps({"machine": "h200", "version": 1}))
    cols = ["result", "params", "version"]
    run = dict(commit_hash=MEASURED, result_columns=cols, date=1, env_name="e",
               results={name: [1.0, [], "v"] for name in CORE})
    (results / "h200" / f"{MEASURED[:8]}-e.json").write_text(json.dumps(run))
    (results.parent / "parity" / "h200").mkdir(parents=True)
    (results.parent / "parity" / "h200" / f"{MEASURED}.json").write_text(json.dumps(dict(env={}, rows=[])))
    out = history(f"{first}..{MEASURED}", "--dry-run", "--results-dir", str(results))
    assert f"skip  {MEASURED[:12]}" in out.stdout and "already measured on h200" in out.stdout, out.stdout


def test_bad_range_exits_2():
    out = history("nonexistent..alsonot", "--dry-run")
    assert out.returncode == 2 and "bad range" in out.stderr


def test_runs_a_commit_in_asvs_environment_and_merges_it(tmp_path):
    head = git("rev-parse", "HEAD")
    results = tmp_path / "experiments" / "asv" / "results"
    out = history("HEAD", "--machine", "smoke", "--bench", "MixerStep", "--results-dir", str(results),
                  SCANKIT_BENCH_SMOKE="1", TRITON_INTERPRET="1", HOME=str(tmp_path))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert f"done  {head[:12]}" in out.stdout and "partial" in out.stdout
    (result,) = (results / "smoke").glob(f"{head[:8]}-*.json")
    assert json.loads(result.read_text())["env_name"].startswith("virtualenv")  # the commit installed, not the tree


def test_share_out_balances_modules_over_gpus():
    sys.path.insert(0, str(ROOT / "tools"))
    from run_history import share_out

    mods = ["bench_mixers", "bench_parity", "bench_roofline", "bench_scans"]
    two = share_out(mods, 2)
    assert sorted(sum(two, [])) == mods and len(two) == 2
    assert ["bench_scans"] in share_out(mods, 3)
    assert share_out(mods, 1) == [["bench_scans", "bench_parity", "bench_roofline", "bench_mixers"]]
    assert len(share_out(mods, 8)) == 4  # no empty groups


def test_runs_a_commit_in_parts_and_merges_them_whole(tmp_path):
    """Two 'GPUs' (ids only: the CPU smoke suite ignores them): the modules split, both
    parts' benchmarks land in one result file."""
    head = git("rev-parse", "HEAD")
    results = tmp_path / "results"
    logs = tmp_path / "logs"
    logs.mkdir()
    out = history("HEAD", "--machine", "smoke", "--gpus", "0,1", "--results-dir", str(results),
                  "--log-dir", str(logs), SCANKIT_BENCH_SMOKE="1", TRITON_INTERPRET="1", HOME=str(tmp_path))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "part 0 on GPU 0, CPUs 0-" in out.stdout and "part 1 on GPU 1, CPUs" in out.stdout
    assert sorted(p.name for p in logs.iterdir()) == [f"{head[:8]}-part0.log", f"{head[:8]}-part1.log"]
    (result,) = (results / "smoke").glob(f"{head[:8]}-*.json")
    modules = {name.split(".")[0] for name in json.loads(result.read_text())["results"]}
    # (seen once, session 8, under -n 2 beside other asv tests: a module missing; the parts' logs say why)
    assert {"bench_scans", "bench_parity"} <= modules, (modules, out.stdout[-1500:],
                                                        [p.read_text()[-3000:] for p in sorted(logs.iterdir())])
    assert (results / "benchmarks.json").exists()
    assert json.loads(result.read_text())["env_name"].startswith("virtualenv")


def test_a_part_past_its_time_limit_is_stopped(tmp_path):
    out = history("HEAD", "--machine", "smoke", "--gpus", "0,1", "--results-dir", str(tmp_path / "results"),
                  "--timeout", "1", SCANKIT_BENCH_SMOKE="1", TRITON_INTERPRET="1", HOME=str(tmp_path))
    assert out.returncode == 1, out.stderr[-2000:]  # nothing finished: nothing filed, said so
    assert "stopped at the 1 s limit" in out.stdout and "no result produced" in out.stdout
    assert not list((tmp_path / "results").glob("*/*.json")), "nothing may be filed"


def test_refuses_a_machine_without_cuda(tmp_path):
    """A run on a machine that cannot run the suite must not file an all-empty result."""
    if subprocess.run([sys.executable, "-c", "import sys, torch; sys.exit(torch.cuda.is_available())"]).returncode:
        pytest.skip("this machine has CUDA")
    results = tmp_path / "results"
    out = history("HEAD", "--results-dir", str(results), SCANKIT_BENCH_SMOKE="0")
    assert out.returncode == 2 and "sees no CUDA device" in out.stderr, out.stdout + out.stderr
    assert not results.exists()


def test_smoke_runs_never_file_into_the_committed_database():
    out = history("HEAD", SCANKIT_BENCH_SMOKE="1")
    assert out.returncode == 2 and "never files into the committed database" in out.stderr


def test_a_result_where_every_benchmark_failed_is_not_filed(tmp_path):
    sys.path.insert(0, str(ROOT / "tools"))
    from run_history import merge

    commit = "0123456789abcdef0123456789abcdef01234567"
    staged = tmp_path / "stage" / "results" / "m"
    staged.mkdir(parents=True)
    (staged / "machine.json").write_text("{}")
    columns = ["result", "params", "version"]
    result = dict(commit_hash=commit, result_columns=columns,
                  results={"bench_scans.Scans.track_time": [[None, None], [["'lab'", "'large'"]], "v"],
                           "bench_scans.track_copy_bandwidth": [None, [], "v"]})
    (staged / f"{commit[:8]}-existing.json").write_text(json.dumps(result))
    database = tmp_path / "database"
    assert merge(tmp_path / "stage", database, "m", commit).startswith("not filed")
    assert not (database / "m").exists()
    result["results"]["bench_scans.track_copy_bandwidth"] = [4.2e12, [], "v"]
    (staged / f"{commit[:8]}-existing.json").write_text(json.dumps(result))
    assert merge(tmp_path / "stage", database, "m", commit) == "partial"
    assert (database / "m" / f"{commit[:8]}-existing.json").exists()
