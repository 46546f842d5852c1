"""Triton's interpreter (``TRITON_INTERPRET=1``) made faster for scankit's kernels, the same numbers:
``speed_up()``, called by the CPU test suite and the benchmarks' CPU smoke run (never on import;
a no-op unless the interpreter is on).

The interpreter's fallback scan (``ScanOps.generic_scan``, triton 3.6 to 3.9) calls the combine
function once per element, on scalars: a (16, 32) tile's scan is 496 interpreted combines, and it
was most of the CPU suite's time. ``column_scan`` runs the same left fold along the scan axis,
step by step in the same order, each step on the whole slice of the other axes at once, so every
element goes through the same float operations in the same order: the results are bit-identical
(``tests/test_interpreter_scan.py`` checks that against the original on the kernels' combines).
And a nested ``@triton.jit`` call no longer patches ``triton.language`` again inside a launch.
"""
import numpy as np
import triton.language as tl

from ..dispatch import interpreting


def column_scan(self, input):
    """``ScanOps.generic_scan`` with each step of the fold over a whole slice."""
    axis = self.axis
    data = [arg.handle.data for arg in input]
    out = [np.empty_like(d) for d in data]
    at = lambda i: (slice(None),) * axis + (i,)  # noqa: E731 (the slice at position i of the axis)
    for o, d in zip(out, data):
        o[at(0)] = d[at(0)]
    for i in range(1, data[0].shape[axis]):
        acc = tuple(self.to_tensor(o[at(i - 1)], arg.dtype) for o, arg in zip(out, input))
        cur = tuple(self.to_tensor(d[at(i)], arg.dtype) for d, arg in zip(data, input))
        ret = self.combine_fn.fn(*acc, *cur)
        for o, r in zip(out, ret if isinstance(ret, tuple) else (ret,)):
            value = np.asarray(r.handle.data if isinstance(r, tl.core.tensor) else r)
            o[at(i)] = value.reshape(()) if value.size == 1 else value
    return [self.to_tensor(o, arg.dtype) for o, arg in zip(out, input)]


ORIGINAL = []  # the interpreter's own generic_scan, once swapped


def speed_up():
    """Both speedups when kernels run through the interpreter, where this triton's interpreter has
    what they replace (else it is left as is)."""
    if not interpreting():
        return
    _swap_scan()
    _patch_once_per_launch()


def _swap_scan():
    """Swap the interpreter's per-element scan for ``column_scan``."""
    from triton.runtime import interpreter

    ops = getattr(interpreter, "ScanOps", None)
    original = getattr(ops, "generic_scan", None)
    if original is not None and original is not column_scan:
        ORIGINAL.append(original)
        ops.generic_scan = column_scan


def _patch_once_per_launch():
    """Within a launch, a call of a nested ``@triton.jit`` function patches ``triton.language``
    again (``_patch_lang``: ~150 us of ``inspect.getmembers``), though the launch patched it
    already and restores it when the grid is done; skip the repeat."""
    from triton.runtime import interpreter

    patch = getattr(interpreter, "_patch_lang", None)
    grid_call = getattr(getattr(interpreter, "GridExecutor", None), "__call__", None)
    if patch is None or grid_call is None or getattr(patch, "once_per_launch", False):
        return
    launch_state = {"in_launch": False, "covered": None}  # the languages patched in the running launch

    def langs(fn):  # what _patch_lang patches: the triton.language modules fn's module sees
        return {id(v) for v in fn.__globals__.values() if v is tl or v is tl.core}

    def patch_once(fn):
        covered = launch_state["covered"]
        if covered is not None and langs(fn) <= covered:
            return None  # a device call inside a launch whose patch covers it (its result is unused)
        scope = patch(fn)
        if launch_state["in_launch"]:  # patched until the launch ends (a device call's, never restored)
            launch_state["covered"] = (covered or set()) | langs(fn)
        return scope

    def launch(self, *args, **kwargs):
        saved = dict(launch_state)
        launch_state.update(in_launch=True, covered=None)
        try:
            return grid_call(self, *args, **kwargs)
        finally:
            launch_state.update(saved)

    patch_once.once_per_launch = True
    interpreter._patch_lang = patch_once
    interpreter.GridExecutor.__call__ = launch
