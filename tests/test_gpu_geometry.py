"""The elementwise kernels with the GPU's launch configuration (tiles, warps, pipelining, look-back
window, walking or look-back by program count), on a pretend 4-SM GPU: through the interpreter
on the CPU, on the real device on a GPU. The in-thread walking tiles (``common.IN_THREAD``: one
warp, 128 columns, the T-scan in one thread) and the look-back tiles against the float64 loop,
forward and gradients, with h0, reversed and packed, on odd T and partly masked column tiles."""
import itertools

import pytest
import torch

from benchmarks.harness.cases import OPS
from oracles import affine_loop

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SMS = 4  # in-thread walking from 0.45 x 4 = 1.8 programs forward, 1.25 x 4 = 5 backward


@pytest.fixture
def gpu_config(monkeypatch):
    """Launches as on a GPU of SMS multiprocessors; returns the list of (kernel, meta) launched."""
    from scankit.triton import common

    monkeypatch.setattr(common, "on_gpu", lambda device: True)
    monkeypatch.setattr(common, "_sm_count", lambda index: SMS)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setenv("MINGRU_SCAN", "triton")
    seen = []
    launch = common.launch

    def recording(kernel, grid, *args, **meta):
        seen.append((kernel.fn.__name__, dict(meta)))
        return launch(kernel, grid, *args, **meta)

    monkeypatch.setattr(common, "launch", recording)
    return seen


def _walked(seen, name):
    from scankit.triton import common

    block_t, block_d, warps = common.IN_THREAD["tile"]
    return [m for k, m in seen if k == name and m["BLOCK_D"] == block_d and m["num_warps"] == warps
            and m["BLOCK_T"] == block_t]


def _loop(a, b, h0, reverse, cu):
    """States of h_t = a_t h_{t-1} + b_t per packed sequence (float64), h0 (N, D) per sequence."""
    if cu is None:
        return affine_loop(a, b, h0=h0, elementwise=True, reverse=reverse)[2]
    parts = [affine_loop(a[:, s:e], b[:, s:e], h0=None if h0 is None else h0[i:i + 1], elementwise=True,
                         reverse=reverse)[2] for i, (s, e) in enumerate(zip(cu[:-1], cu[1:]))]
    return torch.cat(parts, 1)


@pytest.mark.parametrize("T", [1, 13, 257])
@pytest.mark.parametrize("form", ["prefix", "state", "state h0", "state h0 reverse"])
@pytest.mark.parametrize("D", [208, 200])
def test_in_thread_walking_tiles_against_the_loop(D, form, T, seed, gpu_config):
    """B x D/128 = 6 programs: both passes walk in the in-thread tiles; D = 208 leaves the second
    column tile 48 columns masked; D = 200 (no multiple of 16, of 4: 16-byte rows in fp32) 56,
    its D and strides written as multiples of 4 in the kernels (``VEC``)."""
    import scankit

    B = 3
    a, b = OPS["linear_scan"].inputs(dict(B=B, T=T, D=D), device=DEVICE, seed=seed)
    a, b = a.requires_grad_(), b.requires_grad_()
    reverse = "reverse" in form
    h0 = torch.randn(B, D, device=DEVICE, requires_grad=True) if "h0" in form else None
    leaves = [a, b] + ([h0] if h0 is not None else [])
    ref_leaves = [x.detach().double().cpu().requires_grad_() for x in leaves]
    if form == "prefix":
        outs = scankit.linear_scan(a, b)
        A, Bc, _ = affine_loop(*ref_leaves, elementwise=True)
        refs = (A, Bc)
    else:
        outs = (scankit.linear_scan(a, b, h0=h0, return_prefix=False, reverse=reverse),)
        refs = (_loop(*ref_leaves[:2], ref_leaves[2] if h0 is not None else None, reverse, None),)
    for o, r in zip(outs, refs):
        torch.testing.assert_close(o.detach().cpu().double(), r.detach(), atol=1e-5, rtol=1e-5)
    ws = [torch.randn(r.shape, dtype=torch.float64) for r in refs]
    grads = torch.autograd.grad(sum((o * w.to(o)).sum() for o, w in zip(outs, ws)), leaves)
    ref_grads = torch.autograd.grad(sum((r * w).sum() for r, w in zip(refs, ws)), ref_leaves)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g.cpu().double(), r, atol=1e-4, rtol=1e-5)
    assert _walked(gpu_config, "_fwd_kernel") and _walked(gpu_config, "_bwd_kernel"), gpu_config
    assert not {k for k, _ in gpu_config} & {"_fwd_lookback_kernel", "_bwd_lookback_kernel"}, gpu_config
    assert {m["VEC"] for _, m in gpu_config} == {1 if D % 16 == 0 else 4}, gpu_config


