"""Launch geometry, the kernels' envelope, and the custom-op / autograd wiring shared by
every scan kernel."""
import functools
import threading
from typing import Optional

import torch
from triton import knobs
from triton.runtime.driver import driver
from triton.runtime.jit import JITFunction

from ..dispatch import ScanFallback

KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
KERNEL_MAX_KV = 16  # k, v up to it (tiles padded to powers of two)


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for launch geometry (``triton.cdiv`` is a ConstexprFunction in Triton 3.6:
    ~6 us per host call, several per launch)."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (host-side ``triton.next_power_of_2``, without its overhead)."""
    return 1 << max(0, n - 1).bit_length()


def on_gpu(device: torch.device) -> bool:
    return device.type == "cuda"


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


class Knobs(dict):
    """A table of launch knobs (tiles, warps, chunking; ``scripts/tune_scans.py`` sweeps them):
    a dict whose every change bumps ``Knobs.version``, so that no launch plan made under other
    values is reused (``plan``)."""
    version = 0

    def _changed(self):
        Knobs.version += 1

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        self._changed()

    def __delitem__(self, key):
        super().__delitem__(key)
        self._changed()

    def update(self, *args, **kwargs):
        super().update(*args, **kwargs)
        self._changed()

    def clear(self):
        super().clear()
        self._changed()

    def pop(self, *args):
        self._changed()
        return super().pop(*args)

    def popitem(self):
        self._changed()
        return super().popitem()

    def setdefault(self, key, default=None):
        self._changed()
        return super().setdefault(key, default)


# Programs per SM that keep the device busy, per kernel family (tune_scans.py sweeps them;
# H200 runs 7 and 10: more per SM helped neither family at `large`, NOTES.md).
PROGRAMS_PER_SM = Knobs({"elementwise": 4, "affine": 4})


def target_programs(device: torch.device, family: str = "elementwise", per_sm: Optional[int] = None) -> int:
    """Programs needed to keep the device busy (a handful in the interpreter)."""
    if on_gpu(device):
        sms = _sm_count(device.index if device.index is not None else torch.cuda.current_device())
        return (per_sm or PROGRAMS_PER_SM[family]) * sms
    return 4


# T-chunking costs a summary pass (a second read of the inputs), two more launches and the
# carry ops (host time). "min_tiles": chunk only when one program would otherwise walk at
# least this many tiles of T (a short walk costs less than the extra launches);
# "programs_per_sm": once chunking, aim at this many programs per SM (None: the family's
# PROGRAMS_PER_SM). tune_scans' chunking and lookback sections sweep them: 16 programs per SM
# once chunked took the log op's vlong fwd from 685 to 529 us (run 14), without touching
# `large`, which fills the GPU unchunked.
CHUNKING = Knobs({"min_tiles": 0, "programs_per_sm": 16})


# (BLOCK_T, BLOCK_D, num_warps) of the elementwise kernels on the GPU, from the H200
# sweeps (scripts/tune_scans.py, NOTES.md): the log kernel's exps favour shorter tiles.
ELEMENTWISE_TILES = Knobs({"linear": (64, 32, 4), "log": (32, 32, 4)})
# software-pipelining depth of their tile loop per (kind, pass) (None: Triton's default) where
# the rows take 16-byte loads (``rows_aligned``); the H200 sweep (run 7) favoured 3 stages for
# the log kernel and for both backwards. Elsewhere unpipelined: the pipeline's copies are then
# 4-byte cp.async, one a column (H100, tune_scans --sections unaligned, session 40: at (32, 4096,
# 1000) fp32 the state's fwd+bwd 4350 -> 1823 us unpipelined, 2 stages 4300; the log op's fwd
# 2451 -> 731, fwd+bwd 8251 -> 2237; (8, 7777, 3000) state fwd+bwd 6124 -> 2677; while at
# D = 1024 the same tiles' backward gained from its 3 stages: fwd+bwd 1617 against 1703)
ELEMENTWISE_STAGES = Knobs({("linear", "fwd"): None, ("linear", "bwd"): 3, ("log", "fwd"): 3, ("log", "bwd"): 3})
ALIGN = 16  # elements: the kernels' integer arguments Triton specializes as multiples of 16


