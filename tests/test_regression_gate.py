"""tools/check_regressions.py on the committed H200 asv results (real asv output), with
changes injected into a copy filed under another commit."""
import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.harness.asv_results import runs

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "asv" / "results"
HEAD = "f" * 40
TIME = "bench_scans.Scans.track_device_time"  # the gated time of the current suite


def gate(*args):
    return subprocess.run([sys.executable, str(ROOT / "tools" / "check_regressions.py"), *args],
                          capture_output=True, text=True)


@pytest.fixture
def results(tmp_path):
    if not (RESULTS / "h200").exists():
        pytest.skip("no committed H200 run")
    shutil.copytree(RESULTS, tmp_path / "results")
    # the newest run of the current suite (one with device time) is the base
    found = [(json.loads(p.read_text()), p) for p in sorted((tmp_path / "results" / "h200").glob("*.json"))
             if p.name != "machine.json"]
    base, base_file = max(((r, p) for r, p in found if TIME in r["results"]), key=lambda rp: rp[0]["date"])
    return tmp_path / "results", base_file, base


def file_head(results_dir, base, edit):
    """A copy of the base run under commit HEAD, later, with ``edit`` applied to it."""
    run = copy.deepcopy(base)
    run["commit_hash"], run["date"] = HEAD, base["date"] + 1000
    edit(run)
    (results_dir / "h200" / f"{HEAD[:8]}-{run['env_name']}.json").write_text(json.dumps(run))
    return base["commit_hash"]


SCALED_STATS = ("stats_ci_99_a", "stats_ci_99_b", "stats_q_25", "stats_q_75")


def set_result(run, name, index, factor=None, value=None):
    """Scale (or set) one cell of a run: ``index`` is its position or its params tuple. A
    scaled cell's confidence interval, quartiles and samples move with it, as a real slowdown's do."""
    if isinstance(index, tuple):
        index = cell_index(run, name, index)
    cols, entry = run["result_columns"], run["results"][name]
    result = entry[cols.index("result")]
    result[index] = result[index] * factor if factor is not None else value
    if factor is None:
        return
    for column in SCALED_STATS + ("samples",):
        data = entry[cols.index(column)] if column in cols and cols.index(column) < len(entry) else None
        if isinstance(data, list) and data[index] is not None:
            data[index] = [x * factor for x in data[index]] if column == "samples" else data[index] * factor


def cell_index(run, name, params):
    import ast
    import itertools

    entry = run["results"][name]
    grid = [[ast.literal_eval(p) for p in ps] for ps in entry[run["result_columns"].index("params")]]
    return list(itertools.product(*grid)).index(params)


LARGE = ("parallel_scan_log", "large", "triton", "fwd")


def test_identical_results_pass(results):
    results_dir, _, base = results
    base_hash = file_head(results_dir, base, lambda run: None)
    out = gate("--base", base_hash, "--head", HEAD, "--results-dir", str(results_dir))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 changed, 0 regressions" in out.stdout


def test_a_machine_with_no_runs_is_ignored(results):
    """A failed `asv run` leaves results/<host>/machine.json alone: the one machine with runs
    is still picked without --machine."""
    results_dir, _, base = results
    (results_dir / "some-host").mkdir()
    (results_dir / "some-host" / "machine.json").write_text(json.dumps({"machine": "some-host", "version": 1}))
    base_hash = file_head(results_dir, base, lambda run: None)
    out = gate("--base", base_hash, "--head", HEAD, "--results-dir", str(results_dir))
    assert out.returncode == 0 and "h200:" in out.stdout, out.stdout + out.stderr


def test_without_machine_the_one_holding_both_runs_is_picked(results):
    """Several machines: the gate takes the one that holds both commits' runs, and asks for
    --machine where two do."""
    results_dir, base_file, base = results
    base_hash = file_head(results_dir, base, lambda run: None)
    other = results_dir / "other-gpu"
    other.mkdir()
    (other / "machine.json").write_text(json.dumps({"machine": "other-gpu", "version": 1}))
    (other / base_file.name).write_text(base_file.read_text())  # the base only: h200 alone holds both
    out = gate("--base", base_hash, "--head", HEAD, "--results-dir", str(results_dir))
    assert out.returncode == 0 and "h200:" in out.stdout, out.stdout + out.stderr
    shutil.copy(results_dir / "h200" / f"{HEAD[:8]}-{base['env_name']}.json", other)  # now both hold both
    out = gate("--base", base_hash, "--head", HEAD, "--results-dir", str(results_dir))
    assert out.returncode == 2 and "--machine is needed" in out.stderr and "other-gpu" in out.stderr, out.stderr
    out = gate("--base", base_hash, "--head", HEAD, "--results-dir", str(results_dir), "--machine", "other-gpu")
    assert out.returncode == 0 and "other-gpu:" in out.stdout, out.stdout + out.stderr


