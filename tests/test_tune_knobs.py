"""scripts/tune_scans.py restores the kernels' knobs however a sweep ends, so the sections
after it measure the adopted settings."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import tune_scans  # noqa: E402
from scankit.triton import affine, common  # noqa: E402


def test_knobs_are_restored_after_an_early_exit():
    stages, tuning = dict(common.ELEMENTWISE_STAGES), dict(affine.TUNING)
    with pytest.raises(RuntimeError):
        with tune_scans.knobs(common.ELEMENTWISE_STAGES, affine.TUNING):
            common.ELEMENTWISE_STAGES.update(dict.fromkeys(common.ELEMENTWISE_STAGES, 7))
            affine.TUNING.update(num_warps=16, extra=1)
            raise RuntimeError("budget spent midway")
    assert common.ELEMENTWISE_STAGES == stages and affine.TUNING == tuning


def test_an_exhausted_budget_leaves_the_knobs_as_they_were(monkeypatch):
    monkeypatch.setattr(tune_scans, "START", 0.0)  # the budget is long spent: every sweep returns at once
    before = dict(common.PROGRAMS_PER_SM), dict(common.ELEMENTWISE_STAGES), dict(affine.TUNING)
    lanes, in_thread, lookback = dict(affine.LANE_BLOCKS), dict(common.IN_THREAD), dict(common.LOOKBACK)
    tune_scans.affine_sweep(1.0, print)
    tune_scans.elementwise_sweep(1.0, print)
    tune_scans.lanes_sweep(1.0, print)
    tune_scans.widths_sweep(1.0, print)
    tune_scans.few_sweep(1.0, print)
    tune_scans.unaligned_sweep(1.0, print)
    assert (common.PROGRAMS_PER_SM, common.ELEMENTWISE_STAGES, affine.TUNING) == before
    assert affine.LANE_BLOCKS == lanes and common.IN_THREAD == in_thread and common.LOOKBACK == lookback


def test_the_gated_sweeps_walk_path_walks_and_is_undone(monkeypatch):
    """The gated section's "walk" path: with its knobs a gated scan gets the in-thread tile;
    without them (production) the tiles, and the knobs are restored even when the block raises."""
    import torch
    from scankit.triton import elementwise

    monkeypatch.setattr(common, "on_gpu", lambda device: True)
    monkeypatch.setattr(common, "_sm_count", lambda index: 132)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    a = torch.empty(64, 256, 512, device="meta")
    walking = common.IN_THREAD["tile"]
    before = dict(common.IN_THREAD)
    assert elementwise._geometry(a, False, "bwd", a, a, gate=1)[:3] != walking
    with tune_scans.knobs(common.IN_THREAD), pytest.raises(RuntimeError):
        common.IN_THREAD.update(tune_scans.GATED_PATHS["walk"]["IN_THREAD"])
        assert elementwise._geometry(a, False, "bwd", a, a, gate=1)[:3] == walking
        assert elementwise._geometry(a, False, "fwd", a, a, gate=1)[:3] == walking
        raise RuntimeError("budget spent midway")
    assert common.IN_THREAD == before and elementwise._geometry(a, False, "fwd", a, a, gate=1)[:3] != walking
    assert elementwise._geometry(a, False, "fwd", a, a)[:3] == walking  # linear_scan walks at this shape


def test_the_gated_look_back_paths_set_the_tile_and_are_undone():
    """Each path of the gated look-back section gives the look-back kernels its tile on the GPU,
    and leaves LOOKBACK as it was; every path names a knob table the sweep restores."""
    import torch

    cuda = torch.device("cuda")
    before = dict(common.LOOKBACK)
    for name, path in tune_scans.GATED_LOOKBACK_TILES.items():
        assert set(path) <= {"IN_THREAD", "LOOKBACK"}, name  # what _gated_cells restores
        with tune_scans.knobs(common.IN_THREAD, common.LOOKBACK):
            for table, updates in path.items():
                getattr(common, table).update(updates)
            assert common.lookback_tiles(cuda) == path["LOOKBACK"]["tile"]
        assert common.LOOKBACK == before
    assert common.lookback_tiles(cuda) == tuple(before["tile"])
    assert set(tune_scans.GATED_PATHS["walk"]) <= {"IN_THREAD", "LOOKBACK"}


def test_the_widths_sweep_starts_each_width_at_production(monkeypatch):
    """Each width's first point is the one production launches (session 38: the table a width
    left behind had become the next width's "adopted" point, e.g. 32 lanes at k = 8), and every
    point after it is another; the knobs are as before once the sweep is done."""
    from benchmarks.harness import grid, measure, suite

    monkeypatch.setattr(tune_scans, "START", tune_scans.time.time())
    monkeypatch.setattr(measure, "copy_bandwidth", lambda: 1e12)
    monkeypatch.setattr(suite, "block_workload", lambda dims, direction, device: (None, 1e6))
    monkeypatch.setattr(tune_scans, "_checked", lambda fn, reference, key: (1.0, None))
    tuning = dict(affine.TUNING)
    rows = []
    tune_scans.widths_sweep(1e9, rows.append)
    assert affine.TUNING == tuning
    cells = len(grid.BLOCK_SHAPES) * len(grid.DIRECTIONS)
    for width, (k, v) in grid.BLOCK_WIDTHS.items():
        mine = [r for r in rows if r["width"] == width]
        n = suite.block_dims(grid.BLOCK_SHAPES[0], k, v)["n"]
        production = (affine._block_lanes(n, k, v), tuning["num_warps"])
        assert [(r["lanes"], r["warps"]) for r in mine[:cells]] == [production] * cells, width
        assert all(r["adopted"] for r in mine[:cells]) and not any(r["adopted"] for r in mine[cells:]), width
        assert len(mine) > cells


def _pretend_h100_sweep(monkeypatch, sweep, probe):
    """``sweep`` (a ``tune_scans._paths_sweep`` section) under the GPU's launch rules on 132 SMs,
    with no GPU: each cell's measurement is ``probe(op, a meta input of the cell)``. Returns the
    rows it logged and the probes' results, in order."""
    import torch

    monkeypatch.setattr(common, "on_gpu", lambda device: True)
    monkeypatch.setattr(common, "_sm_count", lambda index: 132)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    rows, seen = [], []

    def device_us(op, dims, direction, reference, key, dtype):
        seen.append(probe(op, torch.empty(dims, device="meta", dtype=dtype)))
        return 1.0, None

    monkeypatch.setattr(tune_scans, "_device_us", device_us)
    monkeypatch.setattr(tune_scans.measure, "copy_bandwidth", lambda: 1e12)
    monkeypatch.setattr(tune_scans, "START", tune_scans.time.time())
    sweep(1e9, rows.append)
    return rows, seen


