"""Replay the inductor compile test of one mixer or op on a GPU over many seeds, in one
process: which seeds fail, at which (batch, step) the forward goes wrong, and the inductor
output code of the first failing case (for a bug report or a fix).

    python scripts/repro_compile.py RotationMinGRU --mode dynamic --seeds 2377553823 --random 8 \\
        --code $OUT/code.py [--inductor shape_padding=False]
"""
import argparse
import ast
import os
import sys

import torch
import torch._inductor.config
from torch._inductor.utils import run_and_get_code

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]
from oracles import poison_cuda_cache  # noqa: E402
from test_compile import MIXERS, MODES  # noqa: E402  the test's own cases


def case(mixer: str, mode: str, seed: int, want_code: bool, poison: bool, mark_t: bool = False):
    """The test body for one seed: per T, the (b, t) cells whose forward is off, and the code."""
    torch.manual_seed(seed)
    module = MIXERS[mixer][0]().cuda()
    torch._dynamo.reset()
    compiled = torch.compile(module, fullgraph=True, **MODES[mode])
    params = list(module.parameters())
    report, code = [], []
    for T in (13, 257):
        x = torch.randn(4, T, 5, device="cuda")
        kwargs = {"delta_t": torch.rand(4, T, device="cuda")} if module.decay is not None else {}
        if mark_t:  # T alone dynamic, as automatic dynamic shapes (or their on-disk profile) make it
            torch._dynamo.mark_dynamic(x, 1)
            for v in kwargs.values():
                torch._dynamo.mark_dynamic(v, 1)
        if poison:
            poison_cuda_cache()

        def step():
            out = compiled(x, **kwargs)
            return out, torch.autograd.grad(out.square().sum(), params)
        (out, grads), sources = run_and_get_code(step) if want_code else (step(), [])
        code += sources
        ref = module(x, **kwargs)
        err = (out - ref).abs().amax(-1)                       # (B, T)
        bad = (~(err <= 1e-4 + 1e-4 * ref.abs().amax(-1))).nonzero().tolist()  # NaN counts as off
        ref_grads = torch.autograd.grad(ref.square().sum(), params)
        gerr = max(((g - r).abs().max() / r.abs().max().clamp_min(1e-30)).nan_to_num(float("inf")).item()
                   for g, r in zip(grads, ref_grads))
        first = {}
        for b, t in bad:
            first[b] = min(first.get(b, t), t)
        report.append(dict(T=T, bad_cells=len(bad), first_bad_step_per_batch=first, fwd_max_err=err.max().item(),
                           grad_max_rel_err=gerr))
    return report, code


def stride_order_only():
    """Inductor as it would compile a graph whose Triton-kernel nodes carry no eager_input_vals
    (then ``constrain_to_fx_strides``: stride order, not exact strides) with padding wherever it
    may: if the kernels' traced stride arguments then disagree with the buffers, the forward
    goes wrong in batch rows >= 1, as in the session 17 failure."""
    inductor = torch._inductor.config

    def drop(graph):
        for node in graph.nodes:
            if "triton_kernel_wrapper" in str(node.target):
                node.meta.pop("eager_input_vals", None)

    inductor.post_grad_custom_pre_pass = drop
    inductor.comprehensive_padding = True
    inductor.padding_stride_threshold = 32
    inductor.force_disable_caches = True


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mixer", choices=list(MIXERS))
    ap.add_argument("--mode", choices=list(MODES), default="dynamic")
    ap.add_argument("--seeds", type=int, nargs="*", default=[])
    ap.add_argument("--random", type=int, default=4, help="fresh random seeds to add")
    ap.add_argument("--poison", action="store_true", help="NaN in the allocator's free blocks before each call")
    ap.add_argument("--mark-t", action="store_true", help="mark T (dim 1) dynamic, B static")
    ap.add_argument("--stride-order-only", action="store_true", help="the hypothesis of NOTES.md session 17: "
                    "inductor keeps only the stride *order* of a user Triton kernel's tensors where a node has lost "
                    "its eager_input_vals (exact strides otherwise), and may then pad them; this drops them from every "
                    "kernel node (a post-grad pass) and pads every stride over 32 elements")
    ap.add_argument("--inductor", action="append", default=[], metavar="KEY=VALUE",
                    help="set torch._inductor.config.KEY (a Python literal), e.g. shape_padding=False")
    ap.add_argument("--code", help="write the inductor code of the first failing case (else the first case) here")
    args = ap.parse_args()
    if args.stride_order_only:
        stride_order_only()
    for setting in args.inductor:
        key, value = setting.split("=", 1)
        setattr(torch._inductor.config, key, ast.literal_eval(value))
    seeds = args.seeds + [int.from_bytes(os.urandom(4), "little") for _ in range(args.random)]
    os.environ["MINGRU_SCAN"] = "triton"
    failed = 0
    for seed in seeds:
        try:
            report, code = case(args.mixer, args.mode, seed, want_code=bool(args.code) and not failed,
                                poison=args.poison, mark_t=args.mark_t)
        except Exception as exc:  # an inductor assertion (e.g. a stale stride) counts as a failed seed
            print(f"{args.mixer} {args.mode} seed={seed}: FAIL {type(exc).__name__}: {str(exc).splitlines()[0]}")
            failed += 1
            continue
        bad = any(r["bad_cells"] or r["grad_max_rel_err"] > 1e-3 for r in report)
        print(f"{args.mixer} {args.mode} seed={seed}: {'FAIL' if bad else 'ok'} {report}", flush=True)
        if (bad or seed == seeds[0]) and not failed and args.code:  # the first case's, then a failure's
            with open(args.code, "w") as f:
                f.write(f"# {args.mixer} {args.mode} seed={seed}\n" + "\n\n# ----- next graph -----\n".join(code))
        failed += bad
    print(f"{failed} of {len(seeds)} seeds failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