@pytest.mark.parametrize("T", [1, 13, 257])
@pytest.mark.parametrize("gate", ["mingru", "signed coupled"])
def test_gated_scans_keep_to_the_tiles(gate, T, seed, gpu_config):
    """The gated scans never walk in the in-thread tiles (``common.IN_THREAD``: their exps in one
    warp lost 2-3x on the H100), even at a shape where linear_scan walks both passes: the
    projection (3, T, n x 208), operand blocks 208 columns apart, h0; states and grads against
    the loop."""
    import scankit
    from scankit.triton import common
    from oracles import mingru_loop, signed_loop

    B, D, n = 3, 208, 2 if gate == "mingru" else 3
    g = torch.Generator().manual_seed(seed)
    p = (torch.randn(B, T, n * D, generator=g) * 2).to(DEVICE).requires_grad_()
    h0 = torch.rand(B, D, generator=g).to(DEVICE).requires_grad_()
    if gate == "mingru":
        h, loop = scankit.mingru_scan(p, h0=h0), mingru_loop
    else:
        h, loop = scankit.signed_mingru_scan(p, h0=h0, coupled=True), lambda *x: signed_loop(*x, coupled=True)
    ref_leaves = [x.detach().double().cpu().requires_grad_() for x in (p, h0)]
    ref = loop(*ref_leaves)
    torch.testing.assert_close(h.detach().cpu().double(), ref.detach(), atol=1e-5, rtol=1e-5)
    w = torch.randn(ref.shape, dtype=torch.float64)
    for got, want in zip(torch.autograd.grad((h * w.to(h)).sum(), (p, h0)), torch.autograd.grad((ref * w).sum(), ref_leaves)):
        torch.testing.assert_close(got.cpu().double(), want, atol=1e-4, rtol=1e-5)
    assert all(common.in_thread_walk(torch.device("cuda", 0), B, D, pass_, p[..., :D]) for pass_ in ("fwd", "bwd"))
    gated = [(k, m) for k, m in gpu_config if m.get("GATE")]
    assert {k for k, _ in gated} & {"_fwd_kernel", "_fwd_lookback_kernel"}, gpu_config
    assert {k for k, _ in gated} & {"_bwd_kernel", "_bwd_lookback_kernel"}, gpu_config
    assert not _walked(gated, "_fwd_kernel") and not _walked(gated, "_bwd_kernel"), gpu_config


