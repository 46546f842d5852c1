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
    done = subprocess.run([sys.executable, "scripts/compile_for_gpu.py", "--arch", "90", "--sms", "132"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "compiled for sm_90" in done.stdout and "givens._fwd_kernel" in done.stdout, done.stdout