# Which elementwise kernels take 16-byte loads on rows of 16 bytes whose D (or a stride, an offset)
# is no multiple of ALIGN (D = 1000 in fp32), by writing D and the strides as multiples of VEC
# (``row_vector``); the others keep scalar loads there, unpipelined (``stages``). H100, ab_trees,
# session 41 (device time, VEC / scalar): the linear tiles and walk gain ((32, 4096, 1000) state fwd
# 731 -> 585 us, fwd+bwd 1812 -> 1596; (8, 7777, 3000) fwd 1031 -> 869, fwd+bwd 2659 -> 2399),
# the log op's tiles lose (fwd 737 -> 787, fwd+bwd 2242 -> 2316: at 3 stages) and so does the
# forward look-back at B = 1 ((1, 65536, 1000): 364 -> 376).
VECTOR_ROWS = Knobs({"linear": True, "log": False, "lookback": False})


def row_vector(D: int, *tensors, kind: str = "linear") -> int:
    """How the ``kind`` elementwise kernels' rows over (B, T, D) ``tensors`` (None skipped) take
    16-byte loads: 1 where D and every tensor's time and batch strides and storage offset are
    multiples of ALIGN (Triton proves the 16 bytes from its own specialization of those
    arguments); else, where ``VECTOR_ROWS[kind]``, VEC, the elements of 16 bytes in the narrowest
    dtype, where all of them are multiples of it (the kernels then write D and the strides as
    multiples of VEC: ``elementwise._rows``; D = 1000 in fp32); else 0 (no 16-byte loads; also
    without unit D stride). Shapes and strides only: fake tensors (torch.compile) too."""
    tensors = [x for x in tensors if x is not None]
    if any(x.stride(2) != 1 for x in tensors):
        return 0
    values = [D, *(v for x in tensors for v in (x.stride(0), x.stride(1), x.storage_offset()))]
    if all(v % ALIGN == 0 for v in values):
        return 1
    vec = 16 // min((x.element_size() for x in tensors), default=4)
    return vec if VECTOR_ROWS[kind] and all(v % vec == 0 for v in values) else 0


def rows_aligned(D: int, *tensors, kind: str = "linear") -> bool:
    """Whether the ``kind`` kernels' rows of (B, T, D) ``tensors`` take 16-byte loads (``row_vector``)."""
    return row_vector(D, *tensors, kind=kind) > 0


def stages(log: bool, pass_: str, D: int, *tensors):
    """Pipelining depth of the elementwise tile loop for the log or linear kernel's fwd / bwd pass
    over ``tensors`` (``ELEMENTWISE_STAGES`` where their rows take 16-byte loads, else None)."""
    kind = "log" if log else "linear"
    return ELEMENTWISE_STAGES[kind, pass_] if rows_aligned(D, *tensors, kind=kind) else None


def tiles(device: torch.device, log: bool = False) -> tuple[int, int, int]:
    """(BLOCK_T, BLOCK_D, num_warps) of the elementwise kernels (small tiles in the interpreter)."""
    return ELEMENTWISE_TILES["log" if log else "linear"] if on_gpu(device) else (16, 32, 1)


