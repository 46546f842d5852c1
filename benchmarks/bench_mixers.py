"""One GivensMinGRU training step (fwd + bwd): fused kernel path vs the generic path."""
from benchmarks._adapter import cached, long_setup_cache
from benchmarks.harness import grid

VERSION = grid.VERSION  # the harness's method (asv hashes only this file)


class MixerStep:
    params = [list(grid.MEMORY_SHAPES), list(grid.MIXER_PATHS)]
    param_names = ["shape", "path"]
    timeout = 1800

    @long_setup_cache
    def setup_cache(self):
        from benchmarks.harness import suite

        return suite.mixer_cells()

    def track_step_time(self, cells, shape, path):
        return cached(cells["seconds"], (shape, path))

    track_step_time.unit = "seconds"
    track_step_time.version = VERSION

    def track_peak_cuda_memory(self, cells, shape, path):
        return cached(cells["peak_bytes"], (shape, path))

    track_peak_cuda_memory.unit = "bytes"
    track_peak_cuda_memory.version = VERSION
