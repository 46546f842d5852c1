"""The roofline artifact (experiments/bench/scan_roofline.{md,json,png}): every op's time
against the bandwidth floor of the same run, the peers side by side, the scaling with T,
issue 7's targets evaluated on the figures (met or not, with the measured value), and issue
16's cells: scankit beside accelerated-scan on its own layout, and the cliff sweep's heatmap
(scan_cliffs.png)."""
from __future__ import annotations

from . import grid
from .report import _recorded

# (what, ops, shapes, directions, kind, bar) - kind "pct": % of copy >= bar; "vs": triton at
# least bar x faster than impl; "small": fwdbwd at least bar x faster than eager
TARGETS = (
    ("elementwise fwd at the roofline", (grid.STATE_OP, "parallel_scan_log"), ("large", "vlong"), ("fwd",), "pct", 85),
    ("elementwise fwd+bwd at the roofline", (grid.STATE_OP, "parallel_scan_log"), ("large", "vlong"), ("fwdbwd",), "pct", 70),
    ("matrix_scan fwd", ("matrix_scan",), ("large", "vlong"), ("fwd",), "pct", 60),
    ("matrix_affine_scan (k=8) fwd", ("matrix_affine_scan",), ("large", "vlong"), ("fwd",), "pct", 40),
    ("vs accelerated-scan (with the (B,T,D) transposes)", (grid.STATE_OP,), tuple(grid.SHAPES), grid.DIRECTIONS,
     "accelerated_scan", 1.0),
    ("vs fla-core chunk_hgrn", (grid.STATE_OP,), tuple(grid.SHAPES), grid.DIRECTIONS, "fla_chunk_hgrn", 2.0),
    ("vs torch.compile of the eager reference", (grid.STATE_OP,), tuple(grid.SHAPES), grid.DIRECTIONS,
     "torch_compile", 3.0),
    ("small shapes fwd+bwd vs eager", grid.OP_NAMES, ("lab", "longT"), ("fwdbwd",), "eager", 5.0),
)
SCALING_TOLERANCE = 0.20
SCALING_TARGET = "scaling: time per element within 20% of `large`"

# Where a target is not met: the reason as far as measured, and what was tried. Figures live
# in NOTES.md and the device logs under experiments/logs (typed here they could go stale).
TARGET_STATUS = {
    "elementwise fwd at the roofline":
        "`large`: one pass reads each input and writes h once; the rest of the gap is not yet profiled at "
        "the instruction level (per-tile scan and last-row reductions, 32-wide D tiles). `vlong` (B = 1): "
        "too few lanes for one walking pass. Tried: tile shapes (run 3), a pipelined tile loop (run 7, "
        "adopted for the log kernel), more programs per SM once T is chunked (runs 10, 13-14: adopted), and "
        "a single-pass decoupled look-back kernel, one tile per program, no summary pass (runs 13-14: adopted "
        "for linear_scan where T would be chunked; slower than the walking kernel at `large`, and for the "
        "log op, whose exps it does per tile). Figures: NOTES.md, session 4.",
    "elementwise fwd+bwd at the roofline":
        "As the forward, and the backward is a reverse pass that re-reads the saved outputs. Tried: "
        "pipelined backward tile loops (run 7, adopted); the look-back backward (runs 13-14, adopted with the "
        "forward).",
    "matrix_scan fwd":
        "The 2x2 kernels walk one lane per block with six loads per step: latency-bound at `vlong` (B = 1: few "
        "lanes, T-chunked). Tried: a tile scan of the six components (run 10, slower, reverted); sequential "
        "one-lane 2x2 kernels, forward and backward (runs 13-15: adopted from T = 256; several times faster "
        "than the generic block kernel at `large`, though their time varied between runs: NOTES.md, session 4).",
    "matrix_affine_scan (k=8) fwd":
        "Each step multiplies k x k blocks in fp32 registers (tl.dot's TF32 breaks the 1e-5 gate, and k < 16): "
        "compute-bound per step. Tried: blocks per program, warps, programs per SM (run 7: one block per "
        "program and 2 warps adopted).",
    "vs accelerated-scan (with the (B,T,D) transposes)":
        "At `lab` and `longT` scankit's call is host-bound (the Triton launcher and autograd on the host, "
        "where accelerated-scan's CUDA extension launches with less host work); at `large` and `vlong` it is "
        "met. Peers now run in a worker process replaced after a CUDA fault (run 11 lost every peer cell to "
        "one).",
    "vs fla-core chunk_hgrn":
        "`large`: the walking kernel's gap to the copy bandwidth (above); `lab` / `longT`: host-bound as "
        "above. Met at `vlong`.",
    "vs torch.compile of the eager reference":
        "At `lab` and `longT` both sides are host-bound and one scankit call costs more host time than "
        "torch.compile's graph call (mostly the Triton launcher's host work per launch: tune_scans host "
        "profiles, NOTES.md). Tried: no custom-op dispatch and no wrap_triton tracing in "
        "eager calls (session 2); host geometry without triton.cdiv and two launches instead of the chunked "
        "path's five (session 4). Met at `large` and `vlong`.",
    "small shapes fwd+bwd vs eager":
        "The elementwise ops are host-bound at `lab` and `longT` (as above), where eager's few large torch "
        "ops are cheap; the block ops meet it. Host-bound cells also vary between runs of one commit "
        "(experiments/logs/2026-11-30-h200-run16-vs-run17-same-commit.md).",
    SCALING_TARGET:
        "At B = 1 and short T one call is host-bound (flat time). At long T the time per element is flat but "
        "above `large`'s: linear_scan_state runs the look-back kernel (one tile per program, each with a "
        "ticket and a look-back), parallel_scan_log the chunked passes (a summary pass reads the inputs a "
        "second time).",
}



