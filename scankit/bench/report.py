"""Write the committed artifacts (json + markdown through jinja2 templates), deterministically."""
from __future__ import annotations

import datetime as _dt
import json
import os
import subprocess
from pathlib import Path

TEMPLATES = Path(__file__).resolve().parents[2] / "tools" / "templates"


def environment(commit: str | None = None) -> dict:
    """torch, triton, device, driver, commit and UTC time of the current process."""
    import torch

    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = "absent"
    driver = "n/a"
    if torch.cuda.is_available():
        try:
            driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                    capture_output=True, text=True, timeout=30).stdout.strip().splitlines()[0]
        except (OSError, IndexError, subprocess.SubprocessError):
            driver = "unknown"
    if commit is None:
        root = Path(__file__).resolve().parents[2]
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True).stdout.strip()
    return dict(
        torch=torch.__version__, triton=triton_version,
        device=torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        driver=driver, commit=commit or "unknown",
        time=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    )


def _sci(x):
    return "" if x is None else f"{x:.2e}"


def _num(x, digits=1):
    return "" if x is None else f"{x:,.{digits}f}"


def render(name: str, payload: dict) -> str:
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    env.filters.update(sci=_sci, num=_num)
    return env.get_template(f"{name}.md.j2").render(**payload)


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write(name: str, payload: dict, out_dir) -> list[Path]:
    """Write ``name``.json and ``name``.md under out_dir (each replaced atomically)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    md = render(name, payload)  # render first: a template error leaves the old files intact
    paths = [out_dir / f"{name}.json", out_dir / f"{name}.md"]
    _atomic_write(paths[0], json.dumps(payload, indent=1, sort_keys=True) + "\n")
    _atomic_write(paths[1], md)
    return paths
