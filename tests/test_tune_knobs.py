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
    lanes = dict(affine.LANE_BLOCKS)
    tune_scans.affine_sweep(1.0, print)
    tune_scans.elementwise_sweep(1.0, print)
    tune_scans.lanes_sweep(1.0, print)
    tune_scans.widths_sweep(1.0, print)
    assert (common.PROGRAMS_PER_SM, common.ELEMENTWISE_STAGES, affine.TUNING) == before
    assert affine.LANE_BLOCKS == lanes


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