def _lb(**kw):
    return dict(section="lookback", **kw)


# What was tried for each unmet target, with its figures read from the committed H200 tune
# logs (experiments/logs/2026-11-30-h200-tune-scans-run<N>.json, written by
# scripts/tune_scans.py): (what, run, the trial's record, the baseline's record in the same
# run or None). A record is the first one whose fields equal the given ones.
_STATE_VLONG = dict(op="linear_scan_state", shape="vlong")
TRIED = {
    "elementwise fwd at the roofline": [
        ("log kernel, 3-stage pipelined tile loop, log fwd at large, against Triton's default", 7,
         dict(section="elementwise", stages=3, per_sm=4, op="parallel_scan_log", shape="large", direction="fwd"),
         dict(section="elementwise", stages=None, per_sm=4, op="parallel_scan_log", shape="large", direction="fwd")),
        ("look-back kernel, (64, 32, 4) tiles, state fwd at large, against the walking kernel", 13,
         _lb(mode="always", tile=None, window=16, op="linear_scan_state", shape="large", direction="fwd"),
         _lb(mode="off", op="linear_scan_state", shape="large", direction="fwd")),
        ("look-back kernel, (128, 32, 4) tiles, state fwd at vlong, against the chunked passes", 13,
         _lb(mode="always", tile=[128, 32, 4], direction="fwd", **_STATE_VLONG),
         _lb(mode="off", direction="fwd", **_STATE_VLONG)),
        ("16 programs per SM once chunked, log fwd at vlong, against 4", 14,
         _lb(config="lb-linear-128+ch0/16", op="parallel_scan_log", shape="vlong", direction="fwd"),
         _lb(config="run11", op="parallel_scan_log", shape="vlong", direction="fwd")),
    ],
    "elementwise fwd+bwd at the roofline": [
        ("look-back fwd and bwd with 16 programs per SM once chunked, state fwd+bwd at vlong", 14,
         _lb(config="lb-linear-128+ch0/16", direction="fwdbwd", **_STATE_VLONG),
         _lb(config="run11", direction="fwdbwd", **_STATE_VLONG)),
    ],
    "matrix_scan fwd": [
        ("2x2 tile scan of the six components, best tile (16, 32, 2 warps), large fwd", 10,
         dict(section="matrix2", block_t=16, block_n=32, warps=2, stages=None, shape="large", direction="fwd"), None),
        ("sequential one-lane 2x2 forward (64 lanes, 2 warps), large fwd, against the generic kernel", 13,
         dict(section="matrix2", point=[64, 2, 16, None], shape="large", direction="fwd"),
         dict(section="matrix2", point=None, shape="large", direction="fwd")),
        ("2x2 forward and backward (32 lanes, 1 warp), large fwd+bwd, against the generic kernels", 15,
         dict(section="matrix2", point=[32, 1, 32, None], shape="large", direction="fwdbwd"),
         dict(section="matrix2", point=None, shape="large", direction="fwdbwd")),
        ("the same at vlong fwd", 15,
         dict(section="matrix2", point=[32, 1, 32, None], shape="vlong", direction="fwd"),
         dict(section="matrix2", point=None, shape="vlong", direction="fwd")),
    ],
    "matrix_affine_scan (k=8) fwd": [
        ("one block per program (512-element product), 2 warps, against 2048 and 4 warps, large fwd", 7,
         dict(section="affine", per_sm=4, min_chunk=32, product_elems=512, warps=2, op="matrix_affine_scan",
              shape="large", direction="fwd"),
         dict(section="affine", per_sm=4, min_chunk=32, product_elems=2048, warps=4, op="matrix_affine_scan",
              shape="large", direction="fwd")),
        ("32 programs per SM against 4, large fwd", 7,
         dict(section="affine", per_sm=32, min_chunk=32, product_elems=512, warps=2, op="matrix_affine_scan",
              shape="large", direction="fwd"),
         dict(section="affine", per_sm=4, min_chunk=32, product_elems=512, warps=2, op="matrix_affine_scan",
              shape="large", direction="fwd")),
    ],
    "vs torch.compile of the eager reference": [
        ("two launches (look-back) instead of the chunked path's five, state fwd at lab", 14,
         _lb(config="lb-linear-128+ch0/16", op="linear_scan_state", shape="lab", direction="fwd"),
         _lb(config="run11", op="linear_scan_state", shape="lab", direction="fwd")),
    ],
    "small shapes fwd+bwd vs eager": [
        ("two launches (look-back) instead of the chunked path's five, state fwd+bwd at lab", 14,
         _lb(config="lb-linear-128+ch0/16", op="linear_scan_state", shape="lab", direction="fwdbwd"),
         _lb(config="run11", op="linear_scan_state", shape="lab", direction="fwdbwd")),
    ],
    SCALING_TARGET: [
        ("look-back kernel, (128, 32, 4) tiles, state fwd at B = 1, T = 2^20, against the chunked passes", 13,
         _lb(mode="always", tile=[128, 32, 4], op="linear_scan_state", shape="{'B': 1, 'T': 1048576, 'D': 1024}"),
         _lb(mode="off", op="linear_scan_state", shape="{'B': 1, 'T': 1048576, 'D': 1024}")),
    ],
}
TUNE_LOG = "2026-11-30-h200-tune-scans-run{}.json"


