"""Issue 16's roofline cells (bench_roofline.Roofline) in a CPU smoke run: every cell is
measured or skipped with its reason, and each carries the bytes the issue's % of copy uses."""
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

