"""Every scan op x shape x direction of scankit's kernels (``Scans``, per commit) and of the
references (``References``: eager and torch.compile): device time, call latency, peak CUDA
memory.

``track_device_time`` is the GPU's time per call without the host (the quantity the gate
watches for scankit's kernels); ``track_call_latency`` is the host-inclusive wall time per
call that a small-shape user feels (trended, not gated); ``track_launches`` counts the
kernels (memsets and copies included) one call puts on the GPU. Both return asv samples, so asv
records each cell's median, 99% CI and quartiles. The references measure torch and the
host, not the commit: run them once per machine (``asv run --bench References HEAD^!``);
their cells are also kept per machine, torch and triton (``suite._cached_reference``), so a
run over many commits measures them once. They are never gated.
"""
from benchmarks._adapter import cached, long_setup_cache, require_cell
from benchmarks.harness import grid

VERSION = grid.VERSION  # the harness's method (asv hashes only this file)


class Scans:
    IMPLS = ("triton",)
    params = [list(grid.OP_NAMES), list(grid.SHAPES), list(IMPLS), list(grid.DIRECTIONS)]
    param_names = ["op", "shape", "impl", "direction"]
    timeout = 3600

    @long_setup_cache
    def setup_cache(self):
        from benchmarks.harness import suite

        return suite.op_cells(impls=self.IMPLS)

    def setup(self, cells, op, shape, impl, direction):
        require_cell(cells, "seconds", (op, shape, impl, direction))

    def track_device_time(self, cells, op, shape, impl, direction):
        return cached(cells["device_time"], (op, shape, impl, direction))

    track_device_time.unit = "seconds"
    track_device_time.version = VERSION

    def track_call_latency(self, cells, op, shape, impl, direction):
        return cached(cells["call_latency"], (op, shape, impl, direction))

    track_call_latency.unit = "seconds"
    track_call_latency.version = grid.LATENCY_VERSION

    def track_launches(self, cells, op, shape, impl, direction):
        return cached(cells["launches"], (op, shape, impl, direction))

    track_launches.unit = "launches"
    track_launches.version = grid.LAUNCHES_VERSION

    def track_peak_cuda_memory(self, cells, op, shape, impl, direction):
        return cached(cells["peak_bytes"], (op, shape, impl, direction))

    track_peak_cuda_memory.unit = "bytes"
    track_peak_cuda_memory.version = VERSION


class References(Scans):
    IMPLS = tuple(i for i in grid.IMPLS if i != "triton")
    params = [list(grid.OP_NAMES), list(grid.SHAPES), list(IMPLS), list(grid.DIRECTIONS)]

    @long_setup_cache
    def setup_cache(self):
        from benchmarks.harness import suite

        return suite.op_cells(impls=self.IMPLS)


class CallForms:
    """Each op's state form at one packed-size shape (grid.FORMS_SHAPE), triton: the dense call
    beside ``reverse=True``, ``cu_seqlens=`` (grid.PACKED_SEQUENCES sequences), the inputs stored
    time-last (``dim=2``) and the packed sequences looped over one call each; device time."""
    params = [list(grid.FORM_OPS), list(grid.FORMS), list(grid.DIRECTIONS)]
    param_names = ["op", "form", "direction"]
    timeout = 1800

    @long_setup_cache
    def setup_cache(self):
        from benchmarks.harness import suite

        return suite.form_cells()

    def setup(self, cells, op, form, direction):
        require_cell(cells, "device_time", (op, form, direction))

    def track_device_time(self, cells, op, form, direction):
        return cached(cells["device_time"], (op, form, direction))

    track_device_time.unit = "seconds"
    track_device_time.version = VERSION


def track_copy_bandwidth():
    """Device-to-device copy in TB/s (10^12 bytes read + written per second): the roofline
    of every op."""
    from benchmarks.harness import suite

    return suite.copy_bandwidth() / 1e12


def _needs_cuda():
    import torch

    if not torch.cuda.is_available():
        raise NotImplementedError("copy bandwidth needs a CUDA device")


track_copy_bandwidth.unit = track_copy_bandwidth.version = grid.COPY_VERSION
track_copy_bandwidth.setup = _needs_cuda
