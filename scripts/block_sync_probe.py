#!/usr/bin/env python3
"""Synchronisation in the generic block kernels' step loop, per launch knob, without a GPU.

    python scripts/block_sync_probe.py K V NUM_WARPS PRODUCT_ELEMS

Sets ``affine.TUNING`` (num_warps, product_elems), runs matrix_affine_scan forward and
backward, states-only and prefix forms, on CPU tensors with the kernels compiled for sm_90 and
never run (``compile_for_gpu``), and prints per form and kernel the registers and local memory
(``compile_for_gpu.resources``) and the PTX's lane shuffles, barriers and shared-memory stores
(``compile_for_gpu.codegen``): a state whose layout conversion crosses warps goes through shared
memory and a barrier every step; within one warp it is shuffles only.
"""
import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import compile_for_gpu  # noqa: E402
import torch  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("k", "v", "num_warps", "product_elems"):
        parser.add_argument(name, type=int)
    args = parser.parse_args()
    compile_for_gpu.gpu_target()
    seen = []
    compile_for_gpu.compile_instead_of_launching(lambda fn, compiled, a, kw: seen.append((fn.__name__, compiled)))
    os.environ["MINGRU_SCAN"] = "triton"
    import scankit
    import scankit.dispatch
    from scankit.triton import affine

    scankit.dispatch.interpreting = lambda: True  # CPU tensors to the kernels (compiled, never run)
    affine.TUNING.update(num_warps=args.num_warps, product_elems=args.product_elems)
    for prefix in (False, True):
        seen.clear()
        A = torch.randn(32, 64, 32, args.k, args.k, requires_grad=True)
        B = torch.randn(32, 64, 32, args.k, args.v, requires_grad=True)
        out = scankit.matrix_affine_scan(A, B, return_prefix=prefix)
        out = out if isinstance(out, tuple) else (out,)
        torch.autograd.backward(out, [torch.zeros_like(o) for o in out])
        for name, compiled in dict((id(c), (n, c)) for n, c in seen).values():
            regs, local = compile_for_gpu.resources(compiled.asm["cubin"])
            c = compile_for_gpu.codegen(compiled.asm["ptx"])
            print(f"{name} k={args.k} v={args.v} {'prefix' if prefix else 'states-only'} num_warps={args.num_warps} "
                  f"product_elems={args.product_elems}: registers {regs}, local {local} B, shfl {c['shfl']}, "
                  f"barriers {c['bar']}, st.shared {c['st_shared']}")


if __name__ == "__main__":
    main()
