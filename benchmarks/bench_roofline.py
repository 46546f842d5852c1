"""The roofline's other columns: peer libraries on linear_scan_state, and the scaling of
the forward kernels with T at B = 1 (rendered into experiments/bench/scan_roofline.md), and
issue 16's cells (``Roofline``) and cliff sweep (``Cliffs``), and issue 17's block widths
(``BlockWidths``)."""
from benchmarks._adapter import cached, long_setup_cache, require_cell
from benchmarks.harness import grid

VERSION = grid.VERSION  # the harness's method (asv hashes only this file)


class Peers:
    params = [list(grid.SHAPES), list(grid.PEERS), list(grid.DIRECTIONS)]
    param_names = ["shape", "peer", "direction"]
    timeout = 1800

    @long_setup_cache
    def setup_cache(self):
        from benchmarks.harness import suite

        return suite.peer_cells()

    def setup(self, cells, shape, peer, direction):
        key = (shape, peer, direction)
        if key in cells["skipped"]:  # not installed / no CUDA / the peer cannot: n/a, with why
            raise NotImplementedError(cells["skipped"][key])

    def track_time(self, cells, shape, peer, direction):
        return cached(cells["seconds"], (shape, peer, direction))

    track_time.unit = "seconds"
    track_time.version = VERSION


class Scaling:
    params = [list(grid.SCALING_OPS), list(grid.SCALING_LOG2T)]
    param_names = ["op", "log2_T"]
    timeout = 1800

    @long_setup_cache
    def setup_cache(self):
        from benchmarks.harness import suite

        return suite.scaling_cells()

    def track_time(self, cells, op, log2_T):
        return cached(cells["seconds"], (op, log2_T))

    track_time.unit = "seconds"
    track_time.version = VERSION


class Roofline:
    """linear_scan_state from h_0 = 0 at issue 16's shapes: scankit's kernels on (B, T, D)
    beside accelerated-scan on its native (B, D, T) layout (no transposes timed), fp32 and
    bf16, device time; ``track_bytes``: what the cell must move at least (its % of copy is
    bytes / time / the run's ``track_copy_bandwidth``). A trend (measured per commit, gated
    through the Scans cells at large and vlong)."""
    params = [list(grid.ROOFLINE_SHAPES), list(grid.ROOFLINE_IMPLS), list(grid.ROOFLINE_DTYPES), list(grid.DIRECTIONS)]
    param_names = ["shape", "impl", "dtype", "direction"]
    timeout = 1800

    @long_setup_cache
    def setup_cache(self):
        from benchmarks.harness import suite

        return suite.roofline_cells()

    def setup(self, cells, shape, impl, dtype, direction):
        require_cell(cells, "device_time", (shape, impl, dtype, direction))

    def track_device_time(self, cells, shape, impl, dtype, direction):
        return cached(cells["device_time"], (shape, impl, dtype, direction))

    track_device_time.unit = "seconds"
    track_device_time.version = VERSION

    def track_bytes(self, cells, shape, impl, dtype, direction):
        return cached(cells["bytes"], (shape, impl, dtype, direction))

    track_bytes.unit = "bytes"
    track_bytes.version = VERSION


class Cliffs:
    """linear_scan_state's fp32 forward from h_0 = 0 over issue 16's sweep of B x D x T (the cells
    with at least 64 MiB of inputs: grid.cliff_shapes), triton, device time (% of copy:
    grid.cliff_bytes / time / the run's copy bandwidth). A trend, rendered as a heatmap (no cell
    below 70% of copy is the goal); one track, so the 51 cells cost 51 asv processes, not 102."""
    params = [list(grid.cliff_shapes())]
    param_names = ["shape"]
    timeout = 1800

    @long_setup_cache
    def setup_cache(self):
        from benchmarks.harness import suite

        return suite.cliff_cells()

    def setup(self, cells, shape):
        require_cell(cells, "device_time", (shape,))

    def track_device_time(self, cells, shape):
        return cached(cells["device_time"], (shape,))

    track_device_time.unit = "seconds"
    track_device_time.version = VERSION


class BlockWidths:
    """matrix_affine_scan's states only (h from h_0 = 0, what the mixers call) at k in {4, 8, 16}
    with v = 1 and at k = v = 16, n = d // k blocks at `large` and `vlong`: issue 17's block
    widths, device time; ``track_bytes``: what the cell must move at least (% of copy: bytes /
    time / the run's copy bandwidth). A trend (the k = 8 prefix form is gated in Scans)."""
    params = [list(grid.BLOCK_SHAPES), list(grid.BLOCK_WIDTHS), list(grid.DIRECTIONS)]
    param_names = ["shape", "width", "direction"]
    timeout = 1800

    @long_setup_cache
    def setup_cache(self):
        from benchmarks.harness import suite

        return suite.block_cells()

    def setup(self, cells, shape, width, direction):
        require_cell(cells, "device_time", (shape, width, direction))

    def track_device_time(self, cells, shape, width, direction):
        return cached(cells["device_time"], (shape, width, direction))

    track_device_time.unit = "seconds"
    track_device_time.version = VERSION

    def track_bytes(self, cells, shape, width, direction):
        return cached(cells["bytes"], (shape, width, direction))

    track_bytes.unit = "bytes"
    track_bytes.version = VERSION