def tried_figures(logs_dir) -> dict:
    """{target: [dict(what, run, log, us, base_us)]} of TRIED, read from the tune logs in
    ``logs_dir``; raises LookupError naming a record that is not there."""
    import json
    from pathlib import Path

    out, cache = {}, {}
    for target, items in TRIED.items():
        for what, run, trial, base in items:
            name = TUNE_LOG.format(run)
            if name not in cache:
                cache[name] = json.loads((Path(logs_dir) / name).read_text())
            figures = []
            for want in (trial, base):
                if want is None:
                    figures.append(None)
                    continue
                rec = next((r for r in cache[name] if all(r.get(k, "absent") == v for k, v in want.items())), None)
                if rec is None:
                    raise LookupError(f"{name}: no record with {want}")
                figures.append(rec["us"])
            out.setdefault(target, []).append(dict(what=what, run=run, log=name, us=figures[0], base_us=figures[1]))
    return out


# issue 16 goal 2, % of copy (met: at least the bar), fp32 and bf16 alike (goal 3: the same % by
# their own bytes): (32, 4096, 1024) fwd 90; B = 1 fwd 85; fwd+bwd 80 at both; goal 1: the peer on
# its native layout no faster (peer time / scankit time >= PEER_BAR)
ROOFLINE_BARS = {("32x4096x1024", "fwd"): 90, ("1x65536x1024", "fwd"): 85, ("1x1048576x1024", "fwd"): 85,
                 ("32x4096x1024", "fwdbwd"): 80, ("1x65536x1024", "fwdbwd"): 80, ("1x1048576x1024", "fwdbwd"): 80}
PEER_BAR = 1.0
ISSUE16_PEER = "accelerated_scan_native"


def _pct(seconds, moved, copy_bw):
    return 100 * moved / seconds / copy_bw if seconds and moved else None


