"""The layer benchmark's pieces (issue 19; benchmarks.harness.layers): the plain-torch minGRU
is the same layer as scankit.MinGRU (against a float64 loop over time, outputs and gradients),
every impl's training step yields the input's and every weight's gradient, and the suite's
layer cells measure or skip every cell with a reason."""
import itertools
import math

import pytest
import torch
import torch.nn.functional as F

import scankit
from benchmarks.harness import grid, layers
from scankit.mixers import log_g

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _loop(module, x):
    """scankit.MinGRU's recurrence, sequentially in float64 from the module's weights:
    h_t = (1 - z_t) h_{t-1} + z_t g(pre_h_t), z = sigmoid(k), h_0 = 0.5."""
    k, pre_h = F.linear(x.double(), module.to_gate_hidden.weight.double(),
                        module.to_gate_hidden.bias.double()).chunk(2, dim=-1)
    z, g = torch.sigmoid(k), log_g(pre_h).exp()
    h, hs = torch.full_like(k[:, 0], 0.5), []
    for t in range(x.shape[1]):
        h = (1 - z[:, t]) * h + z[:, t] * g[:, t]
        hs.append(h)
    return torch.stack(hs, 1)


@pytest.mark.parametrize("T", [1, 13, 257])
def test_plain_mingru_is_scankits_layer(T, seed, scan_mode):
    scan_mode("eager")
    torch.manual_seed(seed)
    plain, ours = layers.PlainMinGRU(5, 6).double(), scankit.MinGRU(5, 6).double()
    ours.load_state_dict(plain.state_dict())
    x = torch.randn(3, T, 5, dtype=torch.float64, requires_grad=True)
    want = _loop(plain, x)
    for module in (plain, ours):
        got = module(x)
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)
        w = torch.randn_like(want)
        leaves = [x, *module.parameters()]
        grads = torch.autograd.grad((got * w).sum(), leaves)
        wants = torch.autograd.grad((_loop(module, x) * w).sum(), leaves)
        for g, g_want in zip(grads, wants):
            torch.testing.assert_close(g, g_want, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("T", [1, 13, 257])
def test_plain_signed_mingru_is_scankits_layer(T, seed, scan_mode):
    """PlainSignedMinGRU (a doubling scan in plain torch) and scankit.SignedMinGRU with its weights
    against the float64 loop: outputs and the grads of x and every weight."""
    from oracles import signed_loop

    scan_mode("eager")
    torch.manual_seed(seed)
    plain, ours = layers.PlainSignedMinGRU(5, 6).double(), scankit.SignedMinGRU(5, 6).double()
    ours.load_state_dict(plain.state_dict())
    x = torch.randn(3, T, 5, dtype=torch.float64, requires_grad=True)
    for module in (plain, ours):
        want = signed_loop(module.proj(x))
        got = module(x)
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)
        w = torch.randn_like(want)
        leaves = [x, *module.parameters()]
        for g, g_want in zip(torch.autograd.grad((got * w).sum(), leaves), torch.autograd.grad((want * w).sum(), leaves)):
            torch.testing.assert_close(g, g_want, rtol=1e-8, atol=1e-10)


def _block_loop(module, x):
    """A block layer's states step by step in float64 from its weights: h_t = M_t h_{t-1} + b_t
    per k-block, M_t from the projection (the module's transitions), b_t = sigmoid(zk) v, h_0 the
    learned one."""
    B, T = x.shape[:2]
    params, zk, pre_h = F.linear(x.double(), module.proj.weight.double(), module.proj.bias.double()).split(
        [module.n_params, module.hidden_size, module.hidden_size], dim=-1)
    M = module.transitions(params)
    b = (torch.sigmoid(zk) * pre_h).reshape(B, T, module.n, module.k)
    h, hs = module.h0.double().reshape(1, module.n, module.k).expand(B, -1, -1), []
    for t in range(T):
        h = torch.einsum("bnij,bnj->bni", M[:, t], h) + b[:, t]
        hs.append(h.reshape(B, -1))
    return torch.stack(hs, 1)


