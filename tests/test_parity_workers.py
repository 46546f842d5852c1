"""The parity grid shared out over worker processes (suite.parity_rows): every case once,
the cases of one kernel specialization in one process, and the same rows as one process."""
import random

import pytest
import torch

from benchmarks.harness import suite
from benchmarks.harness.measure import parity_grid


def test_shares_cover_every_case_once_and_keep_a_specialization_together():
    cases = list(parity_grid())
    random.Random(0).shuffle(cases)
    for workers in (1, 3, 8, 1000):
        shares = suite.parity_shares(cases, workers)
        assert 1 <= len(shares) <= workers
        assert sorted(i for share in shares for i in share) == list(range(len(cases)))
        where = {}
        for n, share in enumerate(shares):
            for i in share:
                op_name, dims, dtype = cases[i]
                key = op_name, dims.get("k"), dims.get("v"), dtype
                assert where.setdefault(key, n) == n, f"{key} split over shares"
    # the matrix_affine_scan (k, v) grid alone has 26 specializations: 8 workers all get work
    assert len(suite.parity_shares(cases, 8)) == 8


def test_rows_from_workers_equal_rows_from_one_process(monkeypatch):
    monkeypatch.setenv(suite.SMOKE_ENV, "1")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    if torch.cuda.is_available():
        pytest.skip("the CPU smoke grid")
    one = suite.parity_rows(workers=1)
    two = suite.parity_rows(workers=2)
    assert one == two and len(one) > 0
    assert {r["op"] for r in one} >= set(suite.grid.OP_NAMES)


def _double_unless_in_a_worker_that_dies(x, die):
    import multiprocessing
    import os

    if die and multiprocessing.parent_process() is not None:
        os._exit(3)  # the worker process dies (a CUDA fault would end it the same way)
    return 2 * x


def test_in_workers_keeps_order_and_runs_a_dead_workers_share_here(capfd):
    assert suite.in_workers(_double_unless_in_a_worker_that_dies, [(1, False), (2, False), (3, False)]) == [2, 4, 6]
    assert suite.in_workers(_double_unless_in_a_worker_that_dies, [(5, False), (7, True)]) == [10, 14]
    assert "a worker process died" in capfd.readouterr().err


def test_spawned_workers_import_the_suite_when_its_folder_is_off_sys_path(tmp_path):
    """asv imports the suite with the repository folder on sys.path only while importing; a
    spawned worker that could not import ``benchmarks`` died on its first call, and every
    share then ran in the asv process, one at a time (session 7's H200 run)."""
    import subprocess
    import sys

    script = f"""
import sys
sys.path.insert(0, {str(suite.REPO)!r})
from benchmarks.harness import suite
sys.path[:] = [p for p in sys.path if p not in ({str(suite.REPO)!r}, '')]
with suite.spawn_pool(2) as pool:
    print(list(pool.map(suite.parity_shares, [[(0, {{}}, 0)], []], [1, 1])))
print(suite.in_workers(suite.smoke, [(), ()]))
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["[[[0]], []]", "[False, False]"], done.stdout
    assert "died" not in done.stderr, done.stderr


def test_the_references_a_setup_measures_are_the_uncached_ones_that_run(tmp_path, monkeypatch):
    import json

    monkeypatch.delenv(suite.SMOKE_ENV, raising=False)
    monkeypatch.setenv("SCANKIT_BENCH_CACHE", str(tmp_path))
    keys = [(op, shape, impl, d) for op in ("linear_scan", "matrix_scan") for shape in ("lab", "vlong")
            for impl in suite.grid.IMPLS for d in suite.grid.DIRECTIONS]
    reasons = {key: suite.cell_skip(*key[:3]) for key in keys}
    cached = ("linear_scan", "lab", "torch_compile", "fwd")
    (tmp_path / "references.json").write_text(json.dumps({suite._reference_cache_key(*cached): {}}))
    got = suite.uncached_references(keys, reasons)
    assert got == [k for k in keys if k[2] != "triton" and k != cached and not reasons[k]]
    assert ("matrix_scan", "vlong", "eager", "fwd") not in got  # a registered skip
    assert {k[2] for k in got} == {"eager", "torch_compile"} and len(got) == 11


def test_references_measured_in_workers_one_at_a_time_cover_every_cell(monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("the CPU smoke grid")
    monkeypatch.setenv(suite.SMOKE_ENV, "1")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(suite, "WORKERS", 2)
    keys = [(op, shape, "eager", d) for op in ("linear_scan", "parallel_scan_log") for shape in ("lab", "longT")
            for d in suite.grid.DIRECTIONS]
    got = suite.reference_cells_in_workers(keys)
    assert sorted(got) == sorted(keys)
    for cell in got.values():
        assert len(cell["device_time"]["samples"]) > 0 and cell["seconds"] > 0
    assert len(suite._kernel_shares(keys, None)) == 2 and suite.reference_cells_in_workers([]) == {}


def test_reference_shares_spread_the_compiled_cells_over_every_worker(monkeypatch):
    """The reference grid alternates eager and torch.compile groups; packed by length, an even
    worker count put every compile on half the workers. Packed by warm-up cost, each worker
    compiles, no group is split, and the compiled loads differ by at most one group."""
    monkeypatch.setattr(suite, "WORKERS", 8)
    keys = [(o, s, i, d) for o in suite.grid.OP_NAMES for s in suite.grid.SHAPES for d in suite.grid.DIRECTIONS
            for i in suite.REFERENCE_IMPLS if not suite.grid.skip_reason(o, s, i)]
    for workers in (2, 4, 8):
        shares = suite._kernel_shares(keys, workers)
        assert sorted(k for share in shares for k in share) == sorted(keys)
        compiled = [sum(k[2] == "torch_compile" for k in share) for share in shares]
        assert len(shares) == workers and min(compiled) > 0, compiled
        assert max(compiled) - min(compiled) <= len(suite.grid.DIRECTIONS), compiled
        where = {}
        for n, share in enumerate(shares):
            for k in share:
                assert where.setdefault(k[:3], n) == n, f"{k[:3]} split over shares"
