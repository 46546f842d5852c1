"""Issue 16's roofline cells (bench_roofline.Roofline) in a CPU smoke run: every cell is
measured or skipped with its reason, and each carries the bytes the issue's % of copy uses;
the cliff sweep's cells, and the rows, table and heatmap the roofline artifact renders from them."""
from itertools import product as itertools_product

import pytest

from benchmarks.harness import grid, suite


def test_every_cell_is_measured_or_says_why(bench_smoke):
    cells = suite.roofline_cells()
    keys = {(s, i, d, r) for s in grid.ROOFLINE_SHAPES for i in grid.ROOFLINE_IMPLS for d in grid.ROOFLINE_DTYPES
            for r in grid.DIRECTIONS}
    assert set(cells["device_time"]) | set(cells["skipped"]) == keys and not cells["failed"], cells["failed"]
    assert {k[1] for k in cells["device_time"]} == {"triton"}  # the peer is CUDA-only: said, not timed
    assert all("CUDA" in why for why in cells["skipped"].values())
    for key, timed in cells["device_time"].items():
        assert timed["number"] == 1 and all(t > 0 for t in timed["samples"])
        per_element = 4 if key[2] == "fp32" else 2
        tensors = 3 if key[3] == "fwd" else 8  # a, b, h; + grad, a, h, da, db
        assert cells["bytes"][key] == 1 * 13 * 8 * per_element * tensors  # the smoke shape (1, 13, 8)



def test_cliff_sweep_cells_are_the_issues_grid_and_carry_their_bytes(bench_smoke):
    """The sweep is B x D x T of issue 16 where a and b hold at least 64 MiB; each cell measured
    (the smoke shape) with the bytes grid.cliff_bytes gives the renderer."""
    import itertools

    want = {(B, T, D) for B, D, T in itertools.product(grid.CLIFF_B, grid.CLIFF_D, grid.CLIFF_T)
            if B * T * D * 8 >= 64 * 2 ** 20}
    shapes = grid.cliff_shapes()
    assert set(shapes.values()) == want and len(shapes) == len(want) == 51
    assert all(name == "x".join(map(str, dims)) for name, dims in shapes.items())
    cells = suite.cliff_cells()
    assert set(cells["device_time"]) == {(s,) for s in shapes} and not cells["failed"] and not cells["skipped"]
    for key, timed in cells["device_time"].items():
        assert timed["number"] == 1 and all(t > 0 for t in timed["samples"])
        assert cells["bytes"][key] == grid.cliff_bytes(1, 13, 8)  # the smoke shape (1, 13, 8)


def test_cliff_cells_too_large_for_the_gpu_are_skipped_saying_so(monkeypatch):
    """On a GPU, a cell whose tensors exceed the free memory is n/a with its size, not an OOM."""
    import torch

    monkeypatch.setattr(suite, "device", lambda: "cuda")
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (1 << 30, 80 << 30))  # 1 GiB free
    monkeypatch.setattr(suite, "_roofline_cell", lambda *a: ({"samples": [1e-3], "number": 1}, 1))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    cells = suite.cliff_cells()
    small, big = ("2x65536x64",), ("32x65536x3000",)  # 0.06 GiB of inputs; 47 GiB
    assert small in cells["device_time"] and big in cells["skipped"]
    assert "GiB" in cells["skipped"][big] and "free" in cells["skipped"][big]
    assert set(cells["device_time"]) | set(cells["skipped"]) == {(s,) for s in grid.cliff_shapes()}


