"""Peers run in their own processes: a fault there (a third-party kernel's illegal memory
access kills the CUDA context) costs only that peer's cells, never the whole Peers suite."""
import operator
import os

import pytest

from benchmarks.harness import grid, suite


def test_isolated_returns_the_result():
    assert suite.isolated(operator.add, 2, 3) == 5


def test_isolated_passes_an_exception_on():
    with pytest.raises(ValueError):
        suite.isolated(int, "not a number")


def test_isolated_reports_a_process_that_died():
    with pytest.raises(RuntimeError, match="measuring process died"):
        suite.isolated(os._exit, 3)


def test_worker_is_reused_until_closed_and_replaced_after_dying():
    with suite.IsolatedWorker() as worker:
        first = worker(os.getpid)
        assert first != os.getpid() and worker(os.getpid) == first
        worker.close()
        second = worker(os.getpid)
        assert second != first
        with pytest.raises(RuntimeError, match="measuring process died"):
            worker(os._exit, 3)
        assert worker(os.getpid) not in (first, second)


def test_peer_cells_without_cuda_say_why_for_every_cell(monkeypatch):
    monkeypatch.setenv(suite.SMOKE_ENV, "1")
    monkeypatch.setattr(suite, "device", lambda: "cpu")
    cells = suite.peer_cells(shapes=("lab",))
    assert not cells["seconds"]
    assert set(cells["skipped"]) == {("lab", name, d) for name in grid.PEERS for d in grid.DIRECTIONS}
    assert all(cells["skipped"].values())