@pytest.mark.parametrize("T", [1, 13, 257])
@pytest.mark.parametrize("mixer", ["RotationMinGRU", "GivensMinGRU"])
def test_plain_block_layers_are_scankits(mixer, T, seed, scan_mode):
    """PlainRotationMinGRU / PlainGivensMinGRU (doubling of the blocks' affine maps in plain torch)
    and scankit's layer with their weights against the float64 step loop: outputs and the grads of
    x and every weight (h_0 random, so its grad is checked too)."""
    scan_mode("eager")
    torch.manual_seed(seed)
    plain = layers.PLAIN[mixer](8, 16).double()
    with torch.no_grad():
        plain.h0.normal_()
    ours = getattr(scankit, mixer)(8, 16).double()
    ours.load_state_dict(plain.state_dict())
    x = torch.randn(3, T, 8, dtype=torch.float64, requires_grad=True)
    for module in (plain, ours):
        want = _block_loop(plain, x)
        got = module(x)
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-11)
        w = torch.randn_like(want)
        leaves = [x, *module.parameters()]
        for g, g_want in zip(torch.autograd.grad((got * w).sum(), leaves),
                             torch.autograd.grad((_block_loop(plain, x) * w).sum(), [x, *plain.parameters()])):
            torch.testing.assert_close(g, g_want, rtol=1e-8, atol=1e-10)


def test_plain_block_layers_skip_where_their_doubling_cannot_fit():
    """The plain block layers' cells that would keep more than PLAIN_DOUBLING_GIB are skipped with
    the reason; kernel cells and the elementwise mixers never are."""
    big = grid.layer_skip_reason("GivensMinGRU", "32x4096x1024", "plain_compile")
    assert big is not None and "GiB" in big
    assert grid.layer_skip_reason("GivensMinGRU", "32x4096x1024", "kernel") is None
    assert grid.layer_skip_reason("RotationMinGRU", "8x512x256", "plain_eager") is None
    assert all(grid.layer_skip_reason("MinGRU", s, "plain_compile") is None for s in grid.LAYER_SHAPES)


@pytest.mark.parametrize("mixer", grid.LAYER_MIXERS)
@pytest.mark.parametrize("impl", [i for i in grid.LAYER_IMPLS if i != "plain_compile"])
def test_every_layer_step_gives_input_and_weight_grads(impl, mixer, scan_mode):
    """The timed step: grads of x and of every parameter, finite; the kernel layer and the
    plain layer, built with the same seed, have the same weights and the same grads."""
    scan_mode("triton" if impl == "kernel" else "eager")
    step = layers.train_step(impl, B=2, T=13, d=8, dtype="fp32", device=DEVICE, mixer=mixer)
    grads = step()
    module = layers.layer(impl, 8, mixer)
    assert len(grads) == 1 + len(list(module.parameters()))
    assert all(torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads)
    if impl == "kernel":
        plain = layers.train_step("plain_eager", B=2, T=13, d=8, dtype="fp32", device=DEVICE, mixer=mixer)()
        for g, g_plain in zip(grads, plain):
            torch.testing.assert_close(g, g_plain, rtol=1e-4, atol=1e-5)


def test_bad_layer_arguments_are_named():
    with pytest.raises(ValueError, match="impl must be one of kernel, plain_eager, plain_compile, cudnn_gru; got 'gru'"):
        layers.layer("gru", 4)
    with pytest.raises(ValueError, match="mixer must be one of MinGRU, SignedMinGRU, RotationMinGRU, GivensMinGRU; "
                                         "got 'Givens'"):
        layers.layer("kernel", 4, "Givens")
    with pytest.raises(ValueError, match="dtype must be one of fp32, bf16; got 'fp16'"):
        layers.train_step("plain_eager", 2, 3, 4, "fp16", device="cpu")


