"""The performance pipeline on the CPU: asv discovers and runs the suite (smoke mode:
tiny shapes, kernels through the interpreter), render_artifacts turns real asv results
into the artifacts, and the committed artifacts are what the committed results render to."""
import itertools
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("asv")
ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.xdist_group(name="asv")  # one worker, one smoke asv run


def run(args, **kwargs):
    return subprocess.run(args, capture_output=True, text=True, **kwargs)


def render(*args):
    return run([sys.executable, str(ROOT / "tools" / "render_artifacts.py"), *args])


def test_asv_check_discovers_the_whole_suite():
    out = run([sys.executable, "-m", "asv", "check", "-E", f"existing:{sys.executable}"], cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "No problems found" in out.stdout


def test_importing_the_suite_imports_neither_torch_nor_scankit():
    """asv starts a process per benchmark and parameter (~130 for one commit): each imports
    the suite, so a suite module that imports torch (3-4 s on the GPU machine) costs minutes.
    Only setup_cache, which measures, may import torch, triton and the installed scankit."""
    code = ("import sys, benchmarks.bench_scans, benchmarks.bench_mixers, benchmarks.bench_roofline, "
            "benchmarks.bench_parity; heavy = sorted(m for m in ('torch', 'triton', 'scankit', 'numpy') "
            "if m in sys.modules); assert not heavy, heavy")
    out = run([sys.executable, "-c", code], cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]


@pytest.fixture(scope="session")
def smoke(tmp_path_factory):
    """A real `asv run` of the whole suite on this CPU into a temporary results dir."""
    base = tmp_path_factory.mktemp("asv")
    results = base / "experiments" / "asv" / "results"
    conf = dict(version=1, project="scankit", repo=str(ROOT), branches=["main"], environment_type="existing",
                launch_method="forkserver", benchmark_dir=str(ROOT / "benchmarks"), env_dir=str(base / "env"),
                results_dir=str(results), html_dir=str(base / "html"), install_command=[], uninstall_command=[],
                build_command=[])
    (base / "asv.conf.json").write_text(json.dumps(conf))
    (base / "home").mkdir()
    commit = run(["git", "rev-parse", "HEAD"], cwd=ROOT).stdout.strip()
    env = dict(os.environ, HOME=str(base / "home"), SCANKIT_BENCH_SMOKE="1", TRITON_INTERPRET="1",
               SCANKIT_ASV_MACHINE="smoke", SCANKIT_ASV_COMMIT=commit,
               SCANKIT_ASV_PARITY_DIR=str(base / "experiments" / "asv" / "parity"))
    asv = [sys.executable, "-m", "asv"]
    assert run(asv + ["machine", "--yes", "--machine", "smoke"], cwd=base, env=env).returncode == 0
    out = run(asv + ["run", "-E", f"existing:{sys.executable}", "--set-commit-hash", commit, "--machine", "smoke",
                     "--record-samples"], cwd=base, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return dict(base=base, results=results, commit=commit)


def asv_values(results_dir, name):
    """{params: value} through asv's own results API (independent of the renderer's reader)."""
    from asv.results import Results

    path = next(p for p in (results_dir / "smoke").glob("*.json") if p.name != "machine.json")
    res = Results.load(str(path))
    params = res.get_result_params(name)
    values = res.get_result_value(name, params)
    return dict(zip(itertools.product(*[[eval(p) for p in ps] for ps in params]), values))


def scan_times(results_dir):
    """Device time of every scan cell: scankit's kernels (Scans) and the references."""
    return {**asv_values(results_dir, "bench_scans.Scans.track_device_time"),
            **asv_values(results_dir, "bench_scans.References.track_device_time")}


def test_every_benchmark_body_ran_on_the_cpu(smoke):
    from benchmarks.harness import grid

    times = scan_times(smoke["results"])
    for op, shape, direction in itertools.product(grid.OP_NAMES, grid.SHAPES, grid.DIRECTIONS):
        for impl in ("triton", "eager"):
            if grid.skip_reason(op, shape, impl) is None:
                assert times[op, shape, impl, direction] > 0, (op, shape, impl, direction)
    failing = asv_values(smoke["results"], "bench_parity.Parity.track_failing_cases")
    assert set(failing.values()) == {0}, failing
    steps = asv_values(smoke["results"], "bench_mixers.MixerStep.track_step_time")
    assert all(v > 0 for v in steps.values())
    layer_steps = asv_values(smoke["results"], "bench_mixers.Layers.track_step_time")
    assert {k[0] for k in layer_steps} == set(grid.LAYER_MIXERS)
    for (mixer, shape, impl, dtype), v in layer_steps.items():  # the smoke run skips torch.compile and bf16
        assert (v > 0) if impl != "plain_compile" and dtype == "fp32" else math.isnan(v), (mixer, shape, impl, dtype, v)
    stack_steps = asv_values(smoke["results"], "bench_mixers.Stacks.track_step_time")
    assert len(stack_steps) == len(grid.STACK_SHAPES) * len(grid.STACK_IMPLS) * len(grid.LAYER_DTYPES)
    for (shape, impl, dtype), v in stack_steps.items():  # the smoke run: the eager stack in fp32 only
        assert (v > 0) if impl == "kernel" and dtype == "fp32" else math.isnan(v), (shape, impl, dtype, v)


def test_times_are_recorded_with_samples_and_statistics(smoke):
    """asv keeps each timed cell's samples and computes its CI and quartiles from them."""
    from asv.results import Results

    path = next(p for p in (smoke["results"] / "smoke").glob("*.json") if p.name != "machine.json")
    res = Results.load(str(path))
    for name in ("bench_scans.Scans.track_device_time", "bench_scans.Scans.track_call_latency"):
        params = res.get_result_params(name)
        stats = [s for s in res.get_result_stats(name, params) if s is not None]
        samples = [s for s in res.get_result_samples(name, params) if s is not None]
        assert stats and all(s["ci_99_a"] <= s["q_25"] <= s["q_75"] <= s["ci_99_b"] for s in stats), name
        assert samples and all(len(s) == 3 for s in samples), name  # the smoke run's 3 samples per cell


def test_render_refuses_a_run_that_lacks_cells(smoke, tmp_path):
    out = render("--results-dir", str(smoke["results"]), "--out", str(tmp_path))
    assert out.returncode == 2
    assert "lacks" in out.stderr and "bench_scans.track_copy_bandwidth" in out.stderr
    assert not list(tmp_path.iterdir()), "a refused run must write nothing"


def test_render_partial_matches_the_asv_results(smoke, tmp_path):
    from benchmarks.harness import grid

    out = render("--results-dir", str(smoke["results"]), "--out", str(tmp_path), "--partial")
    assert out.returncode == 0, out.stderr
    md = (tmp_path / "scan_bench.md").read_text()
    assert f"commit `{smoke['commit'][:12]}`" in md and "partial run" in md
    times = scan_times(smoke["results"])
    for op, shape, direction in itertools.product(grid.OP_NAMES, grid.SHAPES, grid.DIRECTIONS):
        tri, eag = times[op, shape, "triton", direction], times.get((op, shape, "eager", direction))
        eag = None if eag is None or math.isnan(eag) else eag  # asv reports a skipped cell as NaN
        eager = f"{eag * 1e6:,.1f}" if eag is not None else "skipped"
        ratio = f"{eag / tri:.2f}×" if eag is not None else ""
        assert f"| {op} | {shape} | {direction} | {tri * 1e6:,.1f} | {eager} | skipped | {ratio} |" in md
    parity = json.loads((tmp_path / "scan_parity.json").read_text())
    assert parity["rows"] and all(r["passed"] for r in parity["rows"])
    assert f"**{len(parity['rows'])} / {len(parity['rows'])} pass**" in (tmp_path / "scan_parity.md").read_text()


def test_render_is_deterministic(smoke, tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    for out in (first, second):
        assert render("--results-dir", str(smoke["results"]), "--out", str(out), "--partial").returncode == 0
    for path in first.iterdir():
        assert path.read_bytes() == (second / path.name).read_bytes(), path.name


def test_render_names_a_missing_commit_or_machine(smoke, tmp_path):
    out = render("--results-dir", str(smoke["results"]), "--out", str(tmp_path), "--commit", "0" * 40)
    assert out.returncode == 2 and "no run of commit" in out.stderr
    out = render("--results-dir", str(smoke["results"]), "--out", str(tmp_path), "--machine", "nope")
    assert out.returncode == 2 and "no results for machine 'nope'" in out.stderr


@pytest.mark.parametrize("machine", [["--machine", "h200"], []], ids=["h200", "the machine with a whole run"])
def test_committed_artifacts_are_the_render_of_the_committed_results(machine, tmp_path):
    """Also without --machine: the results hold an h100 run of `Scans` alone beside the h200
    history, and the render takes the one machine with a run of the whole suite."""
    results = ROOT / "experiments" / "asv" / "results"
    if not (results / "h200").exists():
        pytest.skip("no committed H200 run yet")
    out = render(*machine, "--out", str(tmp_path))
    assert out.returncode == 0, out.stderr
    for path in sorted(tmp_path.iterdir()):
        committed = ROOT / "experiments" / "bench" / path.name
        assert committed.read_bytes() == path.read_bytes(), f"{committed} differs from the render of the results"
    readme = (ROOT / "README.md").read_text()
    assert (tmp_path / "scan_headline.md").read_text().strip() in readme, "README headline is not the rendered one"


def test_slow_cells_take_fewer_samples_and_fast_cells_all(monkeypatch):
    """A cell whose one call is slow (eager references at large: 1.8 s a call) stops at
    SLOW_BUDGET_S of samples, never below MIN_SAMPLES; every other cell keeps SAMPLES."""
    import time

    import torch

    from benchmarks.harness import measure

    assert measure._sample_count(50e-6, 15) == measure._sample_count(0.2, 15) == 15
    assert measure._sample_count(1.8, 15) == measure.MIN_SAMPLES
    assert measure.MIN_SAMPLES < measure._sample_count(0.3, 15) < 15
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(measure, "SLOW_BUDGET_S", 0.3)
    calls = []

    def slow():
        calls.append(1)
        time.sleep(0.05)

    got = measure.call_latency(slow)
    assert got["number"] == 1 and len(got["samples"]) == 6 and len(calls) == 1 + 6, (got, len(calls))
    assert all(0.05 <= s < 0.5 for s in got["samples"]), got
    fast = measure.call_latency(lambda: None)
    assert len(fast["samples"]) == measure.SAMPLES and fast["number"] == 1000, fast


def test_a_timed_triton_call_writes_no_environment(monkeypatch):
    """The triton impl runs under MINGRU_SCAN=triton: set per call when its caller has not set
    it, and left alone (not even rewritten) when it has, as the suite does around a measurement:
    writing os.environ cost ~2.5 us a call, which call_latency must not count."""
    from types import SimpleNamespace

    from benchmarks.harness import measure

    class Recording(dict):
        def __setitem__(self, key, value):
            writes.append(key)
            super().__setitem__(key, value)

    writes = []
    monkeypatch.setattr(os, "environ", Recording(os.environ))
    monkeypatch.setitem(measure.OPS, "probe", SimpleNamespace(fn=lambda *xs: os.environ.get("MINGRU_SCAN")))
    monkeypatch.setitem(os.environ, "MINGRU_SCAN", "auto")
    writes.clear()
    run_once = measure.implementation("probe", "triton")
    assert run_once() == "triton" and os.environ["MINGRU_SCAN"] == "auto" and writes, writes
    with measure.scan_mode("triton"):
        writes.clear()
        assert [run_once() for _ in range(3)] == ["triton"] * 3 and writes == [], writes
    assert os.environ["MINGRU_SCAN"] == "auto"


def test_a_failing_kernel_fails_its_own_cells_and_the_rest_are_measured(monkeypatch):
    """A commit whose kernel for one op fails to compile (as 56a8058's look-back did on the
    H200) fails that op's cells, with the error, and measures every other cell: asv records
    no value for the failed ones (the gate reports them newly failing), not a whole suite
    skipped because its setup_cache raised."""
    from benchmarks import bench_scans
    from benchmarks.harness import grid, suite

    monkeypatch.setenv(suite.SMOKE_ENV, "1")
    monkeypatch.setattr(suite, "note", lambda msg: None)

    def measure_cell(op_name, shape, impl, direction):
        if op_name == "linear_scan":
            raise RuntimeError("CompilationError: at 12:4: loop-carried variable changed type")
        return dict(seconds=1e-3, device_time=dict(samples=[1e-3], number=1),
                    call_latency=dict(samples=[2e-3], number=1), peak_bytes=None, launches=1)

    monkeypatch.setattr(suite, "measure_cell", measure_cell)
    shape = next(iter(grid.SHAPES))
    cells = suite.op_cells(ops=("linear_scan", "matrix_scan"), shapes=(shape,), impls=("triton",))
    for direction in grid.DIRECTIONS:
        failed = ("linear_scan", shape, "triton", direction)
        assert "CompilationError" in cells["failed"][failed] and failed not in cells["seconds"]
        with pytest.raises(RuntimeError, match="CompilationError"):
            bench_scans.Scans().setup(cells, *failed)
        bench_scans.Scans().setup(cells, "matrix_scan", shape, "triton", direction)  # measured: no raise
        assert cells["seconds"]["matrix_scan", shape, "triton", direction] == 1e-3

    def form_workload(op_name, form, direction, dims, dev):
        if form == "packed":
            def broken():
                raise ValueError("illegal memory access")
            return broken
        if form == "reverse":
            def older(*_, **__):
                raise TypeError("parallel_scan_log() got an unexpected keyword argument 'reverse'")
            return older
        return lambda: None

    monkeypatch.setattr(suite, "_form_workload", form_workload)
    forms = suite.form_cells()
    op = grid.FORM_OPS[0]
    assert "illegal memory access" in forms["failed"][op, "packed", "fwd"]
    assert "no reverse form" in forms["skipped"][op, "reverse", "fwd"] and (op, "reverse", "fwd") not in forms["failed"]
    assert (op, "dense", "fwd") in forms["device_time"]
    with pytest.raises(RuntimeError, match="illegal memory access"):
        bench_scans.CallForms().setup(forms, op, "packed", "fwd")
    with pytest.raises(NotImplementedError):
        bench_scans.CallForms().setup(forms, op, "reverse", "fwd")
