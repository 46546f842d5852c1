"""The bound launches (common._launch_bound, and the launch plans' ``common.Slot``), checked against Triton's own binder without a
GPU: kernels compiled for sm_90 (scripts/compile_for_gpu.py's target), Triton's launch left
out, the compiled launcher replaced by a recorder. A repeated call must hand the launcher the
very arguments, in the very order, and the very compiled kernel that JITFunction.run would."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = r'''
import sys
sys.path[:0] = [{root!r}, {root!r} + "/scripts"]
import torch
import compile_for_gpu
compile_for_gpu.gpu_target()
from triton import knobs
from triton.runtime.jit import JITFunction, compute_cache_key
import scankit, scankit.dispatch
from scankit.triton import common
scankit.dispatch.interpreting = lambda: True   # CPU tensors to the (compiled, never run) kernels
import os; os.environ["MINGRU_SCAN"] = "triton"
compile_for_gpu.compile_instead_of_launching()  # bind + compile only

calls, bound, slot_call = [], common._launch_bound, common.Slot.__call__
def watched(kernel, grid, args, meta):
    calls.append((kernel, grid, args, dict(meta), None))
    return bound(kernel, grid, args, meta)
common._launch_bound = watched
def slot_watched(slot, *args):   # a planned launch: its grid and constexprs as it binds them
    grid, meta = slot.binding
    calls.append((slot.kernel, grid, args, dict(meta), slot))
    return slot_call(slot, *args)
common.Slot.__call__ = slot_watched

def compiled_of(kernel, grid, args, meta, slot):
    return slot.compiled if slot is not None else common._BOUND[common._bound_key(kernel, grid, args, meta)][0]

g = torch.Generator().manual_seed(0)
r = lambda *s: torch.rand(*s, generator=g)
a, b, h0 = r(64, 64, 512), r(64, 64, 512), r(64, 512)
M, x = r(8, 64, 8, 2, 2), r(8, 64, 8, 2)
A, Bm = r(8, 64, 8, 4, 4), r(8, 64, 8, 4, 2)
an, bn, bn1 = r(1, 4096, 64), r(1, 4096, 64), r(1, 4097, 64)
Mn, xn, An, Bn = r(1, 4096, 4, 2, 2), r(1, 4096, 4, 2), r(1, 4096, 4, 4, 4), r(1, 4096, 4, 4, 1)
ang, rb = r(4, 64, 8, 2, 4), r(4, 64, 8, 8)
from scankit import triton as kernels
cases = [lambda: scankit.linear_scan(a, b), lambda: scankit.linear_scan(a, b, h0=h0, return_prefix=False),
         lambda: scankit.parallel_scan_log(-a, b, log_h0=h0), lambda: scankit.matrix_scan(M, x),
         lambda: scankit.matrix_affine_scan(A, Bm, return_prefix=False),
         lambda: scankit.linear_scan(a[:, :, 1:], b[:, :, 1:]),   # 4-byte offsets: another specialization
         lambda: scankit.parallel_scan_log(-an, bn1), lambda: scankit.matrix_scan(Mn, xn),  # chunked: 2 launches
         lambda: fwdbwd(scankit.parallel_scan_log, -an, bn1), lambda: fwdbwd(scankit.linear_scan, an, bn),
         lambda: fwdbwd(scankit.matrix_affine_scan, An, Bn),
         lambda: kernels.rotation_scan(ang, rb), lambda: fwdbwd(kernels.rotation_scan, ang, rb)]  # angle-fused


def fwdbwd(op, *xs):   # the backward kernels too (garbage values: nothing runs)
    with torch.enable_grad():
        xs = [x.detach().requires_grad_() for x in xs]
        out = op(*xs)
        out = out if isinstance(out, tuple) else (out,)
        torch.autograd.grad(out, xs, [torch.ones_like(o) for o in out])
checked = planned = 0
for case in cases:
    with torch.no_grad():
        calls.clear(); case()                       # misses: Triton binds, compiles, fills the cache
        first = list(calls)
        seen = []
        for launch in first:
            compiled_of(*launch)._run = lambda *v, _seen=seen: _seen.append(v)
        calls.clear(); case()                       # hits: the recorders get the launches
    assert len(calls) == len(first) == len(seen) > 0, (len(calls), len(first), len(seen))
    for (kernel, grid, args, meta, slot), got in zip(calls, seen):
        kernel_cache, key_cache, target, backend, binder = kernel.device_caches[0]
        kw = dict(enable_fp_fusion=common.FP_FUSION, **meta, debug=kernel.debug or knobs.runtime.debug,
                  instrumentation_mode=knobs.compilation.instrumentation_mode)   # in JITFunction.run's order
        bound_args, spec, options = binder(*args, **kw)
        want = kernel_cache[compute_cache_key(key_cache, spec, options)]
        grid3 = (*grid, 1, 1)[:3]
        assert got[:3] == grid3, (got[:3], grid3)
        assert got[5] is want.packed_metadata and got[6:9] == (None, None, None)
        values, expected = got[9:], tuple(bound_args.values())
        assert len(values) == len(expected), (kernel.fn.__name__, len(values), len(expected))
        for v, e in zip(values, expected):
            assert v is e or (not isinstance(v, torch.Tensor) and v == e and type(v) is type(e)), (v, e)
        assert compiled_of(kernel, grid, args, meta, slot) is want
        checked += 1
        planned += slot is not None
entries = len(common._BOUND)
assert planned, "no planned launch checked"
print(f"checked {{checked}} bound launches ({{planned}} planned), {{entries}} cache entries")
'''


def test_bound_launches_pass_what_triton_would():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", SCRIPT.format(root=str(ROOT))], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "checked" in done.stdout, done.stdout
