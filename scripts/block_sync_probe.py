#!/usr/bin/env python3
"""Synchronisation in the generic block kernels' step loop, per launch knob, without a GPU.

    python scripts/block_sync_probe.py K V NUM_WARPS PRODUCT_ELEMS

Sets ``affine.TUNING`` (num_warps, product_elems), runs matrix_affine_scan forward and
backward (states-only and prefix forms) on CPU tensors with the kernels compiled for sm_90
(``compile_for_gpu.gpu_target``; nothing runs), and prints per compiled ``_fwd_kernel`` /
``_bwd_kernel`` specialization the registers and local memory (cubin) and the PTX's lane
shuffles, barriers and shared-memory stores: a state whose layout conversion crosses warps goes
through shared memory and a barrier every step; within one warp it is shuffles only.
"""
import argparse
import os
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import compile_for_gpu  # noqa: E402

compile_for_gpu.gpu_target()
import torch  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

_run = JITFunction.run


def _compile_only(self, *args, **kwargs):  # bind and compile, launch nothing
    kwargs["warmup"] = True
    return _run(self, *args, **kwargs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("k", "v", "num_warps", "product_elems"):
        parser.add_argument(name, type=int)
    args = parser.parse_args()
    k, v, warps, elems = args.k, args.v, args.num_warps, args.product_elems
    JITFunction.run = _compile_only
    os.environ["MINGRU_SCAN"] = "triton"
    import scankit
    import scankit.dispatch
    from scankit.triton import affine

    scankit.dispatch.interpreting = lambda: True
    affine.TUNING.update(num_warps=warps, product_elems=elems)
    for prefix in (False, True):
        A = torch.randn(32, 64, 32, k, k, requires_grad=True)
        B = torch.randn(32, 64, 32, k, v, requires_grad=True)
        out = scankit.matrix_affine_scan(A, B, return_prefix=prefix)
        out = out if isinstance(out, tuple) else (out,)
        torch.autograd.backward(out, [torch.zeros_like(o) for o in out])
    for kernel in (affine._fwd_kernel, affine._bwd_kernel):
        for compiled in kernel.device_caches[0][0].values():
            ptx = compiled.asm["ptx"]
            regs, local = compile_for_gpu.resources(compiled.asm["cubin"])
            print(f"{kernel.__name__} k={k} v={v} num_warps={warps} product_elems={elems}: registers {regs}, "
                  f"local {local} B, shfl {len(re.findall(r'shfl.sync', ptx))}, "
                  f"barriers {len(re.findall(r'bar.sync|barrier.sync', ptx))}, st.shared {len(re.findall(r'st.shared', ptx))}")


if __name__ == "__main__":
    main()
