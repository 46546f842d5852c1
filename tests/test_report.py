"""Artifact templates render every field and write deterministically."""
import json

from scankit.bench import report

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


def test_parity_and_memory_templates(tmp_path):
    row = dict(op="x", shape="B=2", dtype="float32", direction="fwd", gate_atol=1e-5, gate_rtol=0.0,
               max_abs_err=1e-7, max_rel_err=1e-8, passed=False)
    md = report.render("scan_parity", dict(env=ENV, rows=[row]))
    assert "**0 / 1 pass**, 1 failing" in md and "**FAIL**" in md
    mem = dict(env=ENV, rows=[dict(mixer="m", shape="lab", path="generic", peak_bytes=2**20, time_us=10.0)],
               ratios=[dict(mixer="m", shape="lab", ratio=10.0, speedup=2.0)])
    assert "| m | lab | generic | 1.00 | 10.0 |" in report.render("scan_memory", mem)
