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


def target_programs(device: torch.device) -> int:
    """Programs needed to keep the device busy (4 per SM; a handful in the interpreter)."""
    if on_gpu(device):
        return 4 * _sm_count(device.index if device.index is not None else torch.cuda.current_device())
    return 4


# (BLOCK_T, BLOCK_D, num_warps) of the elementwise kernels on the GPU, from the H200
# sweep of scripts/tune_elementwise.py (NOTES.md): the log kernel's exps favour shorter tiles.
ELEMENTWISE_TILES = {"linear": (64, 32, 4), "log": (32, 32, 4)}


def tiles(device: torch.device, log: bool = False) -> tuple[int, int, int]:
    """(BLOCK_T, BLOCK_D, num_warps) of the elementwise kernels (small tiles in the interpreter)."""
    return ELEMENTWISE_TILES["log" if log else "linear"] if on_gpu(device) else (16, 32, 1)


def num_chunks(programs: int, T: int, min_chunk: int, device: torch.device) -> int:
    """How many T-chunks so that programs x chunks fills the device (chunks >= 2 x min_chunk long)."""
    want = -(-target_programs(device) // programs)
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
