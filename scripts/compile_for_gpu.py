"""Compile every Triton kernel specialization scankit launches on a GPU, for a GPU, without one.

The interpreter (TRITON_INTERPRET=1, what CI runs the kernels through) does not run Triton's
compiler, so an error only the compiler sees (a loop-carried value that changes type, a
constexpr misuse, a register or shared-memory limit) used to show first on the H200. Here the
kernels are driven with the GPU configuration (tiles, warps, chunking for the target's SM count)
on small CPU tensors of each shape class, and each launch is compiled by Triton's real JIT
down to a cubin for the target (``warmup``: nothing runs; the outputs are garbage and unused).

    python scripts/compile_for_gpu.py [--arch 90] [--sms 132] [--resources] [--codegen]

Prints one row per kernel (specializations compiled; with --resources also the registers per
thread, fewest to most, and the local memory of any specialization that spills, read from the
cubins by Triton's own cuobjdump; with --codegen the specializations whose PTX has scalar global
loads / stores or lane shuffles, one line each) and exits 1 on the first compile error
or when a kernel of scankit.triton is launched by no shape class here. Not covered: the int64
offset (I64) variants, which need tensors over 2^31 elements.
"""
import argparse
import itertools
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
    sys.exit("compile_for_gpu: unset TRITON_INTERPRET (the interpreter compiles nothing)")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime.driver import driver  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402


class _TargetOnly:
    """A driver that names a GPU target and nothing else (no device, no launches)."""

    def __init__(self, arch: int):
        self.target = GPUTarget("cuda", arch, 32)

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_active_torch_device(self):
        return torch.device("cpu")


def gpu_target(arch: int = 90, sms: int = 132) -> None:
    """From here on, Triton compiles for ``arch`` and scankit picks the launch configuration
    (tiles, warps, chunking for ``sms`` SMs) of that GPU, on CPU tensors, in this process."""
    driver.set_active(_TargetOnly(arch))
    from scankit.triton import affine, common, elementwise, givens

    for module in (common, elementwise, affine, givens):
        if hasattr(module, "on_gpu"):
            module.on_gpu = lambda device: True
    common._sm_count = lambda index: sms
    torch.cuda.current_device = lambda: 0


def compile_instead_of_launching(seen=None) -> None:
    """From here on a Triton launch (``JITFunction.run``) binds and compiles its kernel for the
    target and runs nothing (``warmup``); ``seen(jit_function, compiled, args, kwargs)``, when
    given, is called with each compiled kernel. A compiled kernel's launcher is a no-op, so
    scankit's bound launches (``common._launch_bound``) run nothing either."""
    run = JITFunction.run

    def compile_only(self, *args, **kwargs):
        kwargs["warmup"] = True
        compiled = run(self, *args, **kwargs)
        if compiled._run is None:  # (loading it would need the GPU)
            compiled._run = lambda *values: None
        if seen is not None:
            seen(self, compiled, args, kwargs)
        return compiled

    JITFunction.run = compile_only