# The linear recurrence's walking tile on the GPU where every row is 16-byte aligned: one warp
# per 128 columns, each lane 4 adjacent fp32 columns of every row, so the tile's T-scan and its
# carry stay in one thread (no shuffles, no barriers: the (64, 32, 4) tiles cross 4 lanes and 4
# warps), 16-byte loads, and the tile loop software-pipelined ("stages" per pass: without it
# the large state fwd took 650 us, with 3 stages 401). In 2-byte dtypes Triton's 16-byte loads
# give a lane 8 columns, so a row spans two lanes (threads [2, 16]) and the T-scan shuffles
# between them; measured, that still beats a (8, 256) tile where a lane keeps its rows (H200,
# session 16: bf16 large state fwd 257 against 325 us, fwd+bwd 735 against 940: half the
# programs). It walks where B x D/128 programs reach "programs_per_sm" x SMs, per pass; fewer
# go to the look-back tiles. H200 sweeps (tune_scans --sections roofline, NOTES.md session 16):
# large state fwd 482 -> 401 us (95% of copy), fwd+bwd 1257 -> 1107; at (B, 4096, 1024) the
# forward walks faster from B = 8 (64 programs) on, the backward from B = 24 (192; at 128 the
# look-back's was 593 against 421 us). Not the log op: with its exps the one-warp walk is
# issue-bound (large fwd 496 -> 963 us), and not the gated scans (``elementwise.gated_scan``)
# for the same reason: the gates' exps and divisions in one warp. H100, tune_scans --sections
# gated, session 22: minGRU fp32 at (16, 2048, 512), 64 programs, fwd 589 us walking against 177
# on the tiles, fwd+bwd 852 against 430; at 256 programs (fp32 (64, 256, 512)) the fwd was even
# (79 / 75), the fwd+bwd 283 against 168. "gates": whether the gated scans may walk (the sweep's
# "walk" path sets it).
# "two_byte": the aim's factor per pass for 2-byte dtypes, whose walking program keeps half the
# bytes of an fp32 one in flight. H100, tune_scans --sections few (session 38): bf16 forwards
# of 64 programs walked at 28% of copy ((16, 2048, 512): 120 us) where the look-back tiles take
# 68 us (1.77x; (8, 4096, 1024) 1.85x, fwd+bwd 1.34-1.38x); at 128 programs ((16, 4096, 1024))
# the walk still wins (tiles 0.95x). The backward's aim stays: doubled (session 39), bf16
# fwd+bwd at (B, 4096, 1024) went 1.04x faster at B = 24 and 1.12x slower at B = 32.
IN_THREAD = Knobs({"tile": (16, 128, 1), "stages": Knobs({"fwd": 4, "bwd": 3}),
                  "programs_per_sm": Knobs({"fwd": 0.45, "bwd": 1.25}),
                  "two_byte": Knobs({"fwd": 2.0, "bwd": 1.0}), "gates": False})


def in_thread_walk(device: torch.device, B: int, D: int, pass_: str, *tensors) -> bool:
    """Whether a linear recurrence over (B, T, D) ``tensors`` (None skipped; the first is the
    input, whose dtype sets the aim) walks in the in-thread tiles (``IN_THREAD``): on the GPU,
    with enough programs for the pass (in 2-byte dtypes ``two_byte`` times as many), D at least
    one tile wide (narrower, lanes would idle: those shapes keep their measured tiles), and rows
    that take 16-byte loads (``rows_aligned``)."""
    block_d = IN_THREAD["tile"][1]
    per_sm = IN_THREAD["programs_per_sm"][pass_]
    if tensors and tensors[0] is not None and tensors[0].element_size() < 4:
        per_sm *= IN_THREAD["two_byte"][pass_]
    if not on_gpu(device) or D < block_d or B * cdiv(D, block_d) < target_programs(device, per_sm=per_sm):
        return False
    return rows_aligned(D, *tensors)


def num_chunks(programs: int, T: int, min_chunk: int, device: torch.device, family: str = "elementwise",
               per_sm: Optional[int] = None) -> int:
    """How many T-chunks so that programs x chunks fills the device (chunks >= 2 x min_chunk
    long); 1 when the programs fill it already or the walk is short (``CHUNKING``). ``per_sm``:
    a kernel's own programs-per-SM aim, for both tests (else the family's, then CHUNKING's)."""
    if programs >= target_programs(device, family, per_sm) or cdiv(T, min_chunk) < CHUNKING["min_tiles"]:
        return 1
    want = cdiv(target_programs(device, family, per_sm or CHUNKING["programs_per_sm"]), programs)
    return max(1, min(want, cdiv(T, 2 * min_chunk)))


# The single-pass linear-recurrence kernels with decoupled look-back
# (elementwise._fwd/_bwd_lookback_kernel): one tile per program, no summary pass. "linear":
# "off" (chunked summary passes), "chunked" (look-back where the T-chunked path would run) or
# "always"; "tile": their GPU (BLOCK_T, BLOCK_D, num_warps). "window": predecessors read per
# look-back step; "prefix_every": 1 (tests raise it so that look-backs compose aggregates,
# which the interpreter's in-order programs never need). From tune_scans' lookback section
# (H200 runs 13-14, NOTES.md session 4): single-tile programs lose to the walking kernel where
# it fills the GPU (large: 918 against 510 us), win where it would chunk (longT, vlong, B = 1)
# with (128, 32, 4) tiles (state vlong fwd 563 -> 433 us). The log op, with its exps (and
# its state carried in log space), stays on the chunked passes.
# Session 16's sweeps: one-warp look-back tiles lose (4-8x the tickets and look-backs), and a
# window of 1 beats 16 (vlong state fwd 421 -> 327 us, fwd+bwd 949 -> 767; 2 and 4 in between).
# A tile's (window, BLOCK_D) status words must sit in each warp whole or in no two warps
# (``lookback_tiles`` checks): replicas that several warps load at different instants can see a
# word before and after its publication, and a reduction across warps then mixes their
# decisions (H100, session 38: (128, 64, 4) at window 1, two warps a replica in its TTGIR, gave
# wrong states, 1e-3 to 0.6 relative; the interpreter's in-order programs never show it).
LOOKBACK = Knobs({"linear": "chunked", "tile": (128, 32, 4), "window": 1, "prefix_every": 1})