def test_injected_slowdown_fails_naming_the_benchmark(results):
    results_dir, _, base = results
    base_hash = file_head(results_dir, base, lambda run: set_result(run, TIME, LARGE, factor=1.5))
    out = gate("--base", base_hash, "--head", HEAD, "--results-dir", str(results_dir))
    assert out.returncode == 1, out.stdout + out.stderr
    assert "1 regressions" in out.stdout
    assert f"| {TIME} | parallel_scan_log, large, triton, fwd |" in out.stdout and "1.50×" in out.stdout
    assert "**slower**" in out.stdout


def test_slowdown_under_the_factor_and_speedups_pass(results):
    results_dir, _, base = results

    def edit(run):
        set_result(run, TIME, LARGE, factor=1.03)
        set_result(run, TIME, ("linear_scan", "large", "triton", "fwd"), factor=0.5)

    base_hash = file_head(results_dir, base, edit)
    out = gate("--base", base_hash, "--head", HEAD, "--results-dir", str(results_dir))
    assert out.returncode == 0, out.stdout
    assert "faster" in out.stdout and "1 changed, 0 regressions" in out.stdout


def test_slowdown_inside_the_noise_is_not_a_regression(results):
    results_dir, base_file, base = results
    cols = base["result_columns"]

    def with_ci(run, lo, hi):
        entry = run["results"][TIME]
        n = len(entry[cols.index("result")])
        while len(entry) <= cols.index("stats_ci_99_b"):
            entry.append(None)
        entry[cols.index("stats_ci_99_a")] = [lo] * n
        entry[cols.index("stats_ci_99_b")] = [hi] * n

    noisy = copy.deepcopy(base)
    with_ci(noisy, 0.0, 1.0)
    base_file.write_text(json.dumps(noisy))

    def edit(run):
        set_result(run, TIME, LARGE, factor=1.5)

    base_hash = file_head(results_dir, noisy, edit)
    out = gate("--base", base_hash, "--head", HEAD, "--results-dir", str(results_dir))
    assert out.returncode == 0, out.stdout
    assert "inside the noise" in out.stdout


def test_parity_failure_fails(results):
    results_dir, _, base = results
    if "bench_parity.Parity.track_failing_cases" not in base["results"]:
        base = max((r for r in runs(results_dir, "h200") if "bench_parity.Parity.track_failing_cases" in r["results"]),
                   key=lambda r: r["date"])
    base_hash = file_head(results_dir, base, lambda run: set_result(
        run, "bench_parity.Parity.track_failing_cases", 0, value=3))
    out = gate("--base", base_hash, "--head", HEAD, "--results-dir", str(results_dir))
    assert out.returncode == 1
    assert "parity now failing" in out.stdout


def test_benchmark_with_no_value_now_fails(results):
    results_dir, _, base = results
    base_hash = file_head(results_dir, base, lambda run: set_result(run, TIME, 0, value=None))
    out = gate("--base", base_hash, "--head", HEAD, "--results-dir", str(results_dir))
    assert out.returncode == 1 and "newly failing" in out.stdout


def test_missing_commit_and_bad_arguments_exit_2(results):
    results_dir, _, base = results
    out = gate("--base", "0123456789abcdef", "--head", base["commit_hash"], "--results-dir", str(results_dir))
    assert out.returncode == 2 and "no run of commit 0123456789abcdef" in out.stderr
    assert gate("--base", "x", "--head", "y", "--factor", "0.9", "--results-dir", str(results_dir)).returncode == 2
    assert gate("--head", "y").returncode == 2
    out = gate("--base", "x", "--head", "y", "--results-dir", str(results_dir / "nowhere"))
    assert out.returncode == 2 and "no results for machine" in out.stderr or "holds machines" in out.stderr


def test_rerun_of_the_same_commit_from_another_results_dir(results, tmp_path):
    """--head-results-dir: the same commit measured twice, the rerun filed apart."""
    results_dir, base_file, base = results
    rerun = tmp_path / "rerun"
    shutil.copytree(results_dir, rerun)
    run = copy.deepcopy(base)
    set_result(run, TIME, LARGE, factor=1.5)
    (rerun / "h200" / base_file.name).write_text(json.dumps(run))
    commit = base["commit_hash"]
    out = gate("--base", commit, "--head", commit, "--results-dir", str(results_dir), "--head-results-dir", str(rerun))
    assert out.returncode == 1, out.stdout + out.stderr
    assert TIME in out.stdout and "1 regressions" in out.stdout
    same = gate("--base", commit, "--head", commit, "--results-dir", str(results_dir))
    assert same.returncode == 0 and "0 changed" in same.stdout, same.stdout


