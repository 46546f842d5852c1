"""Write the committed artifacts (json + markdown through jinja2 templates), deterministically."""
from __future__ import annotations

import datetime as _dt
import itertools
import json
import math
import os
import subprocess
from pathlib import Path

TEMPLATES = Path(__file__).resolve().parents[2] / "tools" / "templates"


def _checkout_commit() -> str | None:
    """HEAD of this checkout, with ``+modified`` when the measured code (scankit, benchmarks,
    tools, scripts) differs from it: a copy whose .git is stale (the GPU machine's) says so
    instead of naming a commit it does not hold."""
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(["git", "rev-parse", "--verify", "--quiet", "HEAD"], cwd=root, capture_output=True, text=True)
    if out.returncode != 0:
        return None
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", "scankit", "benchmarks",
                            "tools", "scripts"], cwd=root, capture_output=True, text=True)
    return out.stdout.strip() + ("+modified" if dirty.returncode != 0 or dirty.stdout.strip() else "")


def environment(commit: str | None = None) -> dict:
    """torch, triton, device, driver, commit and UTC time of the current process: the commit is
    ``commit``, else $SCANKIT_COMMIT (what a device script was told it runs), else the checkout's."""
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
        commit = os.environ.get("SCANKIT_COMMIT") or _checkout_commit()
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


# ---------------------------------------------------------------- payloads (driver and renderer)

def bench_payload(env: dict, cells: dict, copy_bw: float, seed: list | None = None) -> dict:
    """Rows of scan_bench from ``suite.op_cells`` output (keys (op, shape, impl, direction))."""
    from . import grid

    ops = [o for o in grid.OP_NAMES if any(k[0] == o for k in cells["bytes"])]
    shapes = [s for s in grid.SHAPES if any(k[1] == s for k in cells["bytes"])]
    rows = []
    for op in ops:
        for shape in shapes:
            for direction in grid.DIRECTIONS:
                row = dict(op=op, shape=shape, direction=direction, bytes=cells["bytes"][op, shape, direction])
                for impl in grid.IMPLS:
                    seconds = cells["seconds"].get((op, shape, impl, direction))
                    row[f"{impl}_us"] = None if seconds is None else seconds * 1e6
                    row[f"{impl}_peak_bytes"] = cells["peak_bytes"].get((op, shape, impl, direction))
                rows.append(row)
    skipped = [dict(op=k[0], shape=k[1], impl=k[2], reason=r) for k, r in sorted(cells["skipped"].items())
               if k[3] == "fwd"]
    return dict(env=env, rows=rows, skipped=skipped, copy_bw=copy_bw, seed=seed or [], forms=[],
                form_names=[f for f in grid.FORMS if f != "dense"], packed_target=PACKED_TARGET)


PACKED_TARGET = 1.10  # issue 18: a packed call within 10% of the dense call of the same size


def _recorded(table: dict, key):
    """``table[key]``, or None where the run has none or asv recorded n/a (NaN)."""
    value = table.get(key)
    return None if value is None or math.isnan(value) else value


def form_rows(device: dict) -> list[dict]:
    """The call forms (grid.FORMS) beside the dense call, from ``suite.form_cells``'s device
    time ({(op, form, direction): seconds}; missing or n/a = None): the dense call's us, each
    other form's time over it, a per-sequence loop's over the packed call's where both are
    forms, and issue 18's packed target."""
    from . import grid

    rows = []
    for op in grid.FORM_OPS:
        for direction in grid.DIRECTIONS:
            t = {f: _recorded(device, (op, f, direction)) for f in grid.FORMS}
            dense = t["dense"]
            ratio = {f: t[f] / dense if dense and t[f] else None for f in grid.FORMS if f != "dense"}
            looped, packed = t.get("looped"), t.get("packed")
            rows.append(dict(op=op, direction=direction, dense_us=dense * 1e6 if dense else None, ratio=ratio,
                             looped_over_packed=looped / packed if looped and packed else None,
                             met=None if ratio.get("packed") is None else ratio["packed"] <= PACKED_TARGET))
    return rows


# issue 17 goal 2, % of copy (met: at least the bar): k = 8, v = 1 fwd 60 and fwd+bwd 50; the other widths fwd 40
BLOCK_BARS = {("k8v1", "fwd"): 60, ("k8v1", "fwdbwd"): 50, ("k4v1", "fwd"): 40, ("k16v1", "fwd"): 40,
              ("k16v16", "fwd"): 40}


