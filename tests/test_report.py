"""Artifact templates render every field and write deterministically."""
import json
from pathlib import Path

import pytest

from benchmarks.harness import report

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(torch="2.x", triton="3.x", device="GPU", driver="1", commit="abc", time="2026-01-01T00:00:00Z")


def test_bench_template_renders_all_columns(tmp_path):
    rows = [dict(op="linear_scan", shape="lab", direction="fwd", bytes=4_000_000, triton_us=2.0, eager_us=500.0,
                 torch_compile_us=None, triton_peak_bytes=1, eager_peak_bytes=2, torch_compile_peak_bytes=None)]
    payload = dict(env=ENV, rows=rows, skipped=[dict(op="linear_scan", shape="lab", impl="torch_compile", reason="r")],
                   copy_bw=4.0e12)
    md_path = report.write("scan_bench", payload, tmp_path)[1]
    md = md_path.read_text()
    assert "| linear_scan | lab | fwd | 2.0 | 500.0 | skipped | 250.00× |" in md
    assert "| linear_scan | lab | fwd | 4.0 | 2.0 | 1.0 | 2.00 | 50% |" in md
    first = md_path.read_bytes()
    report.write("scan_bench", payload, tmp_path)
    assert md_path.read_bytes() == first
    assert json.loads((tmp_path / "scan_bench.json").read_text())["rows"][0]["eager_us"] == 500.0


def test_seed_table_has_both_quantities_and_meets_only_when_both_do(tmp_path):
    """Issue 15 goal 1: a shape meets the seed's speedup only when device time and call
    latency both reach it; a missing cell is n/a, never met."""
    from benchmarks.harness import grid

    device = {("matrix_scan", "lab", "triton", "fwdbwd"): 1e-5, ("matrix_scan", "lab", "eager", "fwdbwd"): 2e-3,
              ("linear_scan", "lab", "triton", "fwdbwd"): 1e-5, ("linear_scan", "lab", "eager", "fwdbwd"): 1e-3}
    latency = {("matrix_scan", "lab", "triton", "fwdbwd"): 1e-4, ("matrix_scan", "lab", "eager", "fwdbwd"): 2e-3,
               ("linear_scan", "lab", "triton", "fwdbwd"): 1e-4, ("linear_scan", "lab", "eager", "fwdbwd"): 1e-3}
    rows = {(r["op"], r["shape"]): r for r in report.seed_rows(device, latency)}
    assert set(rows) == set(grid.SEED_SPEEDUPS)
    ms, ls = rows["matrix_scan", "lab"], rows["linear_scan", "lab"]
    assert ms["device"] == pytest.approx(200) and ms["latency"] == pytest.approx(20) and ms["met"] is False
    assert ls["device"] == pytest.approx(100) and ls["latency"] == pytest.approx(10) and ls["met"] is True
    assert rows["matrix_scan", "longT"]["met"] is None and rows["matrix_scan", "longT"]["device"] is None
    payload = dict(env=dict(ENV, time_method="track_device_time"), rows=[], skipped=[], copy_bw=None,
                   seed=report.seed_rows(device, latency))
    md = report.write("scan_bench", payload, tmp_path)[1].read_text()
    assert "| matrix_scan | lab | 94.20× | 200.00× | 20.00× | **no** |" in md
    assert "| linear_scan | lab | 3.01× | 100.00× | 10.00× | yes |" in md
    assert "| matrix_scan | longT | 168.53× | n/a | n/a | n/a |" in md
    assert "queued behind a GPU sleep" in md


def test_parity_and_memory_templates(tmp_path):
    row = dict(op="x", shape="B=2", dtype="float32", direction="fwd", gate_atol=1e-5, gate_rtol=0.0,
               max_abs_err=1e-7, max_rel_err=1e-8, passed=False)
    md = report.render("scan_parity", dict(env=ENV, rows=[row]))
    assert "**0 / 1 pass**, 1 failing" in md and "**FAIL**" in md
    mem = dict(env=ENV, rows=[dict(mixer="m", shape="lab", path="generic", peak_bytes=2**20, time_us=10.0)],
               ratios=[dict(mixer="m", shape="lab", ratio=10.0, speedup=2.0)])
    assert "| m | lab | generic | 1.00 | 10.0 |" in report.render("scan_memory", mem)


def _roofline_inputs():
    """A bench payload with linear_scan_state rows (floor 1 us at 4 TB/s), peers and scaling."""
    from benchmarks.harness import grid

    rows = []
    for op in grid.OP_NAMES:
        for shape in grid.SHAPES:
            for direction in grid.DIRECTIONS:
                rows.append(dict(op=op, shape=shape, direction=direction, bytes=4_000_000, triton_us=2.0,
                                 eager_us=20.0, torch_compile_us=4.0))
    bench = dict(env=ENV, rows=rows, skipped=[], copy_bw=4.0e12)
    peers = {(s, p, d): 3e-6 for s in grid.SHAPES for p in grid.PEERS for d in grid.DIRECTIONS}
    large = grid.SHAPES["large"]
    per_elem = 2e-6 / (large.B * large.T * large.D)  # seconds per element at `large`
    scaling = {(op, t): per_elem * grid.SCALING_B * 2 ** t * grid.SCALING_D * (1.5 if t == 20 else 1.0)
               for op in grid.SCALING_OPS for t in grid.SCALING_LOG2T}
    return bench, peers, scaling


