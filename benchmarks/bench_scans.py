"""Time and peak CUDA memory of every scan op x shape x impl x direction."""
from benchmarks._adapter import cached, long_setup_cache
from benchmarks.harness import grid


class Scans:
    params = [list(grid.OP_NAMES), list(grid.SHAPES), list(grid.IMPLS), list(grid.DIRECTIONS)]
    param_names = ["op", "shape", "impl", "direction"]
    timeout = 3600

    @long_setup_cache
    def setup_cache(self):
        from benchmarks.harness import suite

        return suite.op_cells()

    def setup(self, cells, op, shape, impl, direction):
        key = (op, shape, impl, direction)
        if key not in cells["seconds"]:  # a registered skip: asv records n/a, not a failure
            raise NotImplementedError(cells["skipped"].get(key, "not measured in this run"))

    def track_time(self, cells, op, shape, impl, direction):
        return cached(cells["seconds"], (op, shape, impl, direction))

    track_time.unit = "seconds"

    def track_peak_cuda_memory(self, cells, op, shape, impl, direction):
        return cached(cells["peak_bytes"], (op, shape, impl, direction))

    track_peak_cuda_memory.unit = "bytes"


def track_copy_bandwidth():
    """Device-to-device copy (bytes read + written per second): the roofline of every op."""
    from benchmarks.harness import suite

    return suite.copy_bandwidth()


def _needs_cuda():
    import torch

    if not torch.cuda.is_available():
        raise NotImplementedError("copy bandwidth needs a CUDA device")


track_copy_bandwidth.unit = "bytes/s"
track_copy_bandwidth.setup = _needs_cuda