def block_rows(device: dict, moved: dict, copy_bw: float) -> list[dict]:
    """Issue 17's block widths (grid.BLOCK_*) from ``suite.block_cells``'s device time and bytes
    ({(shape, width, direction): seconds / bytes}; missing or n/a = None): us, % of copy (bytes /
    time / ``copy_bw``) and the goal's bar where it sets one."""
    from . import grid

    rows = []
    for shape in grid.BLOCK_SHAPES:
        for width, (k, v) in grid.BLOCK_WIDTHS.items():
            for direction in grid.DIRECTIONS:
                t, b = _recorded(device, (shape, width, direction)), _recorded(moved, (shape, width, direction))
                pct = 100 * b / t / copy_bw if t and b else None
                bar = BLOCK_BARS.get((width, direction))
                rows.append(dict(shape=shape, n=grid.SHAPES[shape].d // k, k=k, v=v, direction=direction,
                                 us=t * 1e6 if t else None,
                                 mb=b / 1e6 if b else None, pct=pct, bar=bar,
                                 met=None if bar is None or pct is None else pct >= bar))
    return rows


def seed_rows(device: dict, latency: dict) -> list:
    """Triton's fwd+bwd speedup over eager at the seed's shapes (grid.SEED_SPEEDUPS), in device
    time and in call latency ({(op, shape, impl, direction): seconds} each), beside the
    seed's; a cell missing from a table reads None."""
    from . import grid

    def speedup(table, op, shape):
        triton, eager = (table.get((op, shape, impl, "fwdbwd")) for impl in ("triton", "eager"))
        return eager / triton if triton and eager else None

    rows = []
    for (op, shape), seed in grid.SEED_SPEEDUPS.items():
        by_device, by_latency = speedup(device, op, shape), speedup(latency, op, shape)
        rows.append(dict(op=op, shape=shape, seed=seed, device=by_device, latency=by_latency,
                         met=None if None in (by_device, by_latency) else min(by_device, by_latency) >= seed))
    return rows


def parity_payload(env: dict, rows: list) -> dict:
    return dict(env=env, rows=rows)


def memory_payload(env: dict, cells: dict) -> dict:
    """Rows of scan_memory from ``suite.mixer_cells`` output (keys (shape, path))."""
    from . import grid

    rows, ratios = [], []
    for shape in grid.MEMORY_SHAPES:
        s = grid.SHAPES[shape]
        label = f"{shape} (B={s.B}, T={s.T})"
        for path in grid.MIXER_PATHS:
            rows.append(dict(mixer=grid.MEMORY_MIXER, shape=label, path=path,
                             peak_bytes=cells["peak_bytes"][shape, path], time_us=cells["seconds"][shape, path] * 1e6))
        generic, kernel = rows[-2], rows[-1]
        ratios.append(dict(mixer=grid.MEMORY_MIXER, shape=label,
                           ratio=generic["peak_bytes"] / kernel["peak_bytes"],
                           speedup=generic["time_us"] / kernel["time_us"]))
    return dict(env=env, rows=rows, ratios=ratios)


LAYER_TARGET = 1.5  # issue 19: the kernel layer trains this much faster than torch.compile of plain torch


def layer_rows(cells: dict, measured_only: bool = False) -> list[dict]:
    """Rows of scan_memory's layer table from ``suite.layer_cells`` output (keys (mixer, shape,
    impl, dtype); a missing or n/a cell is None): each impl's step time, the kernel layer's
    tokens/s, and issue 19's target against torch.compile of plain torch (time and peak memory).
    With ``measured_only``, rows none of whose cells has a time are left out (a partial run)."""
    from . import grid

    rows = []
    for mixer, (shape, (B, T, d)) in itertools.product(grid.LAYER_MIXERS, grid.LAYER_SHAPES.items()):
        for dtype in grid.LAYER_DTYPES:
            def get(impl, table="seconds"):
                return _recorded(cells[table], (mixer, shape, impl, dtype))

            if measured_only and all(get(impl) is None for impl in grid.LAYER_IMPLS):
                continue

            kernel, compiled = get("kernel"), get("plain_compile")
            k_peak, c_peak = get("kernel", "peak_bytes"), get("plain_compile", "peak_bytes")
            speedup = compiled / kernel if kernel and compiled else None
            memory = k_peak / c_peak if k_peak and c_peak else None
            met = None if speedup is None or memory is None else speedup >= LAYER_TARGET and memory <= 1.0
            ms = {impl: None if get(impl) is None else get(impl) * 1e3 for impl in grid.LAYER_IMPLS}
            rows.append(dict(mixer=mixer, shape=f"({B}, {T}, {d})", dtype=dtype, ms=ms,
                             mtokens=B * T / kernel / 1e6 if kernel else None, speedup=speedup, memory=memory,
                             met=met))
    return rows


