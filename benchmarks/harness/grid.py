"""The benchmark grid as plain data (no torch import): shapes, op and mixer names, impls,
directions, skip rules. ``cases`` builds the torch side of the registry on top of it; the
asv suites import only this, so their many small processes start fast."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Shape:
    """A named benchmark shape: batch B, length T, elementwise width D, matrix width d."""

    name: str
    B: int
    T: int
    D: int
    d: int


SHAPES = {
    s.name: s
    for s in (
        Shape("lab", B=128, T=64, D=64, d=64),
        Shape("longT", B=16, T=1024, D=64, d=64),
        Shape("large", B=32, T=4096, D=1024, d=256),
        Shape("vlong", B=1, T=65536, D=1024, d=256),
    )
}
# linear_scan's state-only form (h from h_0 = 0, no running product): the peers' common ground
STATE_OP = "linear_scan_state"
OP_NAMES = ("parallel_scan_log", "linear_scan", STATE_OP, "matrix_scan", "matrix_affine_scan")
IMPLS = ("triton", "eager", "torch_compile")
# Peer libraries on STATE_OP (benchmarks.harness.peers), optional, timed beside triton
PEERS = ("accelerated_scan", "accelerated_scan_native", "fla_chunk_hgrn", "torch_associative_scan")
# Scaling: B = 1, D = 1024, T = 2^10 .. 2^20, forward, triton
SCALING_OPS = (STATE_OP, "parallel_scan_log")
SCALING_LOG2T = tuple(range(10, 21))
SCALING_B, SCALING_D = 1, 1024
DIRECTIONS = ("fwd", "fwdbwd")
# Issue 16's roofline cells (benchmarks.bench_roofline.Roofline): STATE_OP from h_0 = 0 at the
# (B, T, D) of its table, scankit's kernels on (B, T, D) beside accelerated-scan on its own
# (B, D, T) layout, fp32 and bf16, device time (% of copy: bytes / the run's copy bandwidth)
ROOFLINE_SHAPES = {"32x4096x1024": (32, 4096, 1024), "1x65536x1024": (1, 65536, 1024),
                   "1x1048576x1024": (1, 2 ** 20, 1024), "16x2048x512": (16, 2048, 512), "8x512x256": (8, 512, 256)}
ROOFLINE_IMPLS = ("triton", "accelerated_scan_native")
ROOFLINE_DTYPES = ("fp32", "bf16")
# Issue 16's cliff sweep (benchmarks.bench_roofline.Cliffs): STATE_OP's fp32 forward from h_0 = 0,
# triton, device time, over B x D x T where the inputs (a and b) hold at least CLIFF_MIN_BYTES;
# bar: every cell at CLIFF_BAR % of copy or more (a heatmap in the roofline artifact)
CLIFF_B = (1, 2, 5, 8, 32)
CLIFF_D = (64, 768, 1024, 3000)
CLIFF_T = (1000, 4096, 7777, 65536)
CLIFF_MIN_BYTES = 64 * 2 ** 20
CLIFF_BAR = 70


def cliff_shapes() -> dict:
    """{"BxTxD": (B, T, D)} of the cliff sweep, B-major, then D, then T."""
    return {f"{B}x{T}x{D}": (B, T, D) for B in CLIFF_B for D in CLIFF_D for T in CLIFF_T
            if 2 * 4 * B * T * D >= CLIFF_MIN_BYTES}


def cliff_bytes(B: int, T: int, D: int) -> int:
    """What a cliff cell must move: read a and b, write h, fp32."""
    return 3 * 4 * B * T * D


# Issue 17's block widths (benchmarks.bench_roofline.BlockWidths): matrix_affine_scan's states-only
# form (h from h_0 = 0, what the mixers call) with k x k transitions and v columns per block,
# n = d // k blocks (a state of d rows per column) at BLOCK_SHAPES; triton, device time and bytes
BLOCK_WIDTHS = {"k4v1": (4, 1), "k8v1": (8, 1), "k16v1": (16, 1), "k16v16": (16, 16)}
BLOCK_SHAPES = ("large", "vlong")
# Call forms (benchmarks.bench_scans.CallForms): each op's state form at one packed-size shape,
# dense beside reverse=True and cu_seqlens= (PACKED_SEQUENCES sequences of seeded random lengths
# 1 .. 2 * FORMS_SHAPE.T / PACKED_SEQUENCES summing to T), the inputs stored time-last (dim=2),
# and the packed sequences looped over one call each; triton, device time
FORM_OPS = ("parallel_scan_log", STATE_OP, "matrix_scan", "matrix_affine_scan")
FORMS = ("dense", "reverse", "packed", "time_last", "looped")
FORMS_SHAPE = Shape("forms", B=1, T=2 ** 18, D=256, d=64)
PACKED_SEQUENCES = 64
# The page this project grew from (shared seed, "Run the benchmarks"): Triton fwd+bwd speedup
# over the eager reference on an NVIDIA L4 at its two shapes, lab and longT; issue 15 asks the
# H200 for at least these, and 3x for parallel_scan_log (the seed's was 0.70x / 0.80x).
SEED_SPEEDUPS = {("matrix_scan", "longT"): 168.53, ("matrix_scan", "lab"): 94.20,
                 ("matrix_affine_scan", "longT"): 53.56, ("matrix_affine_scan", "lab"): 38.89,
                 ("linear_scan", "longT"): 4.64, ("linear_scan", "lab"): 3.01,
                 ("parallel_scan_log", "longT"): 3.0, ("parallel_scan_log", "lab"): 3.0}
PARITY_DIRECTIONS = ("fwd", "grad")
MIXER_LABELS = ("GivensMinGRU(k=8,R=3)", "GivensMinGRU(k=4,R=2,decay)", "GivensMinGRU(k=16,R=1)",
                "RotationMinGRU", "RotationMinGRU(snap,decay)")
MEMORY_MIXER = "GivensMinGRU(k=8,R=3)"
MEMORY_SHAPES = ("lab", "longT")
MIXER_PATHS = ("generic", "kernel")
# How the timed quantities are measured (``measure.device_time`` / ``call_latency``): change it
# when the method changes. asv hashes a benchmark's own file, not the harness, so the suites
# carry VERSION as each timed benchmark's explicit ``version``.
METHOD = "device_time: n calls queued behind a GPU sleep, CUDA events; call_latency: wall clock of n back-to-back calls + sync"
VERSION = "2:" + METHOD
# call_latency alone since the harness stopped writing MINGRU_SCAN around every timed call
# (~2.5 us a call, in the triton cells' latency only: their device time never saw it)
LATENCY_VERSION = "3:" + METHOD + "; MINGRU_SCAN set once per measurement"
LAUNCHES_VERSION = "launches: CUDA kernels, memsets and memcpys of one call in a torch.profiler trace"
COPY_VERSION = "TB/s"  # track_copy_bandwidth's unit and version (the runs before it recorded bytes/s)


def skip_reason(op_name: str, shape: str, impl: str):
    """Why a benchmark cell is not measured (None when it is)."""
    matrix = op_name in ("matrix_scan", "matrix_affine_scan")
    if matrix and shape == "vlong" and impl != "triton":
        return "eager doubling at T=65536 needs tens of GiB and minutes"
    if matrix and shape != "lab" and impl == "torch_compile":
        return "compiling the doubling reference at this T takes minutes"
    return None
# Whole layers as users train them (benchmarks.bench_mixers.Layers, issue 19): one training step
# of a minGRU-family layer, (B, T, width), scankit's on the kernels ("kernel") beside the same
# layer in plain torch (benchmarks.harness.layers.PLAIN) eager and under torch.compile, and
# torch.nn.GRU (cuDNN) of the same width (one set of cells for every mixer); fp32 and bf16
# autocast. Only "kernel" measures the commit: the others are reference cells, measured once
# per machine and torch.
LAYER_MIXERS = ("MinGRU", "SignedMinGRU", "RotationMinGRU", "GivensMinGRU")
LAYER_SHAPES = {"8x512x256": (8, 512, 256), "64x256x512": (64, 256, 512), "16x2048x512": (16, 2048, 512),
                "32x4096x1024": (32, 4096, 1024), "4x16384x1024": (4, 16384, 1024)}
LAYER_IMPLS = ("kernel", "plain_eager", "plain_compile", "cudnn_gru")
LAYER_DTYPES = ("fp32", "bf16")


LAYER_BLOCKS = {"RotationMinGRU": 2, "GivensMinGRU": 8}  # k of the block mixers' k x k transitions
PLAIN_DOUBLING_GIB = 48  # what a plain block layer's doubling scan may keep for its backward


def layer_skip_reason(mixer: str, shape: str, impl: str):
    """Why a layer cell is not measured (None when it is): a plain block layer's doubling keeps
    ~2 (B, T, d/k, k, k) fp32 tensors per step, log2 T steps, for its backward."""
    k = LAYER_BLOCKS.get(mixer)
    if k is None or impl not in ("plain_eager", "plain_compile"):
        return None
    B, T, d = LAYER_SHAPES[shape]
    saved = 2 * B * T * d * k * 4 * max(1, (T - 1).bit_length()) / 2**30
    if saved > PLAIN_DOUBLING_GIB:
        return f"the plain doubling scan keeps ~{saved:.0f} GiB for its backward (> {PLAIN_DOUBLING_GIB})"
    return None


# A whole model (benchmarks.bench_mixers.Stacks, issue 19): one training step of a
# scankit.MinGRUStack with one block of each mixer (pre-norm residual blocks with MLPs) on the
# kernels, eagerly and under torch.compile (inductor) with the kernels inside as custom ops.
# Both measure the commit.
STACK_MIXERS = ("mingru", "signed", "rotation", "givens")
STACK_SHAPES = {"16x2048x512": (16, 2048, 512)}
STACK_IMPLS = ("kernel", "kernel_compile")