@pytest.mark.parametrize("T", [1, 13, 257])
@pytest.mark.parametrize("form", ["prefix", "state h0"])
def test_two_byte_inputs_walk_in_thread(form, T, seed, gpu_config):
    """bf16 walks the in-thread tiles too (a lane's 8 columns: each row over two lanes, the
    T-scan shuffling between them, ``common.IN_THREAD``); D = 272 leaves the third column tile
    112 columns masked, B x 3 = 9 programs walk both passes; a and b views of one (B, T, 2D)
    tensor. Against the float64 loop of the same bf16 inputs, to bf16's rounding, outputs and
    grads."""
    import scankit

    B, D = 3, 272
    g = torch.Generator().manual_seed(seed)
    x = torch.cat([torch.rand(B, T, D, generator=g) * 0.5 + 0.5, torch.randn(B, T, D, generator=g)], -1)
    x = x.to(torch.bfloat16).to(DEVICE).requires_grad_()
    h0 = torch.rand(B, D, generator=g).to(torch.bfloat16).to(DEVICE).requires_grad_()
    a, b = x[..., :D], x[..., D:]
    ref_x, ref_h0 = (t.detach().double().cpu().requires_grad_() for t in (x, h0))
    if form == "prefix":
        outs, leaves, ref_leaves = scankit.linear_scan(a, b), (x,), (ref_x,)
        refs = affine_loop(ref_x[..., :D], ref_x[..., D:], elementwise=True)[:2]
    else:
        outs = (scankit.linear_scan(a, b, h0=h0, return_prefix=False),)
        leaves, ref_leaves = (x, h0), (ref_x, ref_h0)
        refs = (_loop(ref_x[..., :D], ref_x[..., D:], ref_h0, False, None),)
    assert all(o.dtype == torch.bfloat16 for o in outs)
    for o, r in zip(outs, refs):
        torch.testing.assert_close(o.detach().cpu().double(), r.detach(), atol=2e-2 * (r.abs().max().item() + 1),
                                   rtol=2e-2)
    ws = [torch.randn(r.shape, dtype=torch.float64) for r in refs]
    got = torch.autograd.grad(sum((o.double() * w.to(DEVICE)).sum() for o, w in zip(outs, ws)), leaves)
    want = torch.autograd.grad(sum((r * w).sum() for r, w in zip(refs, ws)), ref_leaves)
    for gr, wr in zip(got, want):
        torch.testing.assert_close(gr.cpu().double(), wr, atol=3e-2 * (wr.abs().max().item() + 1), rtol=3e-2)
    assert _walked(gpu_config, "_fwd_kernel") and _walked(gpu_config, "_bwd_kernel"), gpu_config
    assert not {k for k, _ in gpu_config} & {"_fwd_lookback_kernel", "_bwd_lookback_kernel"}, gpu_config
    assert {m["VEC"] for _, m in gpu_config} == {1 if D % 16 == 0 else 4}, gpu_config


def test_packed_sequences_walk_in_thread(seed, gpu_config):
    """B = 1 packed sequences, D = 640 (5 programs): resets in the in-thread tiles, with h0 and
    gradients, against one loop per sequence."""
    import scankit

    D = 640
    cu = [0, 1, 14, 14 + 100, 14 + 100 + 43]
    a, b = OPS["linear_scan"].inputs(dict(B=1, T=cu[-1], D=D), device=DEVICE, seed=seed)
    a, b = a.requires_grad_(), b.requires_grad_()
    h0 = torch.randn(len(cu) - 1, D, device=DEVICE, requires_grad=True)
    h = scankit.linear_scan(a, b, h0=h0, return_prefix=False, cu_seqlens=torch.tensor(cu, device=DEVICE))
    ref_leaves = [x.detach().double().cpu().requires_grad_() for x in (a, b, h0)]
    ref = _loop(*ref_leaves, False, cu)
    torch.testing.assert_close(h.detach().cpu().double(), ref.detach(), atol=1e-5, rtol=1e-5)
    w = torch.randn(ref.shape, dtype=torch.float64)
    for g, r in zip(torch.autograd.grad((h * w.to(h)).sum(), (a, b, h0)), torch.autograd.grad((ref * w).sum(), ref_leaves)):
        torch.testing.assert_close(g.cpu().double(), r, atol=1e-4, rtol=1e-5)
    assert _walked(gpu_config, "_fwd_kernel") and _walked(gpu_config, "_bwd_kernel"), gpu_config


@pytest.mark.parametrize("D", [64, 202, 120])
def test_narrow_or_unaligned_calls_keep_the_look_back_tiles(D, seed, gpu_config):
    """Too few programs (B = 1, D = 64: one) or rows that cannot take 16-byte loads (D = 202: 808
    bytes, no multiple of 16): the look-back kernels with the GPU's (128, 32, 4) tiles and window,
    T = 300 in 3 tiles, against the loop; rows of 480 bytes (D = 120, narrower than the walk's tile)
    keep their scalar loads there (``common.VECTOR_ROWS``: VEC 1)."""
    from scankit.triton import common

    import scankit

    a, b = OPS["linear_scan"].inputs(dict(B=1, T=300, D=D), device=DEVICE, seed=seed)
    a, b = a.requires_grad_(), b.requires_grad_()
    h = scankit.linear_scan(a, b, return_prefix=False)
    ref_leaves = [x.detach().double().cpu().requires_grad_() for x in (a, b)]
    ref = _loop(*ref_leaves, None, False, None)
    torch.testing.assert_close(h.detach().cpu().double(), ref.detach(), atol=1e-5, rtol=1e-5)
    w = torch.randn(ref.shape, dtype=torch.float64)
    for g, r in zip(torch.autograd.grad((h * w.to(h)).sum(), (a, b)), torch.autograd.grad((ref * w).sum(), ref_leaves)):
        torch.testing.assert_close(g.cpu().double(), r, atol=1e-4, rtol=1e-5)
    names = [k for k, _ in gpu_config]
    assert {"_fwd_lookback_kernel", "_bwd_lookback_kernel"} <= set(names) and not _walked(gpu_config, "_fwd_kernel")
    assert all(m["WINDOW"] == common.LOOKBACK["window"] and (m["BLOCK_T"], m["BLOCK_D"], m["num_warps"])
               == common.LOOKBACK["tile"] for k, m in gpu_config if "lookback" in k), gpu_config
    assert {m["VEC"] for k, m in gpu_config if "lookback" in k} == {1}, gpu_config