def use_lookback(chunks: int) -> bool:
    """Whether a linear scan that the chunked path would split into ``chunks`` runs single-pass."""
    mode = LOOKBACK["linear"]
    return mode == "always" or (mode == "chunked" and chunks > 1)


# Look-back status words, kept between calls: the kernels leave them reusable (the last
# ticket resets the count and starts a new epoch; a word of an older epoch reads as
# unpublished), so a call costs no memset. Epochs count modulo EPOCHS (the kernels' mask);
# the host zeroes a buffer each time its calls come round to it, so no word of an older
# epoch can ever match.
EPOCHS = 1 << 29
_STATUS: dict = {}


def status_words(device: torch.device, n: int) -> torch.Tensor:
    """int64 (1 + n,) look-back words: the ticket word, then ``n`` status words. Eager calls
    share one buffer per (device, stream), whose launches the stream orders; the custom ops'
    calls (compiled graphs) and CUDA-graph captures get a zeroed buffer of their own (its fill
    is in the graph)."""
    cuda = device.type == "cuda"
    if not getattr(_launching, "direct", False) or (cuda and torch.cuda.is_current_stream_capturing()):
        return torch.zeros(1 + n, device=device, dtype=torch.int64)
    key = (device, torch.cuda.current_stream(device).stream_id if cuda else None)
    entry = _STATUS.get(key)
    if entry is None or entry[0].numel() < 1 + n:
        entry = _STATUS[key] = [torch.zeros(max(1 + n, 2 * entry[0].numel() if entry else 0), device=device,
                                            dtype=torch.int64), 0]
    elif entry[1] % EPOCHS == 0:
        entry[0].zero_()
    entry[1] += 1
    return entry[0]


def lookback_tiles(device: torch.device) -> tuple[int, int, int]:
    """(BLOCK_T, BLOCK_D, num_warps) of the look-back kernels; on the GPU a ValueError for a tile
    whose look-back words would be split over warps as replicas (``LOOKBACK``'s comment)."""
    if not on_gpu(device):
        return tiles(device)
    block_t, block_d, warps = LOOKBACK["tile"]
    words = LOOKBACK["window"] * block_d
    if 32 < words < 32 * warps:
        raise ValueError(f"common.LOOKBACK: tile {tuple(LOOKBACK['tile'])} at window {LOOKBACK['window']} reads "
                         f"{words} status words a step, spread over some of its {warps} warps as replicas; "
                         f"expected at most 32 (a warp each) or at least 32 x warps = {32 * warps}")
    return block_t, block_d, warps


def check_envelope(op: str, *tensors, kv=None) -> None:
    """Raise ScanFallback when these inputs are outside the kernels' envelope."""
    for x in tensors:
        if x is None:
            continue
        if x.dtype not in KERNEL_DTYPES:
            raise ScanFallback(f"{op}: kernels take float32/bfloat16/float16, got {x.dtype}")
        if not (x.is_cuda or x.is_cpu):  # (properties: ``x.device.type`` builds a device first)
            raise ScanFallback(f"{op}: kernels run on CUDA (or the CPU interpreter), got {x.device}")
    if kv is not None and not all(1 <= s <= KERNEL_MAX_KV for s in kv):
        raise ScanFallback(f"{op}: kernels take k, v in 1..{KERNEL_MAX_KV}, got k, v = {kv}")


def empty_like_shape(shape, like: torch.Tensor) -> torch.Tensor:
    """A contiguous empty tensor of ``shape`` with ``like``'s dtype and device (fake impls)."""
    return torch.empty(shape, dtype=like.dtype, device=like.device)


# Offsets reach 2^31 in tensors of 2^31 elements (4 GiB of bf16: B=8, T=32k, D=8k): the
# kernels then index in int64 (their ``I64`` specialization); below it int32, as fast as before.
INT32_LIMIT = 2**31