def issue16_rows(device: dict, moved: dict, copy_bw: float) -> list[dict]:
    """Issue 16's table (grid.ROOFLINE_*) from ``suite.roofline_cells``' device time and bytes
    ({(shape, impl, dtype, direction): seconds / bytes}; missing or n/a = None): scankit's and the
    peer's us and % of copy, the peer's time over scankit's (goal 1: >= 1), goal 2's bar."""
    rows = []
    for shape, (B, T, D) in grid.ROOFLINE_SHAPES.items():
        for dtype in grid.ROOFLINE_DTYPES:
            for direction in grid.DIRECTIONS:
                t, p = (_recorded(device, (shape, impl, dtype, direction)) for impl in ("triton", ISSUE16_PEER))
                b = _recorded(moved, (shape, "triton", dtype, direction))
                pct, bar = _pct(t, b, copy_bw), ROOFLINE_BARS.get((shape, direction))
                ratio = p / t if p and t else None
                rows.append(dict(shape=shape, B=B, T=T, D=D, dtype=dtype, direction=direction,
                                 us=t * 1e6 if t else None, pct=pct, peer_us=p * 1e6 if p else None,
                                 peer_pct=_pct(p, _recorded(moved, (shape, ISSUE16_PEER, dtype, direction)) or b, copy_bw),
                                 ratio=ratio, peer_met=None if ratio is None else ratio >= PEER_BAR, bar=bar,
                                 met=None if bar is None or pct is None else pct >= bar))
    return rows


def cliff_rows(device: dict, copy_bw: float) -> list[dict]:
    """Issue 16's cliff sweep (grid.cliff_shapes) from ``suite.cliff_cells``' device time
    ({(shape,): seconds}; missing or n/a = None): us, % of copy (grid.cliff_bytes), met (>= CLIFF_BAR)."""
    rows = []
    for shape, (B, T, D) in grid.cliff_shapes().items():
        t, b = _recorded(device, (shape,)), grid.cliff_bytes(B, T, D)
        pct = _pct(t, b, copy_bw)
        rows.append(dict(shape=shape, B=B, T=T, D=D, us=t * 1e6 if t else None, mb=b / 1e6,
                         pct=pct, met=None if pct is None else pct >= grid.CLIFF_BAR))
    return rows


def plot_cliffs(rows: list[dict], env: dict, path) -> None:
    """The cliff sweep as a heatmap: % of copy per (B, D) row and T column; grey where the sweep
    has no cell (under 64 MiB of inputs) or the run has no value; outlined under the bar."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    ys = [(B, D) for B in grid.CLIFF_B for D in grid.CLIFF_D if any(r["B"] == B and r["D"] == D for r in rows)]
    cells = {(r["B"], r["D"], r["T"]): r for r in rows}
    grid_pct = np.full((len(ys), len(grid.CLIFF_T)), np.nan)
    for i, (B, D) in enumerate(ys):
        for j, T in enumerate(grid.CLIFF_T):
            r = cells.get((B, D, T))
            if r is not None and r["pct"] is not None:
                grid_pct[i, j] = r["pct"]
    fig, ax = plt.subplots(figsize=(6.4, 0.32 * len(ys) + 1.6), dpi=100)
    cmap = plt.get_cmap("RdYlGn").copy()
    cmap.set_bad("#dddddd")
    image = ax.imshow(np.ma.masked_invalid(grid_pct), cmap=cmap, vmin=40, vmax=100, aspect="auto")
    for i, (B, D) in enumerate(ys):
        for j, T in enumerate(grid.CLIFF_T):
            r = cells.get((B, D, T))
            text = "" if r is None else ("n/a" if r["pct"] is None else f"{r['pct']:.0f}")
            ax.text(j, i, text, ha="center", va="center", fontsize=7)
            if r is not None and r["met"] is False:
                ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="black", linewidth=1.5))
    ax.set_xticks(range(len(grid.CLIFF_T)), [str(T) for T in grid.CLIFF_T])
    ax.set_yticks(range(len(ys)), [f"B={B} D={D}" for B, D in ys], fontsize=7)
    ax.set_xlabel("T")
    ax.set_title(f"{grid.STATE_OP} fp32 fwd, % of copy (bar {grid.CLIFF_BAR}%): {env['device']}, "
                 f"{env['commit'][:8]}", fontsize=8)
    fig.colorbar(image, ax=ax, label="% of copy")
    fig.tight_layout()
    fig.savefig(path, format="png", metadata={"Software": None})
    plt.close(fig)


def payload(env: dict, bench: dict, peers: dict, scaling: dict, tried: dict | None = None) -> dict:
    """bench: report.bench_payload output; peers: {(shape, peer, direction): seconds};
    scaling: {(op, log2_T): seconds}; tried: ``tried_figures`` output."""
    bw = bench["copy_bw"]
    rows = []
    for r in bench["rows"]:
        row = dict(op=r["op"], shape=r["shape"], direction=r["direction"], bytes=r["bytes"],
                   triton_us=r["triton_us"], eager_us=r["eager_us"], torch_compile_us=r["torch_compile_us"],
                   floor_us=r["bytes"] / bw * 1e6)
        if r["triton_us"] is not None:
            row.update(tbps=r["bytes"] / r["triton_us"] / 1e6, pct=100 * row["floor_us"] / r["triton_us"])
        else:
            row.update(tbps=None, pct=None)
        if r["op"] == grid.STATE_OP:
            for name in grid.PEERS:
                s = peers.get((r["shape"], name, r["direction"]))
                row[f"{name}_us"] = None if s is None else s * 1e6
        rows.append(row)
    scale_rows, ref = _scaling(bench, scaling)
    targets = _targets(rows, scale_rows)
    unmet = list(dict.fromkeys(t["target"] for t in targets if not t["met"]))
    return dict(env=env, copy_bw=bw, rows=rows, peers=list(grid.PEERS), scaling=scale_rows, scaling_ref=ref,
                targets=targets, tolerance=SCALING_TOLERANCE,
                status=[dict(target=name, text=TARGET_STATUS[name], tried=(tried or {}).get(name, []))
                        for name in unmet])


def _scaling(bench, scaling):
    """Per op and T: us and ns per element, and the ratio to the `large` shape's ns per element."""
    large = grid.SHAPES["large"]
    ref = {}
    for r in bench["rows"]:
        if r["op"] in grid.SCALING_OPS and r["shape"] == "large" and r["direction"] == "fwd" and r["triton_us"]:
            ref[r["op"]] = 1e3 * r["triton_us"] / (large.B * large.T * large.D)
    rows = []
    for op in grid.SCALING_OPS:
        for log2t in grid.SCALING_LOG2T:
            s = scaling.get((op, log2t))
            elems = grid.SCALING_B * 2 ** log2t * grid.SCALING_D
            ns = None if s is None else 1e9 * s / elems
            rows.append(dict(op=op, T=2 ** log2t, us=None if s is None else s * 1e6, ns_per_elem=ns,
                             vs_large=None if ns is None or op not in ref else ns / ref[op]))
    return rows, ref


