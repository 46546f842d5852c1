"""Every kernel specialization of the shape classes compiles for sm_90 (H100/H200) through
Triton's real compiler, down to a cubin, without a GPU (scripts/compile_for_gpu.py): the
compile errors the interpreter cannot see (session 8: a fold loop's variable reused by the
kernel's own loop passed every interpreter test and would have failed on the H200)."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_kernel_compiles_for_the_h200():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "scripts/compile_for_gpu.py", "--arch", "90", "--sms", "132", "--resources"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "compiled for sm_90" in done.stdout and "givens._fwd_kernel" in done.stdout, done.stdout
    rows = [line for line in done.stdout.splitlines() if " specializations" in line and not line.startswith("all ")]
    assert len(rows) >= 12, done.stdout
    for row in rows:  # each kernel's registers per thread from its cubins (sm_90 has 255 at most)
        low, high = map(int, row.split("registers ")[1].split()[0].split("-"))
        assert 0 < low <= high <= 255, row


def test_host_cost_splits_each_call_into_scankit_and_triton(tmp_path):
    """scripts/host_cost.py without a GPU: every op's forward and fwd+bwd at lab, launches
    compiled for sm_90 and replayed through Triton's binder, the rest scankit's (values not
    asserted: host speed is the machine's, and CI's is shared)."""
    import json

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = tmp_path / "host.json"
    done = subprocess.run([sys.executable, "scripts/host_cost.py", "--calls", "20", "--json", str(out)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    rows = json.loads(out.read_text())["rows"]
    floors = rows[-2:]
    rows = rows[:-2]
    assert [(f["op"], f["direction"]) for f in floors] == [("torch floor", "fwd"), ("torch floor", "fwdbwd")]
    assert all(f["total_us"] > 0 for f in floors), floors
    assert [(r["op"], r["direction"]) for r in rows] == [
        (op, direction) for op in ("parallel_scan_log", "linear_scan", "linear_scan_state", "matrix_scan",
                                   "matrix_affine_scan") for direction in ("fwd", "fwdbwd")]
    for r in rows:
        assert r["launches"] == (1 if r["direction"] == "fwd" else 2), r  # lab: one pass each way
        assert 0 < r["triton_us"] < r["total_us"] and abs(r["scankit_us"] + r["triton_us"] - r["total_us"]) < 0.15, r
        assert r["wrap_fwd_us"] > 0 and (r["wrap_bwd_us"] > 0) == (r["direction"] == "fwdbwd"), r
