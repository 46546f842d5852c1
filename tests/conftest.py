"""Test setup: kernels run through Triton's interpreter when there is no GPU."""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede any triton import
from scankit.triton import interpret  # noqa: E402 (after TRITON_INTERPRET)

interpret.speed_up()  # interpreter only: its scan a slice per step, the same numbers (interpret.py)


@pytest.fixture
def scan_mode(monkeypatch):
    """Set MINGRU_SCAN for one test: ``scan_mode("eager")``."""

    def set_mode(mode):
        monkeypatch.setenv("MINGRU_SCAN", mode)

    return set_mode


@pytest.fixture
def bench_smoke(monkeypatch):
    """The benchmark suite's CPU smoke mode (tiny shapes, kernels through the interpreter)."""
    monkeypatch.setenv("SCANKIT_BENCH_SMOKE", "1")
    monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.fixture(params=["eager", "triton"])
def kernel_mode(request, scan_mode):
    """Each test twice: the eager references and the kernels (through the interpreter on the CPU)."""
    scan_mode(request.param)
    return request.param


@pytest.fixture
def seed(request):
    """A fresh seed per test run, printed on failure; ``SCANKIT_SEED=<seed>`` replays a case."""
    value = int(os.environ.get("SCANKIT_SEED") or int.from_bytes(os.urandom(4), "little"))
    print(f"seed={value}")
    return value


@pytest.fixture(autouse=True)
def _poisoned_cuda_cache():
    """On a GPU every test starts with NaN in the allocator's free blocks: an output a kernel
    leaves unwritten, or a read of memory nobody wrote, fails instead of passing on zeros."""
    from oracles import poison_cuda_cache

    poison_cuda_cache()


@pytest.fixture(params=[("off", 1), ("always", 1), ("always", 9), ("chunked", 2)], ids=lambda p: f"{p[0]}-prefix{p[1]}")
def lookback(request, monkeypatch):
    """The single-pass look-back kernels switched on; prefix_every > 1 makes look-backs
    compose aggregates, over several windows of 4 at 9 (in-order interpreter programs never wait);
    1 is the GPU's setting."""
    from scankit.triton import common

    mode, every = request.param
    monkeypatch.setitem(common.LOOKBACK, "linear", mode)
    monkeypatch.setitem(common.LOOKBACK, "prefix_every", every)
    monkeypatch.setitem(common.LOOKBACK, "window", 4)
    return mode


def record_launches(monkeypatch, entry):
    """MINGRU_SCAN=triton, and a list that records ``entry(kernel name, launch meta)`` of every
    Triton kernel launch (``common.launch``)."""
    from scankit.triton import common

    monkeypatch.setenv("MINGRU_SCAN", "triton")
    seen = []
    launch = common.launch

    def recording(kernel, grid, *args, **meta):
        seen.append(entry(kernel.fn.__name__, meta))
        return launch(kernel, grid, *args, **meta)

    monkeypatch.setattr(common, "launch", recording)
    return seen


@pytest.fixture(autouse=True)
def _fresh_launch_plans():
    """Launch plans made under a test's monkeypatched knobs or probes (a replaced knob table, a
    pretended GPU) are not reused by the next test, nor theirs by it."""
    from scankit.triton import common

    common.forget_plans()
    yield
    common.forget_plans()