def test_the_few_program_sweep_moves_its_cells_off_the_walk_and_back(monkeypatch):
    """The few-program sweep's paths: production walks the fp32 forward at (8, 4096, 1024) (64
    programs) on the GPU and the "tiles" paths take it to the look-back tiles they set; production
    walks the bf16 backward at (24, 4096, 1024) (192 programs) and "bwd2.5" takes it off the walk;
    every cell runs on its own paths, both directions, and the knobs are restored after."""
    from scankit.triton import elementwise

    tables = common.IN_THREAD, common.LOOKBACK, common.ELEMENTWISE_TILES, common.CHUNKING
    before = [dict(t) for t in tables]
    rows, seen = _pretend_h100_sweep(monkeypatch, tune_scans.few_sweep, lambda op, a: (
        {p: elementwise._geometry(a, False, p, a, a, a) for p in ("fwd", "bwd")}, common.lookback_tiles(a.device)))
    assert [dict(t) for t in tables] == before
    assert len(rows) == len(seen) == 2 * sum(len(paths) for *_, paths in tune_scans.FEW_CELLS)
    assert all(path in tune_scans.FEW_PATHS for *_, paths in tune_scans.FEW_CELLS for path in paths)
    walking = common.IN_THREAD["tile"]  # (BLOCK_T, BLOCK_D, warps) of the in-thread walk

    def cell(dims, dtype, direction):  # {path: ({pass: geometry}, look-back tile)}
        return {r["path"]: s for r, s in zip(rows, seen)
                if (tuple(r["dims"]), r["dtype"], r["direction"]) == (dims, dtype, direction)}

    fp32 = cell((8, 4096, 1024), "float32", "fwd")
    assert list(fp32) == list(tune_scans._CROSSOVER) and fp32["main"][0]["fwd"][:3] == walking
    for path in list(fp32)[1:]:
        (passes, tile), want = fp32[path], tune_scans.FEW_PATHS[path].get("LOOKBACK", {}).get("tile", before[1]["tile"])
        assert passes["fwd"][:3] != walking and tile == want, path

    bf16 = cell((24, 4096, 1024), "bfloat16", "fwdbwd")
    assert list(bf16) == ["main", "bwd2.5"]
    assert bf16["main"][0]["bwd"][:3] == walking and bf16["bwd2.5"][0]["bwd"][:3] != walking
    assert bf16["main"][0]["fwd"][:3] == bf16["bwd2.5"][0]["fwd"][:3] == walking  # 192 programs: both walk forward

    b1 = cell((1, 65536, 1024), "float32", "fwd")  # 8 programs of the in-thread tile: the look-back's chunks
    assert b1["main"][0]["fwd"][4] > 1 and b1["main"][1] == before[1]["tile"]
    narrow = b1["walk256x8w1"][0]["fwd"]
    assert narrow[:3] == (256, 8, 1) and narrow[4] == 1  # one chunk: no look-back