def stack_rows(cells: dict) -> list[dict]:
    """Rows of the stack table from ``suite.stack_cells`` output (keys (shape, impl, dtype)): the
    eager and compiled step (ms), eager / compiled, and the peaks (MiB); a missing cell is None."""
    from . import grid

    rows = []
    for (shape, (B, T, d)), dtype in itertools.product(grid.STACK_SHAPES.items(), grid.LAYER_DTYPES):
        def get(impl, table="seconds", scale=1.0):
            v = _recorded(cells[table], (shape, impl, dtype))
            return None if v is None else v * scale

        eager, compiled = get("kernel"), get("kernel_compile")
        if eager is None and compiled is None:
            continue
        rows.append(dict(shape=f"({B}, {T}, {d})", dtype=dtype, eager_ms=get("kernel", scale=1e3),
                         compiled_ms=get("kernel_compile", scale=1e3),
                         speedup=eager / compiled if eager and compiled else None,
                         eager_mib=get("kernel", "peak_bytes", 2**-20),
                         compiled_mib=get("kernel_compile", "peak_bytes", 2**-20)))
    return rows


def layers_payload(env: dict, cells: dict, stacks: dict | None = None) -> dict:
    """scan_layers (the direct driver's ``--layers`` / ``--stacks``): the measured rows of the
    layer table and of the stack table."""
    from . import grid

    failed = {**cells.get("failed", {}), **(stacks or {}).get("failed", {})}
    return dict(env=env, impls=grid.LAYER_IMPLS, target=LAYER_TARGET, layers=layer_rows(cells, measured_only=True),
                stacks=stack_rows(stacks) if stacks else [], stack_mixers=grid.STACK_MIXERS,
                failed={" ".join(k): v for k, v in failed.items()})


def layers_table(payload: dict) -> str:
    """The short plain-text layer table a GPU run prints last (ms, median device time)."""
    from tabulate import tabulate

    impls = payload["impls"]
    table = [(r["mixer"], r["shape"], r["dtype"], *(r["ms"][i] for i in impls), r["speedup"], r["memory"])
             for r in payload["layers"]]
    head = ["layer", "(B, T, d)", "dtype", *(f"{i} ms" for i in impls), "compiled/kernel", "kernel/compiled peak"]
    text = tabulate(table, head, floatfmt=".3f", missingval="-") if table else ""
    if payload.get("stacks"):
        rows = [(r["shape"], r["dtype"], r["eager_ms"], r["compiled_ms"], r["speedup"], r["eager_mib"], r["compiled_mib"])
                for r in payload["stacks"]]
        text += ("\n\n" if text else "") + "MinGRUStack (" + ", ".join(payload["stack_mixers"]) + "), kernels:\n" + tabulate(
            rows, ["(B, T, d)", "dtype", "eager ms", "compiled ms", "eager/compiled", "eager MiB", "compiled MiB"],
            floatfmt=".3f", missingval="-")
    return text


def bench_table(payload: dict) -> str:
    """The short plain-text table a GPU run prints last."""
    from tabulate import tabulate

    bw = payload["copy_bw"]
    table = [(r["op"], r["shape"], r["direction"], r["triton_us"], r["eager_us"], r["torch_compile_us"],
              f"{100 * r['bytes'] / (r['triton_us'] * 1e-6) / bw:.0f}%") for r in payload["rows"]]
    head = ["op", "shape", "dir", "triton us", "eager us", "compile us", "% copy bw"]
    return f"copy bandwidth {bw / 1e12:.2f} TB/s\n" + tabulate(table, head, floatfmt=".1f", missingval="-")