def test_noise_dir_widens_only_the_cells_that_a_rerun_moved(results, tmp_path):
    """--noise-dir: a rerun that read one cell 1.45x apart lets that cell move 1.45 x its threshold
    without failing; another cell's 1.3x slowdown still fails."""
    results_dir, base_file, base = results
    noise = tmp_path / "noise"
    shutil.copytree(results_dir, noise)
    for path in (noise / "h200").glob("*.json"):
        if path.name not in ("machine.json", base_file.name):
            path.unlink()
    rerun = copy.deepcopy(base)
    set_result(rerun, TIME, LARGE, factor=1.45)
    (noise / "h200" / base_file.name).write_text(json.dumps(rerun))

    base_hash = file_head(results_dir, base, lambda run: set_result(run, TIME, LARGE, factor=1.5))
    out = gate("--base", base_hash, "--head", HEAD, "--results-dir", str(results_dir), "--noise-dir", str(noise))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "inside the rerun spread 1.45x" in out.stdout
    base_hash = file_head(results_dir, base, lambda run: set_result(
        run, TIME, ("parallel_scan_log", "large", "triton", "fwdbwd"), factor=1.3))
    out = gate("--base", base_hash, "--head", HEAD, "--results-dir", str(results_dir), "--noise-dir", str(noise))
    assert out.returncode == 1 and TIME in out.stdout, out.stdout + out.stderr



CALL_FORMS = "bench_scans.CallForms.track_device_time"


def test_call_forms_are_gated(results):
    """A packed-path slowdown is caught: CallForms' packed cell, 1.5x."""
    results_dir, _, _ = results
    with_forms = [r for r in runs(results_dir, "h200") if CALL_FORMS in r["results"]]
    if not with_forms:
        pytest.skip("no committed run with CallForms")
    base = max(with_forms, key=lambda r: r["date"])
    base_hash = file_head(results_dir, base, lambda run: set_result(run, CALL_FORMS, ("linear_scan_state", "packed",
                                                                                        "fwd"), factor=1.5))
    out = gate("--base", base_hash, "--head", HEAD, "--results-dir", str(results_dir))
    assert out.returncode == 1 and "1 regressions" in out.stdout, out.stdout + out.stderr
    assert f"| {CALL_FORMS} | linear_scan_state, packed, fwd |" in out.stdout


def test_which_cells_the_gate_times():
    """scankit's kernels are gated (Scans' triton cells, every call form but the looped one: 64
    calls back to back time the host); references and peers are trends; a call form's noise
    class is its form and direction."""
    sys.path.insert(0, str(ROOT))
    from tools.check_regressions import _gated_time, cell_class

    assert _gated_time(TIME, ("linear_scan", "large", "triton", "fwd"))
    assert not _gated_time(TIME, ("linear_scan", "large", "torch_compile", "fwd"))
    assert not _gated_time("bench_scans.References.track_device_time", ("linear_scan", "large", "eager", "fwd"))
    for form in ("dense", "reverse", "packed", "time_last"):
        assert _gated_time(CALL_FORMS, ("matrix_scan", form, "fwdbwd"))
    assert not _gated_time(CALL_FORMS, ("matrix_scan", "looped", "fwdbwd"))
    assert cell_class(CALL_FORMS, ("matrix_scan", "packed", "fwdbwd")) == (CALL_FORMS, "packed", "fwdbwd")
    assert cell_class(TIME, ("matrix_scan", "large", "triton", "fwd")) == (TIME, "large", "fwd")


def test_a_benchmark_the_head_did_not_run_is_not_compared(results):
    """`asv run -b 'Scans\\.'` (the backfill) runs part of the suite: the benchmarks it left out
    are listed as not compared, not as newly failing; a cell the head ran without a value still is."""
    results_dir, _, _ = results
    whole = [r for r in runs(results_dir, "h200") if any(n.startswith("bench_parity.") for n in r["results"])]
    if not whole:
        pytest.skip("no committed run with parity")
    base = max(whole, key=lambda r: r["date"])
    parity = sorted(n for n in base["results"] if n.startswith("bench_parity."))

    def edit(run):
        for name in parity:
            del run["results"][name]

    base_hash = file_head(results_dir, base, edit)
    out = gate("--base", base_hash, "--head", HEAD, "--results-dir", str(results_dir))
    assert out.returncode == 0 and "0 regressions" in out.stdout, out.stdout + out.stderr
    assert f"| {parity[0]} |  | n/a | n/a |  |  | not compared: not run at head |" in out.stdout