def test_roofline_payload_targets_and_render(tmp_path):
    from benchmarks.harness import roofline

    payload = roofline.payload(ENV, *_roofline_inputs())
    row = next(r for r in payload["rows"] if r["op"] == "linear_scan_state" and r["shape"] == "large")
    assert row["floor_us"] == 1.0 and row["pct"] == 50.0 and row["tbps"] == 2.0
    assert row["fla_chunk_hgrn_us"] == 3.0
    by = {(t["target"], t["op"], t["shape"], t["direction"]): t for t in payload["targets"]}
    assert not by["elementwise fwd at the roofline", "linear_scan_state", "large", "fwd"]["met"]  # 50% < 85%
    fla = by["vs fla-core chunk_hgrn", "linear_scan_state", "lab", "fwd"]
    assert fla["value"] == 1.5 and not fla["met"]  # bar 2x
    assert by["vs torch.compile of the eager reference", "linear_scan_state", "lab", "fwd"]["value"] == 2.0
    scal = [t for t in payload["targets"] if t["target"].startswith("scaling")]
    assert sum(not t["met"] for t in scal) == 2  # only T = 2^20 (1.5x) misses, for both ops
    md = report.write("scan_roofline", payload, tmp_path)[1].read_text()
    assert "| linear_scan_state | large | fwd | 4.0 | 2.0 | 1.0 | 2.00 | 50% | 4.0 | 20.0 |" in md
    assert "3.0 (1.50×)" in md and "**no**" in md
    # every unmet target says why and what was tried; met ones are not listed
    unmet = {t["target"] for t in payload["targets"] if not t["met"]}
    assert {s["target"] for s in payload["status"]} == unmet
    assert f"- **elementwise fwd at the roofline**: {roofline.TARGET_STATUS['elementwise fwd at the roofline']}" in md
    assert set(roofline.TARGET_STATUS) == {t[0] for t in roofline.TARGETS} | {roofline.SCALING_TARGET}


def test_roofline_plot_is_deterministic(tmp_path):
    from benchmarks.harness import roofline

    payload = roofline.payload(ENV, *_roofline_inputs())
    roofline.plot(payload, tmp_path / "a.png")
    roofline.plot(payload, tmp_path / "b.png")
    data = (tmp_path / "a.png").read_bytes()
    assert data.startswith(b"\x89PNG") and data == (tmp_path / "b.png").read_bytes()


def test_tried_figures_come_from_the_committed_tune_logs(monkeypatch, tmp_path):
    """Every TRIED entry names a record that the committed H200 tune logs hold; one that is
    not there is an error, not a silent gap; the figures reach the roofline markdown."""
    from benchmarks.harness import roofline

    figures = roofline.tried_figures(ROOT / "experiments" / "logs")
    assert set(figures) <= set(roofline.TARGET_STATUS)
    assert all(t["us"] > 0 and (t["base_us"] is None or t["base_us"] > 0) for ts in figures.values() for t in ts)
    target = "elementwise fwd at the roofline"  # unmet in the synthetic inputs (50% of copy)
    monkeypatch.setitem(roofline.TRIED, target, [("nothing", 13, dict(section="no such section"), None)])
    with pytest.raises(LookupError, match="no such section"):
        roofline.tried_figures(ROOT / "experiments" / "logs")
    tried = {target: [dict(what="a trial", run=99, log="x.json", us=2.0, base_us=4.0)]}
    payload = roofline.payload(ENV, *_roofline_inputs(), tried=tried)
    md = report.write("scan_roofline", payload, tmp_path)[1].read_text()
    assert "  - a trial: 2.0 us against 4.0 us (0.50×) (run 99, `x.json`)" in md