def _targets(rows, scale_rows):
    out = []
    for what, ops, shapes, directions, kind, bar in TARGETS:
        for r in rows:
            if r["op"] not in ops or r["shape"] not in shapes or r["direction"] not in directions:
                continue
            if kind == "pct":
                value, met = r["pct"], r["pct"] is not None and r["pct"] >= bar
                figure = "n/a" if value is None else f"{value:.0f}% of copy (bar {bar}%)"
            else:
                other = r.get(f"{kind}_us")
                value = None if other is None or r["triton_us"] is None else other / r["triton_us"]
                met = value is not None and value >= bar
                figure = "n/a" if value is None else f"{value:.2f}x (bar {bar:g}x)"
            out.append(dict(target=what, op=r["op"], shape=r["shape"], direction=r["direction"],
                            value=value, figure=figure, met=met))
    for s in scale_rows:
        met = s["vs_large"] is not None and abs(s["vs_large"] - 1) <= SCALING_TOLERANCE
        out.append(dict(target=SCALING_TARGET, op=s["op"], shape=f"T={s['T']}",
                        direction="fwd", value=s["vs_large"], met=met,
                        figure="n/a" if s["vs_large"] is None else f"{s['vs_large']:.2f}x large's ns/element"))
    return out


def plot(payload: dict, path) -> None:
    """Time per element against T (log-log), with the `large` shape's level and the 20% band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=100)
    for i, op in enumerate(grid.SCALING_OPS):
        pts = [(s["T"], s["ns_per_elem"]) for s in payload["scaling"] if s["op"] == op and s["ns_per_elem"]]
        if pts:
            ax.plot(*zip(*pts), marker="o", color=f"C{i}", label=f"{op} fwd (B=1, D=1024)")
        ref = payload["scaling_ref"].get(op)
        if ref:
            ax.axhline(ref, color=f"C{i}", linestyle="--", linewidth=1, label=f"{op} at large")
            ax.axhspan(ref * (1 - SCALING_TOLERANCE), ref * (1 + SCALING_TOLERANCE), color=f"C{i}", alpha=0.08)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("T (sequence length)")
    ax.set_ylabel("ns per element")
    ax.set_title(f"Scaling with T on {payload['env']['device']} (commit {payload['env']['commit'][:8]})")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, format="png", metadata={"Software": None})
    plt.close(fig)
