"""The roofline's other columns: peer libraries on linear_scan_state, and the scaling of
the forward kernels with T at B = 1 (rendered into experiments/bench/scan_roofline.md)."""
from benchmarks._adapter import cached, long_setup_cache
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