def test_call_form_table_divides_by_the_dense_call(tmp_path):
    """Issue 18's table: each form's time over the dense call's, packed met within 10%; a
    missing or n/a cell reads n/a, never met."""
    from benchmarks.harness import grid

    op = grid.FORM_OPS[0]
    device = {(op, "dense", "fwd"): 1e-3, (op, "reverse", "fwd"): 1.02e-3, (op, "packed", "fwd"): 1.2e-3,
              (op, "dense", "fwdbwd"): 2e-3, (op, "packed", "fwdbwd"): 2.1e-3, (op, "reverse", "fwdbwd"): float("nan")}
    rows = {(r["op"], r["direction"]): r for r in report.form_rows(device)}
    fwd, both = rows[op, "fwd"], rows[op, "fwdbwd"]
    assert fwd["ratio"]["reverse"] == pytest.approx(1.02) and fwd["ratio"]["packed"] == pytest.approx(1.2)
    assert fwd["met"] is False and both["met"] is True and both["ratio"]["reverse"] is None
    assert rows[grid.FORM_OPS[1], "fwd"]["met"] is None and rows[grid.FORM_OPS[1], "fwd"]["dense_us"] is None
    payload = dict(env=dict(ENV, time_method="track_device_time"), rows=[], skipped=[], copy_bw=None, seed=[],
                   forms=report.form_rows(device), form_names=[f for f in grid.FORMS if f != "dense"],
                   packed_target=report.PACKED_TARGET)
    md = report.write("scan_bench", payload, tmp_path)[1].read_text()
    assert f"| {op} | fwd | 1,000.0 | 1.020 | 1.200 |" in md and "| **no** |" in md
    assert f"| {op} | fwdbwd | 2,000.0 | n/a | 1.050 |" in md
    assert f"| {grid.FORM_OPS[1]} | fwd | n/a | n/a | n/a |" in md


def test_layer_table_compares_with_compiled_plain_torch():
    """Issue 19's table: compiled / kernel time and kernel / compiled peak per shape and dtype,
    met only when both hold; a missing cell is n/a, never met."""
    from benchmarks.harness import grid

    shape = next(iter(grid.LAYER_SHAPES))
    B, T, d = grid.LAYER_SHAPES[shape]
    m = "SignedMinGRU"
    cells = dict(seconds={(m, shape, "kernel", "fp32"): 1e-3, (m, shape, "plain_compile", "fp32"): 2e-3,
                          (m, shape, "plain_eager", "fp32"): 4e-3, (m, shape, "kernel", "bf16"): 1e-3,
                          (m, shape, "plain_compile", "bf16"): 1.2e-3},
                 peak_bytes={(m, shape, "kernel", "fp32"): 2**20, (m, shape, "plain_compile", "fp32"): 2**21,
                             (m, shape, "kernel", "bf16"): 2**20, (m, shape, "plain_compile", "bf16"): 2**21})
    rows = {(r["mixer"], r["shape"], r["dtype"]): r for r in report.layer_rows(cells)}
    assert {k[0] for k in rows} == set(grid.LAYER_MIXERS)
    fp32, bf16 = rows[m, f"({B}, {T}, {d})", "fp32"], rows[m, f"({B}, {T}, {d})", "bf16"]
    assert fp32["speedup"] == pytest.approx(2.0) and fp32["memory"] == pytest.approx(0.5) and fp32["met"] is True
    assert bf16["speedup"] == pytest.approx(1.2) and bf16["met"] is False
    assert fp32["mtokens"] == pytest.approx(B * T / 1e-3 / 1e6) and fp32["ms"]["cudnn_gru"] is None
    assert all(r["met"] is None for k, r in rows.items() if k[:2] != (m, f"({B}, {T}, {d})"))
    mem = dict(env=ENV, rows=[], ratios=[], layers=list(rows.values()), impls=grid.LAYER_IMPLS,
               target=report.LAYER_TARGET)
    md = report.render("scan_memory", mem)
    assert f"| {m} | ({B}, {T}, {d}) | fp32 | 1.00 | 4.00 | 2.00 | n/a | " in md and "| 2.00× | 0.50× | yes |" in md
    assert "| 1.20× | 0.50× | **no** |" in md
    assert "Whole layers" not in report.render("scan_memory", dict(env=ENV, rows=[], ratios=[]))


def test_environment_names_the_measured_tree_honestly(tmp_path, monkeypatch):
    """A results file names the commit measured: $SCANKIT_COMMIT where a device script set it,
    else HEAD, marked +modified when the measured code differs from HEAD (a stale .git)."""
    import shutil
    import subprocess

    monkeypatch.setenv("SCANKIT_COMMIT", "abc1234")
    assert report.environment()["commit"] == "abc1234"
    monkeypatch.delenv("SCANKIT_COMMIT")
    repo = tmp_path / "repo"
    (repo / "benchmarks" / "harness").mkdir(parents=True)
    (repo / "scankit").mkdir()
    shutil.copy(report.__file__, repo / "benchmarks" / "harness" / "report.py")
    (repo / "scankit" / "k.py").write_text("x = 1\n")
    git = lambda *a: subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *a], cwd=repo, check=True,
                                    capture_output=True, text=True).stdout.strip()
    git("init", "-q")
    git("add", "-A")
    git("commit", "-qm", "one")
    head = git("rev-parse", "HEAD")
    monkeypatch.setattr(report, "__file__", str(repo / "benchmarks" / "harness" / "report.py"))
    assert report._checkout_commit() == head
    (repo / "scankit" / "k.py").write_text("x = 2\n")
    assert report._checkout_commit() == head + "+modified"