def test_walking_needs_aligned_rows_and_enough_programs():
    """``in_thread_walk``'s rule on shapes and strides alone (meta tensors: fake tensors too)."""
    from scankit.triton import common

    gpu = torch.device("cuda", 0)
    saved = common.on_gpu, common._sm_count
    common.on_gpu, common._sm_count = (lambda device: True), (lambda index: 132)
    try:
        x = torch.empty(32, 4096, 1024, device="meta")
        assert common.in_thread_walk(gpu, 32, 1024, "fwd", x, x) and common.in_thread_walk(gpu, 32, 1024, "bwd", x)
        assert common.in_thread_walk(gpu, 8, 1024, "fwd", x) and not common.in_thread_walk(gpu, 8, 1024, "bwd", x)
        assert not common.in_thread_walk(gpu, 1, 1024, "fwd", x)                      # 8 programs: look-back
        assert not common.in_thread_walk(gpu, 128, 64, "fwd", x[..., :64])           # narrower than a tile
        assert common.in_thread_walk(gpu, 32, 1000, "fwd", x[:, :, :1000])            # 4000-byte rows
        assert not common.in_thread_walk(gpu, 32, 1002, "fwd", x[:, :, :1002])        # 4008-byte rows
        assert common.in_thread_walk(gpu, 32, 1008, "fwd", x[:, :, :1008])            # rows 1024 apart
        odd = torch.empty(32, 4096, 1042, device="meta")[..., :1040]
        assert not common.in_thread_walk(gpu, 32, 1040, "fwd", odd)                   # rows 1042 apart
        assert common.in_thread_walk(gpu, 32, 1008, "fwd", x[:, :, 16:], x[:, :, 12:1020])  # offset 12: 48 bytes
        assert not common.in_thread_walk(gpu, 32, 1008, "fwd", x[:, :, 16:], x[:, :, 15:1023])  # offset 15
        assert not common.in_thread_walk(gpu, 32, 1024, "fwd", x.transpose(1, 2).contiguous().transpose(1, 2))
        half = torch.empty(32, 4096, 1024, device="meta", dtype=torch.bfloat16)
        assert not common.in_thread_walk(gpu, 8, 1024, "fwd", half)                 # bf16: twice the programs fwd
        assert common.in_thread_walk(gpu, 32, 1000, "fwd", half[..., :1000])          # 2000-byte rows
        assert not common.in_thread_walk(gpu, 32, 1004, "fwd", half[..., :1004])      # 2008-byte rows
        assert not common.in_thread_walk(gpu, 32, 1000, "fwd", x[..., 4:1004], half[..., 4:1004])  # 8 bytes in bf16
        assert common.in_thread_walk(gpu, 16, 1024, "fwd", half)
        assert not common.in_thread_walk(gpu, 16, 1024, "bwd", half)
        assert common.in_thread_walk(gpu, 32, 1024, "bwd", half)                    # the backward's aim as fp32's
        assert common.in_thread_walk(gpu, 8, 1024, "fwd", x, half)                  # the input's dtype decides
        # the kernels' VEC: 1 where Triton proves the 16 bytes itself, else 16 bytes' elements, else 0
        assert [common.row_vector(1024, x), common.row_vector(1000, x[..., :1000]), common.row_vector(1000, half[..., :1000]),
                common.row_vector(1000, x[..., :1000], half[..., :1000]), common.row_vector(1002, x[..., :1002]),
                common.row_vector(1024, x.transpose(1, 2).contiguous().transpose(1, 2))] == [1, 4, 8, 8, 0, 0]
        # the log op's and the look-back's kernels take them only where Triton proves them (VECTOR_ROWS)
        for kind in ("log", "lookback"):
            assert [common.row_vector(1024, x, kind=kind), common.row_vector(1000, x[..., :1000], kind=kind),
                    common.row_vector(1000, half[..., :1000], kind=kind)] == [1, 0, 0]
    finally:
        common.on_gpu, common._sm_count = saved