def _shape_classes():
    """(label, op, args, kwargs) per op, form and shape class: "wide" fills the GPU with
    (batch x tiles) programs (one pass), "narrow" does not (T-chunked / look-back), "short"
    is a block op below the 2x2 kernels' minimum T; fp32, plus bf16 at "wide" (the rotations:
    bf16 at both)."""
    g = torch.Generator().manual_seed(0)
    r = lambda *s, dtype=torch.float32: torch.rand(*s, generator=g).to(dtype)  # noqa: E731
    for cls, (B, T, D) in {"wide": (64, 64, 512), "narrow": (1, 4096, 64)}.items():
        for dtype in (torch.float32, torch.bfloat16) if cls == "wide" else (torch.float32,):
            a, b, h0 = r(B, T, D, dtype=dtype), r(B, T, D, dtype=dtype), r(B, D, dtype=dtype)
            yield f"linear_scan {cls} {dtype}", "linear_scan", (a, b), {}
            yield f"linear_scan state h0 {cls} {dtype}", "linear_scan", (a, b), dict(h0=h0, return_prefix=False)
            yield f"parallel_scan_log {cls} {dtype}", "parallel_scan_log", (a.log().neg(), r(B, T + 1, D, dtype=dtype)), {}
            yield f"parallel_scan_log log_h0 {cls} {dtype}", "parallel_scan_log", (a.log().neg(), b), dict(log_h0=h0)
            gate_hidden, proj = r(B, T, 2 * D, dtype=dtype), r(B, T, 3 * D, dtype=dtype)  # the gates (GATE)
            yield f"mingru_scan {cls} {dtype}", "mingru_scan", (gate_hidden,), {}
            yield f"mingru_scan h0 {cls} {dtype}", "mingru_scan", (gate_hidden,), dict(h0=h0)
            for coupled in (False, True):
                yield f"signed_mingru_scan coupled={coupled} h0 {cls} {dtype}", "signed_mingru_scan", (proj,), \
                    dict(h0=h0, coupled=coupled)
            if dtype == torch.float32:  # the kernels' reversed time (REV)
                yield f"linear_scan reverse {cls}", "linear_scan", (a, b), dict(reverse=True)
                yield f"linear_scan state h0 reverse {cls}", "linear_scan", (a, b), \
                    dict(h0=h0, return_prefix=False, reverse=True)
                yield f"parallel_scan_log reverse {cls}", "parallel_scan_log", (a.log().neg(), b), \
                    dict(log_h0=h0, reverse=True)
                yield f"parallel_scan_log slot 0 reverse {cls}", "parallel_scan_log", \
                    (a.log().neg(), r(B, T + 1, D, dtype=dtype)), dict(reverse=True)
            if cls == "narrow":  # packed sequences (B = 1): the kernels' in-place resets
                reset = (torch.arange(T) % 700 == 0).to(torch.int8)
                for reverse in (False, True):
                    yield f"linear_scan state packed reverse={reverse}", "linear_scan", (a, b), \
                        dict(return_prefix=False, reverse=reverse, reset=reset)
                    yield f"parallel_scan_log packed reverse={reverse}", "parallel_scan_log", (a.log().neg(), b), \
                        dict(log_h0=h0, reverse=reverse, reset=reset)
    for cls, (B, T, n) in {"wide": (64, 512, 64), "narrow": (1, 4096, 4), "short": (8, 64, 8)}.items():
        M, x, h = r(B, T, n, 2, 2), r(B, T, n, 2), r(B, n, 2)
        yield f"matrix_scan {cls}", "matrix_scan", (M, x), {}
        yield f"matrix_scan state h0 {cls}", "matrix_scan", (M, x), dict(h0=h, return_prefix=False)
        yield f"matrix_scan reverse {cls}", "matrix_scan", (M, x), dict(reverse=True)  # the kernels' REV
        yield f"matrix_scan state h0 reverse {cls}", "matrix_scan", (M, x), dict(h0=h, return_prefix=False, reverse=True)
        for k, v in ((4, 2), (8, 1), (16, 16), (3, 3), (6, 5)):  # (3, 3), (6, 5): tiles padded
            A, Bm, h = r(B, T, n, k, k), r(B, T, n, k, v), r(B, n, k, v)
            yield f"matrix_affine_scan k{k} v{v} {cls}", "matrix_affine_scan", (A, Bm), {}
            yield f"matrix_affine_scan k{k} v{v} state h0 {cls}", "matrix_affine_scan", (A, Bm), dict(h0=h, return_prefix=False)
            if k == 4:
                yield f"matrix_affine_scan k{k} v{v} reverse {cls}", "matrix_affine_scan", (A, Bm), dict(reverse=True)
                yield f"matrix_affine_scan k{k} v{v} state h0 reverse {cls}", "matrix_affine_scan", (A, Bm), \
                    dict(h0=h, return_prefix=False, reverse=True)
    # the angle-fused rotations: T-chunked (few lanes, long T: summary passes) and in one walk
    for cls, (B, T, n) in {"narrow": (1, 4096, 8), "wide": (64, 64, 64)}.items():
        for k, dtype in itertools.product((2, 4, 8, 16), (torch.float32, torch.bfloat16)):
            R = 2
            yield f"rotation_scan k{k} {cls} {dtype}", "rotation_scan", \
                (r(B, T, n, R, k // 2, dtype=dtype), r(B, T, n, k, dtype=dtype)), \
                dict(scale=r(B, T, n, dtype=dtype) if k == 2 else None, gamma=r(B, T, n, dtype=dtype), h0=r(B, n, k, dtype=dtype))


def resources(cubin: bytes) -> tuple[int, int]:
    """(registers per thread, local memory bytes per thread: spills and stack) of a kernel's cubin."""
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([str(tool), "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
    found = re.search(r"REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)", text)
    if found is None:
        raise RuntimeError(f"cuobjdump -res-usage gave no resource line: {text[-200:]}")
    regs, stack, local = map(int, found.groups())
    return regs, stack + local


def codegen(ptx: str) -> dict:
    """What a specialization's PTX does with memory and lanes: global stores and loads by width
    (scalar: one element a lane; vector: .v2 / .v4), cp.async copies (global -> shared, the
    pipelined loads) by bytes, lane shuffles, barriers and shared-memory stores. Scalar stores or
    loads where a tile's rows are contiguous, or shuffles in a scan meant to stay in one thread,
    are what to look at
    (session 22: a gated backward's stores went scalar, a bf16 tile split its rows over lanes)."""
    counts = dict(st_scalar=0, st_vector=0, ld_scalar=0, ld_vector=0, cp_async_16=0, cp_async_small=0,
                  shfl=len(re.findall(r"\bshfl\.", ptx)), bar=len(re.findall(r"\bbar\.sync\b", ptx)),
                  st_shared=len(re.findall(r"\bst\.shared\b", ptx)))
    for op, modifiers in re.findall(r"\b(st|ld)\.global(\S*)", ptx):  # e.g. ld.global.L1::evict_last.v4.b32
        counts[f"{op}_{'vector' if re.search(r'[.]v[248][.]', modifiers + '.') else 'scalar'}"] += 1
    for size in re.findall(r"cp\.async\.c[ag]\.shared\.global(?:\.[a-zA-Z0-9:]+)*\s*\[[^]]+\],\s*\[[^]]+\],\s*(0x[0-9a-f]+|\d+)",
                           ptx):
        counts["cp_async_16" if int(size, 0) == 16 else "cp_async_small"] += 1
    return counts


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, default=90, help="compute capability x 10 (90: H100/H200)")
    ap.add_argument("--sms", type=int, default=132, help="SM count the launch geometry aims at")
    ap.add_argument("--resources", action="store_true", help="registers and local memory (spills) per kernel")
    ap.add_argument("--codegen", action="store_true",
                    help="per specialization: global loads / stores scalar or vector, cp.async widths, shuffles")
    args = ap.parse_args()

    import scankit.triton as kernels
    from scankit.triton import affine, common, elementwise, givens

    gpu_target(args.arch, args.sms)
    compiled = {}  # kernel (module.name) -> {its distinct compiled specializations: (registers, local bytes)}
    code = {}  # (kernel, specialization) -> (shape class, its tile meta and input dtype, codegen counts)
    now = {}

    def record(self, kernel, a, kw):
        assert "cubin" in kernel.asm, f"{self.__name__}: no cubin"
        name = f"{self.fn.__module__.rsplit('.', 1)[-1]}.{self.__name__}"
        if id(kernel) not in compiled.setdefault(name, {}):
            compiled[name][id(kernel)] = resources(kernel.asm["cubin"]) if args.resources else None
            if args.codegen:
                dtype = next((str(x.dtype)[6:] for x in a if isinstance(x, torch.Tensor)), "-")
                tile = " ".join(f"{k}={v}" for k, v in kw.items() if k.startswith("BLOCK") or k in (
                    "num_warps", "GATE", "SUMMARY"))
                code[name, id(kernel)] = (now["label"], f"{dtype} {tile}", codegen(kernel.asm["ptx"]))

    compile_instead_of_launching(record)
    # every look-back setting (common.LOOKBACK["linear"]): "off" sends narrow linear scans
    # down the chunked kernels, whose prefix-gradient variant the default never launches
    for mode in dict.fromkeys((common.LOOKBACK["linear"], "off", "always")):
        common.LOOKBACK["linear"] = mode
        for label, op, xs, kw in _shape_classes():
            now["label"] = f"{label} (look-back {mode})"
            xs = [x.requires_grad_(True) for x in xs]
            try:
                out = getattr(kernels, op)(*xs, **kw)
                outs = out if isinstance(out, tuple) else (out,)
                torch.autograd.backward(outs, [torch.zeros_like(o) for o in outs])
            except (triton.compiler.errors.CompilationError, RuntimeError) as exc:  # RuntimeError: an MLIR pass failed
                print(f"FAILED {label} (look-back {mode}): {exc}", file=sys.stderr)
                return 1
    defined = {f"{m.__name__.rsplit('.', 1)[-1]}.{name}" for m in (elementwise, affine, givens)
               for name, f in vars(m).items() if isinstance(f, JITFunction) and name.endswith("_kernel")}
    if defined - compiled.keys():  # a kernel no shape class reaches is not checked: say so
        print(f"FAILED: no shape class launched {sorted(defined - compiled.keys())}", file=sys.stderr)
        return 1
    width = max(map(len, compiled))
    for name, kernels_ in sorted(compiled.items()):
        row = f"{name:<{width}}  {len(kernels_):3d} specializations"
        if args.resources:
            regs = [r for r, _ in kernels_.values()]
            spills = [local for _, local in kernels_.values() if local]
            row += f"  registers {min(regs)}-{max(regs)}"
            if spills:
                row += f"  {len(spills)} with local memory (up to {max(spills)} B: spills, stack)"
        print(row)
    if args.codegen:  # the specializations with scalar global accesses or lane shuffles, one line each
        print("\nscalar global stores / loads, lane shuffles and barriers per specialization (PTX; first shape class):")
        for (name, _), (label, meta, c) in sorted(code.items(), key=lambda item: item[0][0]):
            if c["st_scalar"] or c["ld_scalar"] or c["shfl"]:
                print(f"  {name:<{width}}  {meta:<52}  st {c['st_scalar']} scalar / {c['st_vector']} vector"
                      f"  ld {c['ld_scalar']} / {c['ld_vector']}  cp.async {c['cp_async_16']} x16B /"
                      f" {c['cp_async_small']} smaller  shfl {c['shfl']}  bar {c['bar']}  [{label}]")
    total = sum(map(len, compiled.values()))
    print(f"all {total} specializations of {len(compiled)} kernels compiled for sm_{args.arch} (triton {triton.__version__})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