def _span(t: torch.Tensor) -> int:
    """1 + the largest element offset of ``t`` (its storage footprint)."""
    return 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride())) if t.numel() else 0


def needs_int64(*tensors) -> bool:
    """Whether an element offset into any of ``tensors`` (None skipped) can reach 2^31
    (a contiguous tensor's span is its numel: two C calls instead of a walk over strides)."""
    return any(t is not None and (t.numel() if t.is_contiguous() else _span(t)) >= INT32_LIMIT for t in tensors)


# Fused multiply-adds on, as measured (Triton 3.9 warns that its default flips in 3.10).
FP_FUSION = True
_launching = threading.local()


# CUDA's limit on a grid's y dimension (x takes 2^31 - 1 programs)
GRID_Y = 65535


def launch(kernel, grid, *args, **meta):
    """``kernel[grid](*args, **meta)``, bound once per specialization (``_launch_bound``).
    Every launch runs on real tensors: the custom ops are opaque to torch.compile
    (``opaque_op``), which never traces into a launch. A 2-D grid (programs, lane tiles) is
    folded into x where its y would pass GRID_Y; such kernels take ``FOLD`` (``lang.program``). Unfolded, the kernels keep the grid their
    launch knobs were measured with (the fold's index arithmetic changes register counts,
    hence programs per SM)."""
    if len(grid) == 2:
        meta["FOLD"] = grid[1] > GRID_Y
        grid = (grid[0] * grid[1],) if meta["FOLD"] else grid
    if isinstance(kernel, JITFunction):
        _launch_bound(kernel, grid, args, meta)
    else:  # the interpreter's kernels
        kernel[grid](*args, enable_fp_fusion=FP_FUSION, **meta)


_LAUNCH = launch  # the unwatched launch (``Slot`` checks that nobody replaced it)


# Launches bound once per specialization. Triton's JITFunction.run binds every argument on
# every call (~12 us for a 20-argument kernel on a desktop CPU, more on a server's): here the
# key is every scalar exactly, each tensor's dtype and address mod 16, the grid, the launch
# options and the device, which determines everything Triton specializes on (a superset of its
# key), so a repeated call goes straight to the compiled kernel's launcher (~3 us of key).
_BOUND: dict = {}
BOUND_ENTRIES = 4096  # then start afresh (a process cycling through that many shapes)


# argument types that are no tensor (tested first: ``isinstance(x, torch.Tensor)`` goes through
# the tensor metaclass's Python-level instance check, ~0.2 us an argument)
_SCALARS = frozenset({int, bool, float, type(None)})


def _bound_key(kernel, grid, args, meta):
    # the kernel by identity (the entry keeps it, and a hit checks it is the same object):
    # hashing a JITFunction computes its cache key
    return (id(kernel), grid, FP_FUSION, knobs.runtime.debug, knobs.compilation.instrumentation_mode,
            torch.cuda.current_device(), tuple(meta.items()),
            tuple([a if a.__class__ in _SCALARS else (a.dtype, a.data_ptr() & 15) if isinstance(a, torch.Tensor)
                   else a for a in args]))


def _hooks_watch(kernel) -> bool:
    """Whether Triton's launch hooks or ``kernel``'s pre-run hooks would run (a profiler
    watches launches): then Triton's own launch path. An empty HookChain counts as none
    (Triton 3.6 passes its empty chains to every launch; the launcher then calls nothing)."""
    runtime = knobs.runtime
    enter, leave = runtime.launch_enter_hook, runtime.launch_exit_hook
    return (enter is not None and bool(getattr(enter, "calls", True))) \
        or (leave is not None and bool(getattr(leave, "calls", True))) or bool(kernel.pre_run_hooks)


def _bind(kernel, grid, args, meta):
    """Launch ``kernel[grid](*args, **meta)`` through Triton (binds, compiles); returns its
    compiled kernel and the trailing arguments (defaults, constexprs) its launcher takes after ``args``."""
    compiled = kernel[grid](*args, enable_fp_fusion=FP_FUSION, **meta)
    if hasattr(compiled, "result"):
        compiled = compiled.result()
    return compiled, tuple(meta[p.name] if p.name in meta else p.default for p in kernel.params[len(args):])