def test_tiles_pipeline_only_rows_that_take_16_byte_loads(monkeypatch):
    """The tiles' pipelining (``common.ELEMENTWISE_STAGES``) where every row takes 16-byte loads;
    elsewhere (D, a stride or an offset no whole number of 16 bytes) unpipelined: its copies would
    be 4-byte cp.async (H100, session 40: 2.4x the state's fwd+bwd at D = 1000, before such rows
    took 16-byte loads), the log op too."""
    from scankit.triton import common, elementwise

    monkeypatch.setattr(common, "on_gpu", lambda device: True)
    monkeypatch.setattr(common, "_sm_count", lambda index: 132)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    wide = torch.empty(4, 4096, 1040, device="meta")  # 4 x 32 columns: too few programs to walk

    def geometry(x, log, pass_, *more):  # the tiles' (BLOCK_T, BLOCK_D, warps) and stages
        g = elementwise._geometry(x, log, pass_, x, *more)
        return g[:3], g[3]

    for log, pass_ in itertools.product((False, True), ("fwd", "bwd")):
        kind = "log" if log else "linear"
        pipelined = (common.ELEMENTWISE_TILES[kind], common.ELEMENTWISE_STAGES[kind, pass_])
        assert geometry(wide[..., :1024], log, pass_) == pipelined
        assert geometry(wide[..., 16:1024], log, pass_) == pipelined                         # offset 16
        assert geometry(wide[..., :1000], log, pass_) == (pipelined if not log else (pipelined[0], None))  # 4000-byte
        # rows: the linear tiles load 16 bytes there and pipeline, the log op's scalar loads do not (VECTOR_ROWS)
        assert geometry(wide[..., :1002], log, pass_) == (pipelined[0], None)               # 4008-byte rows
        assert geometry(wide[..., 16:1024], log, pass_, wide[..., 6:1014])[1] is None       # one at 24 bytes
        assert geometry(torch.empty(4, 4096, 1042, device="meta")[..., :1024], log, pass_)[1] is None  # rows 1042 apart
    assert any(common.ELEMENTWISE_STAGES.values())  # (else the rule above would check nothing)


def test_look_back_tiles_keep_each_warps_status_words_whole(monkeypatch):
    """``lookback_tiles`` refuses a tile whose (window, BLOCK_D) status words would lie over some
    warps as replicas (H100, session 38: (128, 64, 4) at window 1 gave wrong states), and takes
    those a warp holds whole or the warps split without replicas; CPU runs keep their tiles."""
    from scankit.triton import common

    gpu = torch.device("cuda", 0)
    monkeypatch.setattr(common, "on_gpu", lambda device: True)
    for tile, window in [((128, 32, 4), 1), ((256, 32, 8), 1), ((64, 32, 2), 1), ((128, 32, 4), 4), ((128, 64, 4), 2),
                         ((64, 128, 4), 1)]:
        monkeypatch.setitem(common.LOOKBACK, "tile", tile)
        monkeypatch.setitem(common.LOOKBACK, "window", window)
        assert common.lookback_tiles(gpu) == tile
    for tile, window in [((128, 64, 4), 1), ((64, 64, 4), 1), ((128, 32, 8), 2)]:
        monkeypatch.setitem(common.LOOKBACK, "tile", tile)
        monkeypatch.setitem(common.LOOKBACK, "window", window)
        with pytest.raises(ValueError, match=r"common.LOOKBACK: tile .* expected at most 32"):
            common.lookback_tiles(gpu)
    monkeypatch.setattr(common, "on_gpu", lambda device: False)  # a refused tile: the CPU keeps its own
    assert common.lookback_tiles(torch.device("cpu")) == common.tiles(torch.device("cpu"))
