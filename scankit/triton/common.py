"""Launch geometry and the kernels' envelope, shared by every scan kernel."""
import functools

import torch

from ..dispatch import ScanFallback

KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
KERNEL_KV = (1, 2, 4, 8, 16)


def on_gpu(device: torch.device) -> bool:
    return device.type == "cuda"


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


# Programs per SM that keep the device busy, per kernel family (H200 sweep, NOTES.md): the
# block kernels carry a long serial chain per step, so they want many more resident lanes.
PROGRAMS_PER_SM = {"elementwise": 4, "affine": 4}


def target_programs(device: torch.device, family: str = "elementwise") -> int:
    """Programs needed to keep the device busy (a handful in the interpreter)."""
    if on_gpu(device):
        sms = _sm_count(device.index if device.index is not None else torch.cuda.current_device())
        return PROGRAMS_PER_SM[family] * sms
    return 4


# (BLOCK_T, BLOCK_D, num_warps) of the elementwise kernels on the GPU, from the H200
# sweeps (scripts/tune_scans.py, NOTES.md): the log kernel's exps favour shorter tiles.
ELEMENTWISE_TILES = {"linear": (64, 32, 4), "log": (32, 32, 4)}
# software-pipelining depth of their tile loop (None: Triton's default, no forced pipelining)
ELEMENTWISE_STAGES = None


def tiles(device: torch.device, log: bool = False) -> tuple[int, int, int]:
    """(BLOCK_T, BLOCK_D, num_warps) of the elementwise kernels (small tiles in the interpreter)."""
    return ELEMENTWISE_TILES["log" if log else "linear"] if on_gpu(device) else (16, 32, 1)


def num_chunks(programs: int, T: int, min_chunk: int, device: torch.device, family: str = "elementwise") -> int:
    """How many T-chunks so that programs x chunks fills the device (chunks >= 2 x min_chunk long)."""
    want = -(-target_programs(device, family) // programs)
    return max(1, min(want, -(-T // (2 * min_chunk))))


def check_envelope(op: str, *tensors, kv=None) -> None:
    """Raise ScanFallback when these inputs are outside the kernels' envelope."""
    for x in tensors:
        if x is None:
            continue
        if x.dtype not in KERNEL_DTYPES:
            raise ScanFallback(f"{op}: kernels take float32/bfloat16/float16, got {x.dtype}")
        if x.device.type not in ("cuda", "cpu"):
            raise ScanFallback(f"{op}: kernels run on CUDA (or the CPU interpreter), got {x.device}")
    if kv is not None and any(s not in KERNEL_KV for s in kv):
        raise ScanFallback(f"{op}: kernels take k, v in {KERNEL_KV}, got k, v = {kv}")


def empty_like_shape(shape, like: torch.Tensor) -> torch.Tensor:
    """A contiguous empty tensor of ``shape`` with ``like``'s dtype and device (fake impls)."""
    return torch.empty(shape, dtype=like.dtype, device=like.device)


def register_prefix_scan_autograd(fwd_op, bwd_op) -> None:
    """Autograd of an affine scan op ``fwd(coeffs, inputs, h0, return_prefix) -> (prefix, states)``
    through ``bwd(coeffs, h0, prefix, states, g_prefix, g_states) -> (d_coeffs, d_inputs, d_h0)``.

    With ``return_prefix`` the prefix output is real and h0 unused; without it the prefix is
    an empty placeholder and the states start from h0."""

    def setup(ctx, inputs, output):
        coeffs, _, h0, return_prefix = inputs
        ctx.return_prefix = return_prefix
        ctx.has_h0 = h0 is not None and not return_prefix
        ctx.save_for_backward(coeffs, h0 if ctx.has_h0 else None, *output)

    def backward(ctx, g_prefix, g_states):
        coeffs, h0, prefix, states = ctx.saved_tensors
        if g_states is None:
            g_states = torch.zeros_like(states)
        if ctx.return_prefix:
            g_prefix = g_prefix if g_prefix is not None else torch.zeros_like(prefix)
        else:
            g_prefix = None
        d_coeffs, d_inputs, d_h0 = bwd_op(coeffs, h0, prefix, states, g_prefix, g_states)
        return d_coeffs, d_inputs, (d_h0 if ctx.has_h0 else None), None

    fwd_op.register_autograd(backward, setup_context=setup)