def _launch_compiled(compiled, xyz, device, args, tail):
    """The compiled kernel's launcher called directly on the grid ``xyz`` (no binding)."""
    compiled.run(*xyz, driver.active.get_current_stream(device), compiled.function, compiled.packed_metadata,
                 None, None, None, *args, *tail)


def _launch_bound(kernel, grid, args, meta):
    """``kernel[grid](*args, **meta)``, through the bound launch when one exists."""
    if _hooks_watch(kernel):
        kernel[grid](*args, enable_fp_fusion=FP_FUSION, **meta)
        return
    key = _bound_key(kernel, grid, args, meta)
    bound = _BOUND.get(key)
    if bound is None or bound[3] is not kernel:
        compiled, tail = _bind(kernel, grid, args, meta)
        if len(_BOUND) >= BOUND_ENTRIES:
            _BOUND.clear()
        _BOUND[key] = compiled, tail, (*grid, 1, 1)[:3], kernel
        return
    compiled, tail, xyz, _ = bound
    _launch_compiled(compiled, xyz, key[5], args, tail)


# Launch plans: what a kernel wrapper derives from its inputs' metadata alone (geometry,
# chunking, the kernels, their grids, constexprs and scalar arguments), kept per key (shapes,
# strides, dtypes, device, 16-byte alignments, flags and ``plan_epoch()``), so that a repeated
# call only allocates and launches, each launch through a ``Slot`` bound once.
_PLANS: dict = {}
PLAN_ENTRIES = 4096  # then start afresh


def plan_epoch() -> tuple:
    """What a plan depends on besides its inputs: the knobs' version, the compile options, the
    grid limit, the current device and the GPU probes (tests and the CPU compile harness swap
    them)."""
    return (Knobs.version, FP_FUSION, knobs.runtime.debug, knobs.compilation.instrumentation_mode, GRID_Y,
            on_gpu, _sm_count,  # (a CUDA tensor has initialised CUDA; is_available() would query the driver)
            torch.cuda.current_device() if torch.cuda.is_initialized() else -1)


def planned(key, make):
    """The plan under ``key`` (made by ``make()`` the first time)."""
    found = _PLANS.get(key)
    if found is None:
        if len(_PLANS) >= PLAN_ENTRIES:
            _PLANS.clear()
        found = _PLANS[key] = make()
    return found


def forget_plans() -> None:
    _PLANS.clear()


def align(t) -> int:
    """A plan key's view of a tensor's address (None: no tensor): what Triton specializes on."""
    return -1 if t is None else t.data_ptr() & 15


class Slot:
    """One launch of a plan: ``kernel`` on ``grid`` with the constexprs ``meta``. The plan's key
    fixes everything Triton specializes on, so the compiled kernel is bound at the first call and
    later calls go straight to its launcher (no argument binding, no key). A watched launch (a
    recorder in place of ``launch``, a profiler's hooks) and the interpreter's go through
    ``launch`` as any other."""
    __slots__ = ("kernel", "grid", "meta", "compiled", "tail", "xyz", "binding")

    def __init__(self, kernel, grid, **meta):
        self.kernel, self.grid, self.meta, self.compiled = kernel, grid, meta, None
        bind = dict(meta)
        if len(grid) == 2:  # as ``launch`` folds it
            bind["FOLD"] = grid[1] > GRID_Y
            grid = (grid[0] * grid[1],) if bind["FOLD"] else grid
        self.binding, self.xyz = (grid, bind), (*grid, 1, 1)[:3]

    def __call__(self, *args):
        kernel = self.kernel
        if launch is not _LAUNCH or not isinstance(kernel, JITFunction) or _hooks_watch(kernel):  # watched
            launch(kernel, self.grid, *args, **self.meta)
        elif self.compiled is None:
            grid, meta = self.binding
            self.compiled, self.tail = _bind(kernel, grid, args, meta)
        else:
            _launch_compiled(self.compiled, self.xyz, torch.cuda.current_device(), args, self.tail)


class direct:
    """Eager calls on real tensors: inside ``with direct():`` the look-back kernels share one
    status buffer per stream (``status_words``) and autograd's Eager path is taken. (A class,
    not a generator context manager: a third of the cost, on every call.)"""
    __slots__ = ("before",)

    def __enter__(self):
        self.before = getattr(_launching, "direct", False)
        _launching.direct = True

    def __exit__(self, *exc):
        _launching.direct = self.before


_PLAIN = frozenset({torch.Tensor, torch.nn.Parameter})  # tensors that never mean tracing (tested before isinstance)


