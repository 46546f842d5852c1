"""Record this machine for asv, GPU included: ``python tools/asv_machine.py --machine h200``.

asv's own ``asv machine`` knows the OS, CPU and RAM. This writes the same entry into
~/.asv-machine.json (which ``asv run --machine NAME`` reads) with what a GPU result depends
on beside them: GPU name, SM count, memory, driver, CUDA, torch and triton. asv copies every
field into each run's machine.json and result params, so the dashboard shows them and a
driver or torch change starts a new series instead of passing for a commit's effect.
"""
import argparse
import json
import os
import platform
import subprocess
import sys


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _ram() -> str:
    try:
        return str(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError):
        return "unknown"


# asv machine names that stand for one GPU: a run filed under one comes from that GPU only
# (an H100 lent for an H200 call must not extend the h200 history)
GPU_MACHINES = {"h200": "H200", "h100": "H100"}


def _smi(field: str, missing: str) -> str:
    """The first GPU's ``field`` from nvidia-smi (``missing`` without a GPU or nvidia-smi)."""
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return missing
    lines = out.stdout.strip().splitlines() if out.returncode == 0 else []
    return lines[0].strip() if lines else missing


def gpu_name() -> str:
    """The first GPU's name ("none" without one), torch not imported."""
    return _smi("name", "none")


def machine_for(gpu: str) -> str:
    """The asv machine name of this GPU; ValueError for a GPU that has none."""
    for machine, marker in GPU_MACHINES.items():
        if marker in gpu:
            return machine
    raise ValueError(f"asv_machine: no machine name for the GPU '{gpu}' (known: {GPU_MACHINES}); pass --machine NAME")


def check_machine(machine: str, gpu: str) -> None:
    """ValueError where ``machine`` stands for another GPU than ``gpu``."""
    marker = GPU_MACHINES.get(machine)
    if marker is not None and marker not in gpu:
        raise ValueError(f"asv_machine: --machine {machine} is the {marker}'s history, but this GPU is '{gpu}'")


def describe(machine: str) -> dict:
    import torch
    import triton

    info = dict(machine=machine, os=f"{platform.system()} {platform.release()}", arch=platform.machine(),
                cpu=_cpu_model(), num_cpu=str(os.cpu_count()), ram=_ram(), torch=torch.__version__,
                triton=triton.__version__, cuda=str(torch.version.cuda))
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, gpu_count=str(torch.cuda.device_count()), sm_count=str(props.multi_processor_count),
                    gpu_memory_gib=f"{props.total_memory / 2**30:.0f}")
        info["driver"] = _smi("driver_version", "unknown")
    else:
        info.update(gpu="none")
    return info


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--machine", help="the machine's name in the results (e.g. h200; refused where it names "
                                      "another GPU than this one)")
    ap.add_argument("--name", action="store_true", help="only print this GPU's machine name (h200, h100)")
    ap.add_argument("--path", default=os.path.expanduser("~/.asv-machine.json"))
    args = ap.parse_args()
    try:
        if args.name:
            print(machine_for(gpu_name()))
            return 0
        if not args.machine:
            ap.error("--machine is required (or --name)")
        check_machine(args.machine, gpu_name())
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    entry = describe(args.machine)
    known = {}
    if os.path.exists(args.path):
        with open(args.path) as f:
            known = json.load(f)
    known[args.machine] = entry
    known["version"] = 1
    tmp = args.path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(known, f, indent=4, sort_keys=True)
    os.replace(tmp, args.path)
    print(json.dumps(entry, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
