"""Mixers as trained: a GivensMinGRU step, fused kernel path vs the generic path (MixerStep),
whole minGRU-family layers against plain torch and cuDNN (Layers), and a whole MinGRUStack on
the kernels, eager and under torch.compile (Stacks)."""
from benchmarks._adapter import cached, long_setup_cache, require_cell
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


class Layers:
    """One training step of a minGRU-family layer (issue 19): scankit's on the kernels
    beside the same layer in plain torch, eager and compiled, and nn.GRU (cuDNN); fp32 and bf16
    autocast (benchmarks.harness.layers). Only ``kernel`` measures the commit; the rest are
    reference cells, measured once per machine and torch."""

    params = [list(grid.LAYER_MIXERS), list(grid.LAYER_SHAPES), list(grid.LAYER_IMPLS), list(grid.LAYER_DTYPES)]
    param_names = ["mixer", "shape", "impl", "dtype"]
    timeout = 1800

    @long_setup_cache
    def setup_cache(self):
        from benchmarks.harness import suite

        return suite.layer_cells()

    def setup(self, cells, mixer, shape, impl, dtype):
        require_cell(cells, "seconds", (mixer, shape, impl, dtype))

    def track_step_time(self, cells, mixer, shape, impl, dtype):
        return cached(cells["seconds"], (mixer, shape, impl, dtype))

    track_step_time.unit = "seconds"
    track_step_time.version = VERSION

    def track_peak_cuda_memory(self, cells, mixer, shape, impl, dtype):
        return cached(cells["peak_bytes"], (mixer, shape, impl, dtype))

    track_peak_cuda_memory.unit = "bytes"
    track_peak_cuda_memory.version = VERSION


class Stacks:
    """One training step of a MinGRUStack with one block of each mixer (issue 19), on the
    kernels eagerly and under torch.compile with the kernels inside (benchmarks.harness.layers);
    both measure the commit."""

    params = [list(grid.STACK_SHAPES), list(grid.STACK_IMPLS), list(grid.LAYER_DTYPES)]
    param_names = ["shape", "impl", "dtype"]
    timeout = 1800

    @long_setup_cache
    def setup_cache(self):
        from benchmarks.harness import suite

        return suite.stack_cells()

    def setup(self, cells, shape, impl, dtype):
        require_cell(cells, "seconds", (shape, impl, dtype))

    def track_step_time(self, cells, shape, impl, dtype):
        return cached(cells["seconds"], (shape, impl, dtype))

    track_step_time.unit = "seconds"
    track_step_time.version = VERSION

    def track_peak_cuda_memory(self, cells, shape, impl, dtype):
        return cached(cells["peak_bytes"], (shape, impl, dtype))

    track_peak_cuda_memory.unit = "bytes"
    track_peak_cuda_memory.version = VERSION

