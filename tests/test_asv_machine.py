"""tools/asv_machine.py names the asv machine from the GPU and refuses a name that stands for
another GPU, so a run on a lent H100 never lands in the h200 history."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import asv_machine  # noqa: E402


@pytest.mark.parametrize("gpu,machine", [("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100"),
                                         ("NVIDIA H100 NVL", "h100")])
def test_the_machine_is_named_from_the_gpu(gpu, machine):
    assert asv_machine.machine_for(gpu) == machine
    asv_machine.check_machine(machine, gpu)


@pytest.mark.parametrize("gpu", ["none", "NVIDIA A100-SXM4-80GB"])
def test_a_gpu_without_a_machine_name_is_an_error_naming_it(gpu):
    with pytest.raises(ValueError, match=gpu):
        asv_machine.machine_for(gpu)


def test_a_machine_of_another_gpu_is_refused():
    with pytest.raises(ValueError, match=r"h200 is the H200's history, but this GPU is 'NVIDIA H100 80GB HBM3'"):
        asv_machine.check_machine("h200", "NVIDIA H100 80GB HBM3")
    with pytest.raises(ValueError, match="h100"):
        asv_machine.check_machine("h100", "none")
    asv_machine.check_machine("my-workstation", "NVIDIA A100-SXM4-80GB")  # a name of the user's own: any GPU


def test_the_command_refuses_with_exit_2_and_writes_nothing(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"  # a pretend H100
    smi.write_text("#!/bin/sh\necho 'NVIDIA H100 80GB HBM3'\n")
    smi.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    run = lambda *args: subprocess.run([sys.executable, str(ROOT / "tools" / "asv_machine.py"), *args],  # noqa: E731
                                       capture_output=True, text=True, env=env, timeout=120)
    named = run("--name")
    assert named.returncode == 0 and named.stdout.strip() == "h100", named
    path = tmp_path / "machine.json"
    refused = run("--machine", "h200", "--path", str(path))
    assert refused.returncode == 2 and "this GPU is 'NVIDIA H100 80GB HBM3'" in refused.stderr, refused
    assert not path.exists()
