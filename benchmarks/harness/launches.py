"""Kernel launches of a call: every Triton kernel scankit launches (``common.launch``), plus
every torch op that launches a GPU kernel of its own (the glue: copies, fills, cats, flips;
views and allocations launch nothing). The same on the CPU (kernels through TRITON_INTERPRET=1,
whose own copies of the arguments are not counted) and on a GPU, where it is the number of
kernels a torch.profiler trace of the call shows (``measure.gpu_launches``, the suite's
count there)."""
from __future__ import annotations

from torch.utils._python_dispatch import TorchDispatchMode

# ops that allocate or re-describe memory without running a kernel
_FREE = {"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided", "detach", "alias",
         "lift_fresh", "_reshape_alias", "set_", "resize_", "sym_size", "sym_stride", "sym_numel",
         "sym_storage_offset", "is_same_size", "_has_compatible_shallow_copy_type", "result_type"}


class Launches(TorchDispatchMode):
    """``with Launches() as n: fn()``; then ``n.kernels`` (Triton kernel names), ``n.glue``
    (torch ops that launch), ``n.total``; with ``record=True`` also ``n.calls``, each launch's
    (kernel, grid, args, meta) to replay. Off by default: holding the arguments keeps their
    tensors referenced, and autograd then copies a gradient it would otherwise take over."""

    def __init__(self, record: bool = False):
        super().__init__()
        self.kernels, self.calls, self.glue, self._inside, self._record = [], [], [], 0, record

    @property
    def total(self) -> int:
        return len(self.kernels) + len(self.glue)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if not self._inside and not func.is_view and name not in _FREE:
            self.glue.append(str(func))
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        from scankit.triton import common

        launch, counter = common.launch, self

        def counted(kernel, grid, *args, **meta):
            counter.kernels.append(kernel.fn.__name__)
            if counter._record:
                counter.calls.append((kernel, grid, args, dict(meta)))
            counter._inside += 1
            try:
                return launch(kernel, grid, *args, **meta)
            finally:
                counter._inside -= 1

        self._launch, common.launch = launch, counted
        return super().__enter__()

    def __exit__(self, *exc):
        from scankit.triton import common

        try:
            return super().__exit__(*exc)
        finally:
            common.launch = self._launch
