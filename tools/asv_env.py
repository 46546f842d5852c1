"""Run by asv inside a fresh virtualenv environment (asv.conf.json ``install_command``):
make the machine's torch and triton importable there without installing them.

asv installs each measured commit of scankit into its own environment (``pip install
--no-deps``), so ``asv run A..B``, ``asv continuous`` and ``asv find`` measure the commits
themselves. torch and triton are not installed into it (no package index on the GPU
machine, gigabytes per environment): a ``.pth`` file in the environment's site-packages
lists the site-packages of the interpreter that has them, after the environment's own (so
the environment's scankit is the one imported; the listed directories' own .pth files, an
editable scankit among them, are not processed).

That interpreter is ``$SCANKIT_ASV_SITE_PYTHON`` if set, else the first ``python3`` on PATH
after the environment's own bin directory that imports torch and triton.
"""
import json
import os
import shutil
import subprocess
import sys
import sysconfig

PTH = "scankit-asv-machine-site.pth"
PROBE = ("import json, sys, sysconfig, torch, triton; "
         "print(json.dumps(dict(python=sys.executable, torch=torch.__version__, triton=triton.__version__, "
         "sites=sorted({sysconfig.get_paths()[k] for k in ('purelib', 'platlib')}))))")


def _probe(python: str):
    try:
        out = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 and out.stdout.strip() else None


def machine_python() -> dict:
    """The interpreter whose torch and triton the environment reuses (see the module doc)."""
    named = os.environ.get("SCANKIT_ASV_SITE_PYTHON")
    if named:
        found = _probe(named)
        if found is None:
            sys.exit(f"asv_env: SCANKIT_ASV_SITE_PYTHON={named} does not import torch and triton")
        return found
    env_bin = os.path.realpath(os.path.dirname(sys.executable))
    tried = []
    for entry in os.environ.get("PATH", "").split(os.pathsep):
        if not entry or os.path.realpath(entry) == env_bin:
            continue
        python = shutil.which("python3", path=entry)
        if python and python not in tried:
            tried.append(python)
            found = _probe(python)
            if found:
                return found
    sys.exit("asv_env: no python3 on PATH imports torch and triton (tried: " + ", ".join(tried or ["none"]) +
             "); set SCANKIT_ASV_SITE_PYTHON to the interpreter that does")


def main() -> int:
    found = machine_python()
    mine = sysconfig.get_paths()["purelib"]
    sites = [s for s in found["sites"] if os.path.realpath(s) != os.path.realpath(mine)]
    path = os.path.join(mine, PTH)
    with open(path + ".tmp", "w") as f:
        f.write("".join(s + "\n" for s in sites))
    os.replace(path + ".tmp", path)
    print(f"asv_env: {path} -> torch {found['torch']}, triton {found['triton']} from {found['python']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