@pytest.mark.parametrize("mixer", grid.LAYER_MIXERS)
def test_layer_cells_measure_or_skip_every_cell(mixer, monkeypatch):
    """A smoke run: on the CPU fp32 cells of every impl but torch.compile are measured (seconds
    > 0), the rest skipped with the reason; on a GPU every cell is measured; none fails. One
    mixer a test (on a GPU each compiles its plain layer: one test took 312 s, session 22)."""
    from benchmarks.harness import suite

    monkeypatch.setenv("SCANKIT_BENCH_SMOKE", "1")
    monkeypatch.setattr(grid, "LAYER_SHAPES", dict(list(grid.LAYER_SHAPES.items())[:1]))
    cells = suite.layer_cells([mixer])
    assert not cells["failed"], cells["failed"]
    shape = next(iter(grid.LAYER_SHAPES))
    assert {key[0] for key in (*cells["seconds"], *cells["skipped"])} == {mixer}
    for impl, dtype in itertools.product(grid.LAYER_IMPLS, grid.LAYER_DTYPES):
        key = (mixer, shape, impl, dtype)
        if DEVICE == "cpu" and (impl == "plain_compile" or dtype == "bf16"):
            assert cells["skipped"][key] == "smoke run on the CPU"
        else:
            assert cells["seconds"][key] > 0 and not math.isnan(cells["seconds"][key])


def test_layer_cells_measure_only_the_rows_asked_for(monkeypatch):
    """The direct driver's subsets (bench_scans.py --layers --mixers/--layer-shapes/--dtypes):
    only those cells, every one measured or skipped; unknown names are refused by name."""
    from benchmarks.harness import report, suite

    monkeypatch.setenv("SCANKIT_BENCH_SMOKE", "1")
    shape = list(grid.LAYER_SHAPES)[-1]
    cells = suite.layer_cells(["SignedMinGRU"], [shape], impls=("kernel", "plain_eager"), dtypes=["fp32"])
    assert not cells["failed"], cells["failed"]
    assert set(cells["seconds"]) == {("SignedMinGRU", shape, impl, "fp32") for impl in ("kernel", "plain_eager")}
    assert all(v > 0 for v in cells["seconds"].values())
    payload = report.layers_payload(dict(torch="t", triton="t", device="cpu", driver="-", commit="0" * 40,
                                         time="now"), cells)
    assert [(r["mixer"], r["dtype"]) for r in payload["layers"]] == [("SignedMinGRU", "fp32")]
    md = report.render("scan_layers", payload)
    assert "| SignedMinGRU |" in md and "| MinGRU |" not in md and "n/a" in md  # no compiled cell: n/a
    assert "SignedMinGRU" in report.layers_table(payload)
    with pytest.raises(ValueError, match=r"shapes must be among .*got \['1x2x3'\]"):
        suite.layer_cells(shapes=["1x2x3"])
    with pytest.raises(ValueError, match=r"dtypes must be among .*got \['fp16'\]"):
        suite.layer_cells(dtypes=["fp16"])


def test_stack_cells_and_table(monkeypatch):
    """The whole-model cells: a CPU smoke run measures the eager stack (seconds > 0) and skips the
    rest with the reason; the table gives eager / compiled per dtype, n/a where a cell is
    missing; a bad impl is refused by name."""
    from benchmarks.harness import report, suite

    monkeypatch.setenv("SCANKIT_BENCH_SMOKE", "1")
    cells = suite.stack_cells()
    assert not cells["failed"], cells["failed"]
    shape = next(iter(grid.STACK_SHAPES))
    for impl, dtype in itertools.product(grid.STACK_IMPLS, grid.LAYER_DTYPES):
        key = (shape, impl, dtype)
        if DEVICE == "cpu" and (impl == "kernel_compile" or dtype == "bf16"):
            assert cells["skipped"][key] == "smoke run on the CPU"
        else:
            assert cells["seconds"][key] > 0
    made = dict(seconds={(shape, "kernel", "fp32"): 3e-3, (shape, "kernel_compile", "fp32"): 2e-3,
                         (shape, "kernel", "bf16"): 1e-3},
                peak_bytes={(shape, "kernel", "fp32"): 2**30, (shape, "kernel_compile", "fp32"): 2**29})
    rows = {r["dtype"]: r for r in report.stack_rows(made)}
    assert rows["fp32"]["speedup"] == pytest.approx(1.5) and rows["fp32"]["compiled_mib"] == pytest.approx(512)
    assert rows["bf16"]["compiled_ms"] is None and rows["bf16"]["speedup"] is None
    env = dict(torch="t", triton="t", device="cpu", driver="-", commit="0" * 40, time="now")
    md = report.render("scan_layers", report.layers_payload(env, dict(seconds={}, peak_bytes={}), made))
    assert "| 3.00 | 2.00 | 1.50× | 1,024 | 512 |" in md and "| 1.00 | n/a | n/a |" in md
    assert "## Whole layers" not in md  # no layer rows asked for: no empty layer table
    with pytest.raises(ValueError, match="impl must be one of kernel, kernel_compile; got 'plain_eager'"):
        layers.stack_step("plain_eager", 2, 3, 16, "fp32", device="cpu")