def opaque_op(name: str, impl):
    """``impl`` registered as the custom op ``name``, opaque to torch.compile: inductor calls it
    on the real tensors of the compiled graph (its launches read those tensors' strides then),
    instead of tracing the launches into the graph with the strides of trace time (a
    ``triton_op``). Traced, a kernel's strides became constants that inductor had to keep its
    buffers to; where it kept only their order and padded a buffer, the kernel read the wrong
    rows (``scripts/repro_compile.py --stride-order-only``: wrong grads, NOTES.md session 18).
    The body runs outside ``direct``: its look-back status words are a zeroed buffer of its
    own, never the shared one (a CUDA-graph tree warms a graph up in its memory pool, where a
    cached buffer would be a live allocation the graph does not own)."""
    return torch.library.custom_op(name, mutates_args=())(impl)


def traced(args) -> bool:
    """Whether these arguments are being traced rather than computed: torch.compile or
    export (their fake and functional tensors), jit.trace, or any tensor subclass. Traced
    calls go through the registered custom ops; real tensors take the direct path."""
    return _call_kind(args) is None


_TRACED, _NO_GRAD, _GRAD = None, 0, 1


def _call_kind(args):
    """``_TRACED`` (``traced``), else ``_GRAD`` where grad mode is on and a tensor among ``args``
    requires grad, else ``_NO_GRAD``: one walk over the arguments (a call's host cost)."""
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return _TRACED
    grad = False
    for a in args:
        cls = a.__class__
        if cls in _PLAIN:
            grad = grad or a.requires_grad
        elif cls not in _SCALARS and isinstance(a, torch.Tensor):
            return _TRACED
    return _GRAD if grad and torch.is_grad_enabled() else _NO_GRAD


def either(op, impl):
    """Call the registered custom ``op`` when its arguments are traced and its Python body
    ``impl`` with direct launches otherwise: the custom-op dispatch layers cost ~0.25 ms of
    host time per call (H200 profile, NOTES.md), more than the kernels take at small shapes."""
    def call(*args):
        if traced(args):
            return op(*args)
        with direct():
            return impl(*args)
    return call


class _FirstOrderOnly(torch.autograd.Function):
    """``grad`` as an output of ``deps``, whose derivative raises: a kernel's first derivative
    taken with create_graph=True, so that a second one fails instead of dropping terms."""

    @staticmethod
    def forward(ctx, grad, *deps):
        return grad.clone()

    @staticmethod
    def backward(ctx, *_):
        raise RuntimeError("scankit: the Triton kernels' backward is not differentiable (no second derivatives); "
                           "MINGRU_SCAN=eager runs the eager references, which have them")


def with_autograd(op, impl, setup, backward):
    """Register ``backward`` / ``setup`` as ``op``'s autograd and return the callable the
    entry points use: ``op`` on traced arguments, otherwise a plain autograd.Function
    running ``impl`` with the same setup and backward (no custom-op dispatch), or ``impl``
    alone when no argument requires grad (grad mode on). ``backward``
    reaches its kernels through ``either``, so it runs the backward op wherever it is traced
    (AOTAutograd traces it with fake tensors). The kernels' backward is not itself
    differentiable: a double backward through it raises instead of dropping terms."""
    op.register_autograd(backward, setup_context=setup)

    class Eager(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *inputs):
            ctx.set_materialize_grads(False)  # unused outputs' grads arrive as None, as for the op
            with direct():
                output = impl(*inputs)
            setup(ctx, inputs, output)
            return output

        @staticmethod
        def backward(ctx, *grads):
            if not torch.is_grad_enabled():  # the engine's usual mode (no create_graph)
                return backward(ctx, *grads)
            with torch.no_grad():
                out = backward(ctx, *grads)
            # create_graph=True: these grads depend on the inputs and the incoming grads, but
            # the kernels' backward records no graph; mark them so that differentiating raises
            deps = [t for t in (*ctx.saved_tensors, *grads) if isinstance(t, torch.Tensor) and t.requires_grad]
            return tuple(g if g is None or not deps else _FirstOrderOnly.apply(g, *deps) for g in out)

    Eager.__name__ = Eager.__qualname__ = f"{op._name.split('::')[-1]}_eager"

    def call(*args):
        kind = _call_kind(args)
        if kind is _TRACED:
            return op(*args)
        if kind == _GRAD:
            return Eager.apply(*args)
        with direct():  # nothing to differentiate: the kernels without autograd.Function's ~5 us
            return impl(*args)
    return call