def test_the_unaligned_sweep_sets_the_pipelining_of_the_tiles(monkeypatch):
    """Rows of D = 1000: the state walks in the in-thread tiles at their stages (16-byte loads:
    ``common.VECTOR_ROWS``), the log op takes its tiles (one chunk) unpipelined (``common.stages``);
    at D = 1024 the sweep's paths take the state off the in-thread walk ("tiles"), set its
    backward's stages and the log op's; all undone after."""
    from scankit.triton import elementwise

    before = dict(common.ELEMENTWISE_STAGES)
    rows, seen = _pretend_h100_sweep(monkeypatch, tune_scans.unaligned_sweep, lambda op, a: {
        p: elementwise._geometry(a, op == "parallel_scan_log", p, a, a, a) for p in ("fwd", "bwd")})
    assert dict(common.ELEMENTWISE_STAGES) == before
    assert len(rows) == 2 * sum(len(paths) for *_, paths in tune_scans.UNALIGNED_CELLS)

    def cell(op, dims):
        return {r["path"]: g for r, g in zip(rows, seen)
                if (r["op"], tuple(r["dims"]), r["direction"]) == (op, dims, "fwdbwd")}

    g = cell("parallel_scan_log", (32, 4096, 1000))["main"]
    assert g["fwd"][:3] == g["bwd"][:3] == common.ELEMENTWISE_TILES["log"] and g["fwd"][3] is g["bwd"][3] is None
    assert g["bwd"][4] == 1
    g = cell("linear_scan_state", (32, 4096, 1000))["main"]
    assert g["fwd"][:3] == g["bwd"][:3] == common.IN_THREAD["tile"] and g["bwd"][4] == 1
    assert (g["fwd"][3], g["bwd"][3]) == (common.IN_THREAD["stages"]["fwd"], common.IN_THREAD["stages"]["bwd"])
    control = cell("linear_scan_state", (32, 4096, 1024))
    assert control["main"]["bwd"][:3] == common.IN_THREAD["tile"] and control["tiles"]["bwd"][:3] == (64, 32, 4)
    assert control["tiles"]["bwd"][3] == before[("linear", "bwd")] and control["tiles+bwd-stagesNone"]["bwd"][3] is None
    logs = cell("parallel_scan_log", (32, 4096, 1024))
    assert logs["main"]["bwd"][3] == before[("log", "bwd")] and logs["log-stagesNone"]["fwd"][3] is None


def test_the_rows_sweep_measures_forwards_walking_and_on_the_tiles(monkeypatch):
    """The rows sweep: forwards only; at 64 programs production walks and "tiles" does not."""
    from scankit.triton import elementwise

    rows, seen = _pretend_h100_sweep(monkeypatch, tune_scans.rows_sweep,
                                     lambda op, a: elementwise._geometry(a, False, "fwd", a, a, a))
    assert len(rows) == 2 * len(tune_scans.ROWS_CELLS) and {r["direction"] for r in rows} == {"fwd"}
    at = {(tuple(r["dims"]), r["path"]): g for r, g in zip(rows, seen)}
    assert at[(8, 7777, 1024), "main"][:3] == common.IN_THREAD["tile"] != at[(8, 7777, 1024), "tiles"][:3]
