"""Issue 17's block-width cells (bench_roofline.BlockWidths) in a CPU smoke run: every cell is
measured, times the states-only form, and carries the bytes its % of copy uses."""
import pytest

from benchmarks.harness import grid, suite


def test_every_cell_is_measured_with_its_bytes(bench_smoke):
    cells = suite.block_cells()
    keys = {(s, w, d) for s in grid.BLOCK_SHAPES for w in grid.BLOCK_WIDTHS for d in grid.DIRECTIONS}
    assert set(cells["device_time"]) == keys and not cells["failed"] and not cells["skipped"], cells["failed"]
    for (shape, width, direction), timed in cells["device_time"].items():
        assert timed["number"] == 1 and all(t > 0 for t in timed["samples"])
        k, v = grid.BLOCK_WIDTHS[width]
        M, b, h = 13 * k * k * 4, 13 * k * v * 4, 13 * k * v * 4  # the smoke shape: B = 1, T = 13, n = 1
        fwd = M + b + h  # read M and b, write the states
        want = fwd if direction == "fwd" else fwd + h + (M + b) + h + (M + b)  # + read grad, M, b, h; write dM, db
        assert cells["bytes"][shape, width, direction] == want


def test_the_cells_time_the_states_only_form(bench_smoke, monkeypatch):
    """The cells call matrix_affine_scan with return_prefix=False (no running product: the
    mixers' call), whatever the registry's default form."""
    import scankit.ops  # the submodule itself: ``import scankit`` binds it only once something imported it

    seen = []
    real = scankit.ops.matrix_affine_scan

    def spy(*args, **kwargs):
        seen.append(kwargs.get("return_prefix", True))
        return real(*args, **kwargs)

    monkeypatch.setattr(scankit.ops, "matrix_affine_scan", spy)
    monkeypatch.setattr(grid, "BLOCK_SHAPES", ("large",))
    monkeypatch.setattr(grid, "BLOCK_WIDTHS", {"k4v1": (4, 1)})
    cells = suite.block_cells()
    assert set(cells["device_time"]) == {("large", "k4v1", "fwd"), ("large", "k4v1", "fwdbwd")}
    assert seen and not any(seen)


def test_block_rows_give_the_percent_of_copy_and_the_goals_bars():
    from benchmarks.harness import report

    bw = 4.0e12
    device, moved = {}, {}
    for s in grid.BLOCK_SHAPES:
        for w in grid.BLOCK_WIDTHS:
            for d in grid.DIRECTIONS:
                moved[s, w, d] = 2.0e9
                device[s, w, d] = 2.0e9 / bw / 0.55  # 55% of copy everywhere
    device["vlong", "k16v16", "fwd"] = float("nan")  # asv's n/a
    rows = {(r["shape"], r["k"], r["v"], r["direction"]): r for r in report.block_rows(device, moved, bw)}
    assert len(rows) == len(grid.BLOCK_SHAPES) * len(grid.BLOCK_WIDTHS) * len(grid.DIRECTIONS)
    k8f, k8b = rows["large", 8, 1, "fwd"], rows["large", 8, 1, "fwdbwd"]
    assert k8f["pct"] == pytest.approx(55) and k8f["bar"] == 60 and k8f["met"] is False
    assert k8b["bar"] == 50 and k8b["met"] is True
    assert rows["large", 16, 16, "fwd"]["bar"] == 40 and rows["large", 16, 16, "fwd"]["met"] is True
    assert rows["large", 4, 1, "fwdbwd"]["bar"] is None and rows["large", 4, 1, "fwdbwd"]["met"] is None
    na = rows["vlong", 16, 16, "fwd"]
    assert na["us"] is None and na["pct"] is None and na["met"] is None
    assert rows["large", 16, 1, "fwd"]["us"] == pytest.approx(2.0e9 / bw / 0.55 * 1e6)
    assert all(r["n"] == grid.SHAPES[r["shape"]].d // r["k"] for r in rows.values())


def test_the_block_table_renders_its_rows(tmp_path):
    from benchmarks.harness import report

    blocks = report.block_rows({("large", "k8v1", "fwd"): 1e-3}, {("large", "k8v1", "fwd"): 2.0e9}, 4.0e12)
    env = dict(torch="2.x", triton="3.x", device="GPU", driver="1", commit="abc", time="2026-01-01T00:00:00Z")
    md = report.write("scan_bench", dict(env=env, rows=[], skipped=[], copy_bw=4.0e12, blocks=blocks), tmp_path)[1]
    text = md.read_text()
    assert "## Block widths (issue 17)" in text
    assert "| large | 32 | 8 | 1 | fwd | 1,000.0 | 2,000.0 | 50% | 60% | **no** |" in text
    assert "| vlong | 32 | 8 | 1 | fwdbwd | n/a | n/a | n/a | 50% |  |" in text