def test_issue16_rows_compare_with_the_peer_and_the_goals_bars(tmp_path):
    from benchmarks.harness import roofline as rl

    bw = 4.0e12
    device, moved = {}, {}
    for shape in grid.ROOFLINE_SHAPES:
        for impl, dtype, direction in itertools_product(grid.ROOFLINE_IMPLS, grid.ROOFLINE_DTYPES, grid.DIRECTIONS):
            moved[shape, impl, dtype, direction] = 1.0e9
            device[shape, impl, dtype, direction] = 1.0e9 / bw / (0.88 if impl == "triton" else 0.95)
    device["8x512x256", "accelerated_scan_native", "fp32", "fwd"] = float("nan")  # asv's n/a
    rows = {(r["shape"], r["dtype"], r["direction"]): r for r in rl.issue16_rows(device, moved, bw)}
    assert len(rows) == len(grid.ROOFLINE_SHAPES) * len(grid.ROOFLINE_DTYPES) * len(grid.DIRECTIONS)
    big = rows["32x4096x1024", "fp32", "fwd"]
    assert big["pct"] == pytest.approx(88) and big["bar"] == 90 and big["met"] is False
    assert big["peer_pct"] == pytest.approx(95) and big["ratio"] == pytest.approx(0.88 / 0.95) and not big["peer_met"]
    assert rows["1x65536x1024", "bf16", "fwd"]["bar"] == 85 and rows["1x65536x1024", "bf16", "fwd"]["met"] is True
    assert rows["32x4096x1024", "fp32", "fwdbwd"]["bar"] == 80 and rows["32x4096x1024", "fp32", "fwdbwd"]["met"]
    assert rows["16x2048x512", "fp32", "fwd"]["bar"] is None and rows["16x2048x512", "fp32", "fwd"]["met"] is None
    na = rows["8x512x256", "fp32", "fwd"]
    assert na["peer_us"] is None and na["ratio"] is None and na["peer_met"] is None and na["us"] is not None
    from benchmarks.harness import report

    env = dict(torch="2.x", triton="3.x", device="GPU", driver="1", commit="abcdef123456", time="2026-01-01T00:00:00Z")
    payload = dict(env=env, copy_bw=bw, rows=[], peers=[], scaling=[], scaling_ref={}, targets=[], status=[],
                   issue16=list(rows.values()))
    text = report.write("scan_roofline", payload, tmp_path)[1].read_text()
    assert "## Issue 16: scankit on (B, T, D) beside accelerated-scan on its own (B, D, T) layout" in text
    assert "| 32x4096x1024 | fp32 | fwd | 284.1 | 88% | 263.2 | 95% | 0.93× **(behind)** | 90% | **no** |" in text
    assert "| 8x512x256 | fp32 | fwd | 284.1 | 88% | n/a | n/a | n/a |  |  |" in text


def test_cliff_rows_table_and_heatmap(tmp_path):
    from benchmarks.harness import report
    from benchmarks.harness import roofline as rl

    bw = 4.0e12
    shapes = grid.cliff_shapes()
    device = {(s,): grid.cliff_bytes(*dims) / bw / 0.75 for s, dims in shapes.items()}
    device["1x65536x768",] = grid.cliff_bytes(1, 65536, 768) / bw / 0.5  # a cliff
    device["32x65536x3000",] = float("nan")  # too large for the GPU: n/a
    rows = rl.cliff_rows(device, bw)
    by = {r["shape"]: r for r in rows}
    assert [r["shape"] for r in rows] == list(shapes)
    assert by["1x65536x768"]["pct"] == pytest.approx(50) and by["1x65536x768"]["met"] is False
    assert by["8x4096x1024"]["pct"] == pytest.approx(75) and by["8x4096x1024"]["met"] is True
    assert by["32x65536x3000"]["pct"] is None and by["32x65536x3000"]["met"] is None
    env = dict(torch="2.x", triton="3.x", device="GPU", driver="1", commit="abcdef123456", time="2026-01-01T00:00:00Z")
    payload = dict(env=env, copy_bw=bw, rows=[], peers=[], scaling=[], scaling_ref={}, targets=[], status=[],
                   cliffs=rows, cliff_bar=grid.CLIFF_BAR, cliff_min_mib=64)
    text = report.write("scan_roofline", payload, tmp_path)[1].read_text()
    assert "## Issue 16: the cliff sweep" in text and "49 of 50 measured cells meet it (1 n/a" in text
    assert "| 1 | 65536 | 768 | 302.0 | 604.0 | 50% | **no** |" in text  # 604 MB at 2 TB/s
    assert "| 32 | 65536 | 3000 | n/a | 75,497.5 | n/a |  |" in text
    a, b = tmp_path / "a.png", tmp_path / "b.png"
    rl.plot_cliffs(rows, env, a)
    rl.plot_cliffs(rows, env, b)
    assert a.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and a.read_bytes() == b.read_bytes()  # deterministic


def test_the_driver_writes_issue16s_tables_and_heatmap(bench_smoke, monkeypatch, tmp_path, capsys):
    """``scripts/bench_scans.py --roofline``'s body on the smoke shapes: both tables (the peer n/a
    on the CPU, saying why), the heatmap, and the printed summary."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("bench_scans_driver", Path(__file__).parents[1] / "scripts" / "bench_scans.py")
    driver = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(driver)
    monkeypatch.setattr(suite, "copy_bandwidth", lambda: 4.0e12)
    env = dict(torch="2.x", triton="3.x", device="CPU", driver="-", commit="abcdef123456", time="2026-01-01T00:00:00Z")
    assert driver.roofline(env, str(tmp_path)) is True
    text = (tmp_path / "scan_issue16.md").read_text()
    assert "## Issue 16: scankit on (B, T, D)" in text and "## Issue 16: the cliff sweep" in text
    assert "- n/a: 32x4096x1024 accelerated_scan_native fp32 fwd:" in text  # the peer is CUDA-only
    assert (tmp_path / "scan_cliffs.png").read_bytes()[:4] == b"\x89PNG"
    shown = capsys.readouterr().out
    assert "copy 4.00 TB/s" in shown and f"of {len(grid.cliff_shapes())} cells >= 70% of copy" in shown