def prefix_scan_op(name: str, forward, backward):
    """The custom ops ``scankit::{name}_fwd`` / ``_bwd`` of an affine scan (fake impls and
    autograd included) and the callable the entry points use.

    ``forward(coeffs, inputs, h0, return_prefix, reverse, reset) -> (prefix or None, states)``;
    ``backward(coeffs, h0, prefix, states, g_prefix, g_states, reverse, reset) -> (d_coeffs, d_inputs, d_h0 or None)``
    (``reverse``: the scan runs from the end of time; ``reset``: None, or int8 (T,) flags of the
    rows where a packed sequence's scan begins).
    """
    def fwd_direct(coeffs, inputs, h0, return_prefix, reverse, reset):
        """(prefix or None, states): the eager calls' body (no placeholder to allocate)."""
        return forward(coeffs, inputs, h0 if not return_prefix else None, return_prefix, reverse, reset)

    def fwd(coeffs: torch.Tensor, inputs: torch.Tensor, h0: Optional[torch.Tensor],
            return_prefix: bool, reverse: bool, reset: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        prefix, states = fwd_direct(coeffs, inputs, h0, return_prefix, reverse, reset)
        return (prefix if prefix is not None else states.new_empty(0)), states

    def bwd(coeffs: torch.Tensor, h0: Optional[torch.Tensor], prefix: torch.Tensor, states: torch.Tensor,
            g_prefix: Optional[torch.Tensor], g_states: torch.Tensor, reverse: bool,
            reset: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        d_coeffs, d_inputs, d_h0 = backward(coeffs, h0, prefix, states, g_prefix, g_states, reverse, reset)
        return d_coeffs, d_inputs, (d_h0 if d_h0 is not None else coeffs.new_empty(0))

    fwd_op = opaque_op(f"scankit::{name}_fwd", fwd)
    bwd_op = opaque_op(f"scankit::{name}_bwd", bwd)
    fwd_op.register_fake(lambda coeffs, inputs, h0, return_prefix, reverse, reset: (
        empty_like_shape(coeffs.shape if return_prefix else (0,), coeffs), empty_like_shape(inputs.shape, inputs)))
    bwd_op.register_fake(lambda coeffs, h0, prefix, states, g_prefix, g_states, reverse, reset: (
        empty_like_shape(coeffs.shape, coeffs), empty_like_shape(states.shape, coeffs),
        empty_like_shape(h0.shape if h0 is not None else (0,), coeffs)))
    return prefix_scan_autograd(fwd_op, fwd_direct, bwd_op, bwd)


def prefix_scan_autograd(fwd_op, fwd_impl, bwd_op, bwd_impl):
    """Autograd of an affine scan op ``fwd(coeffs, inputs, h0, return_prefix, reverse, reset) -> (prefix, states)``
    through ``bwd(coeffs, h0, prefix, states, g_prefix, g_states, reverse, reset) -> (d_coeffs, d_inputs, d_h0)``;
    returns the callable of ``with_autograd``.

    With ``return_prefix`` the prefix output is real and h0 unused; without it the prefix is
    an empty placeholder (the custom op's; None in eager calls) and the states start from h0."""
    bwd = either(bwd_op, bwd_impl)

    def setup(ctx, inputs, output):
        coeffs, _, h0, return_prefix, ctx.reverse, reset = inputs
        ctx.return_prefix = return_prefix
        ctx.has_h0 = h0 is not None and not return_prefix
        ctx.save_for_backward(coeffs, h0 if ctx.has_h0 else None, reset, *output)

    def backward(ctx, g_prefix, g_states):
        coeffs, h0, reset, prefix, states = ctx.saved_tensors
        if g_states is None:
            g_states = torch.zeros_like(states)
        if ctx.return_prefix:
            g_prefix = g_prefix if g_prefix is not None else torch.zeros_like(prefix)
        else:
            g_prefix = None
        d_coeffs, d_inputs, d_h0 = bwd(coeffs, h0, prefix, states, g_prefix, g_states, ctx.reverse, reset)
        return d_coeffs, d_inputs, (d_h0 if ctx.has_h0 else None), None, None, None

    return with_autograd(fwd_op, fwd_impl, setup, backward)