def test_profile_layer_script_names_where_a_step_goes(tmp_path, capsys):
    """scripts/profile_layer.py (a smoke run on the CPU: the step's ops; on a GPU its kernels):
    the table sums to the header's total, and --out keeps the table and one step's trace."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "profile_layer.py"
    spec = importlib.util.spec_from_file_location("profile_layer", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--mixer", "MinGRU", "--steps", "1", "--out", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("MinGRU kernel (") and "us per step" in text and "share" in text
    assert {p.suffix for p in tmp_path.iterdir()} == {".txt", ".json"}
    with pytest.raises(SystemExit):
        mod.main(["--mixer", "stack", "--impl", "plain_eager"])


def test_step_cells_route_kernel_and_reference_cells(monkeypatch):
    """As on a GPU (device and measuring faked, nothing built): kernel cells (the layer's and the
    stack's) are measured now under the kernel mode (MINGRU_SCAN=auto), plain / cuDNN cells go
    through the reference cache under their names (the GRU's one name for every mixer), the
    doubling limit's cells are skipped with grid's reason, and a cell that raises is failed."""
    import os

    from benchmarks.harness import layers, suite

    measured, cached = [], []
    monkeypatch.setattr(suite, "device", lambda: "cuda")
    monkeypatch.setattr(layers, "train_step", lambda impl, B, T, d, dtype, dev, mixer: (mixer, (B, T, d), impl, dtype))
    monkeypatch.setattr(layers, "stack_step", lambda impl, B, T, d, dtype, dev: ("stack", (B, T, d), impl, dtype))

    def step_cell(make_step, dev):
        built = make_step()
        if built[2] == "plain_eager" and built[3] == "bf16":
            raise RuntimeError("out of memory")
        measured.append((built, os.environ.get("MINGRU_SCAN")))
        return dict(seconds=1.0, peak_bytes=2)

    monkeypatch.setattr(suite, "_step_cell", step_cell)
    monkeypatch.setattr(suite, "_cached_reference", lambda key, fn, source=None: (cached.append(key), fn())[1])
    shape = "4x16384x1024"
    cells = suite.layer_cells(["MinGRU", "GivensMinGRU"], [shape])
    assert cells["skipped"] == {("GivensMinGRU", shape, "plain_compile", dt): grid.layer_skip_reason(
        "GivensMinGRU", shape, "plain_compile") for dt in grid.LAYER_DTYPES} | {
        ("GivensMinGRU", shape, "plain_eager", dt): grid.layer_skip_reason("GivensMinGRU", shape, "plain_eager")
        for dt in grid.LAYER_DTYPES} and all(cells["skipped"].values())
    assert set(cells["failed"]) == {("MinGRU", shape, "plain_eager", "bf16")}
    dims = grid.LAYER_SHAPES[shape]
    assert ((("MinGRU", dims, "kernel", "fp32"), "auto") in measured
            and (("GivensMinGRU", dims, "kernel", "bf16"), "auto") in measured)
    assert ("layer:MinGRU", shape, "plain_compile", "fp32") in cached
    assert ("layer:GRU", shape, "cudnn_gru", "bf16") in cached
    assert not any(key[2] == "kernel" for key in cached)
    assert set(cells["seconds"]) == {(m, shape, i, dt) for m in ("MinGRU", "GivensMinGRU") for i in grid.LAYER_IMPLS
                                     for dt in grid.LAYER_DTYPES} - set(cells["skipped"]) - set(cells["failed"])
    measured.clear(), cached.clear()
    stacks = suite.stack_cells()
    assert not cached and set(stacks["seconds"]) == {(s, i, dt) for s in grid.STACK_SHAPES for i in grid.STACK_IMPLS
                                                    for dt in grid.LAYER_DTYPES}
    assert all(mode == "auto" for _, mode in measured)
