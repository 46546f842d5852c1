#!/usr/bin/env python3
"""Render experiments/bench/scan_{parity,bench,memory,roofline}.{md,json} (+ scan_roofline.png, scan_cliffs.png)
from a committed asv run.

Reads the newest whole run of one machine (one of the full suite; runs of a part of it, such
as the backfill's `-b 'Scans\.'` or `asv find`, are passed over), or --commit REV's run, from
the asv results directory and
its benchmarks.json, plus the per-case parity rows the run kept beside them
(experiments/asv/parity/MACHINE/COMMIT.json). Output is deterministic: the same results
give the same bytes. A run that lacks cells the tables need is refused (exit 2), naming
them; --partial renders it anyway with those cells marked n/a (CPU smoke runs).
"""
from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.harness import grid, report  # noqa: E402
from benchmarks.harness.asv_results import (ResultsError, benchmarks, load_run, machines, pick_machine, runs,  # noqa: E402
                                            values, version)

SCANS = "bench_scans.Scans"
PARITY = "bench_parity.Parity"
MIXERS = "bench_mixers.MixerStep"
LAYERS = "bench_mixers.Layers"
STACKS = "bench_mixers.Stacks"
PEERS = "bench_roofline.Peers"
SCALING = "bench_roofline.Scaling"
# the scan tables' time: device time (runs since the harness moved to benchmarks/), else the
# block-median time of the runs before it
TIME_TRACKS = ("track_device_time", "track_time")
REFERENCES = "bench_scans.References"
FORMS = "bench_scans.CallForms"
BLOCKS = "bench_roofline.BlockWidths"
ROOFLINE = "bench_roofline.Roofline"
CLIFFS = "bench_roofline.Cliffs"


def references_run(results_dir: Path, machine: str, run: dict):
    """The run whose reference cells go beside ``run``'s kernels: ``run`` itself if it has
    them, else the newest run on the machine with the same torch and triton that has them
    (None for runs from before the references were a class of their own)."""
    name = f"{REFERENCES}.track_device_time"
    if name in run["results"]:
        return run
    same = [r for r in runs(results_dir, machine) if name in r["results"]
            and all(r.get("params", {}).get(k) == run.get("params", {}).get(k) for k in ("torch", "triton", "gpu"))]
    return max(same, key=lambda r: r.get("date") or 0) if same else None


RenderError = ResultsError
# what a whole run holds beside a Scans time track (the tables' other sources)
COPY = "bench_scans.track_copy_bandwidth"
WHOLE = (f"{PARITY}.track_failing_cases", f"{MIXERS}.track_step_time", COPY)


def _whole_runs(results_dir: Path, machine: str) -> list[dict]:
    return [r for r in runs(results_dir, machine) if all(n in r["results"] for n in WHOLE)
            and any(f"{SCANS}.{t}" in r["results"] for t in TIME_TRACKS)]


def newest_whole_run(results_dir: Path, machine: str | None) -> tuple[str, dict]:
    """(machine, the newest run of the full suite on it); without ``machine``, of the one machine
    that has such a run (another may hold only partial runs, e.g. ``Scans`` at a commit)."""
    if machine is None:
        having = [m for m in machines(results_dir) if _whole_runs(results_dir, m)]
        machine = having[0] if len(having) == 1 else None
    machine = pick_machine(results_dir, machine)
    whole = _whole_runs(results_dir, machine)
    if not whole:
        raise RenderError(f"machine {machine!r} has no run of the full suite in {results_dir} (`make bench`)")
    return machine, max(whole, key=lambda r: (r.get("date") or 0, r["commit_hash"]))


def _need(table: dict, key, missing: list, label: str):
    value = table.get(key)
    if value is None:
        missing.append(label)
    return value


def render(results_dir: Path, out_dir: Path, machine: str | None = None, commit: str | None = None,
           partial: bool = False) -> list[Path]:
    from benchmarks.harness import measure  # the byte model needs torch (meta tensors only)
    from benchmarks.harness.cases import bytes_moved

    machine, run = load_run(results_dir, machine, commit) if commit else newest_whole_run(results_dir, machine)
    known = benchmarks(results_dir)
    time_name = next((f"{SCANS}.{t}" for t in TIME_TRACKS if f"{SCANS}.{t}" in run["results"]), f"{SCANS}.{TIME_TRACKS[0]}")
    # a retired benchmark (the block-median track_time) is not in the newest benchmarks.json; its run still holds it
    absent = [n for n in (time_name, f"{PARITY}.track_failing_cases", f"{MIXERS}.track_step_time")
              if n not in known and n not in run["results"]]
    if absent:
        raise RenderError(f"{results_dir / 'benchmarks.json'} does not list {absent}: run `asv run` (or `asv check`) first")
    commit_hash = run["commit_hash"]
    sidecar = results_dir.parent / "parity" / machine / f"{commit_hash}.json"
    if not sidecar.exists():
        raise RenderError(f"the run of {commit_hash[:12]} on {machine!r} kept no parity rows ({sidecar} is missing)")
    parity = json.loads(sidecar.read_text())
    when = dt.datetime.fromtimestamp(run["date"] / 1000, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    env = dict(parity["env"], commit=commit_hash, time=when, machine=machine)
    missing: list[str] = []

    times, peaks = values(run, time_name), values(run, f"{SCANS}.track_peak_cuda_memory")
    ref_run = references_run(results_dir, machine, run)
    if ref_run is not None:  # the references (eager, torch.compile), measured once per machine
        for table, track in ((times, "track_device_time"), (peaks, "track_peak_cuda_memory")):
            table.update({k: v for k, v in values(ref_run, f"{REFERENCES}.{track}").items() if v is not None})
        env["references_commit"] = ref_run["commit_hash"]
    # ops (and parity cases) this run's suite had: a run from before an op joined the grid
    # is rendered without it, not refused
    ops = [op for op in grid.OP_NAMES if any(k[0] == op for k in times)] or list(grid.OP_NAMES)
    cells = dict(seconds={}, peak_bytes={}, skipped={}, bytes={})
    for op in ops:
        for shape in grid.SHAPES:
            ins, outs = measure.meta_inputs_outputs(op, shape)
            for direction in grid.DIRECTIONS:
                cells["bytes"][op, shape, direction] = bytes_moved(ins, outs, direction)
                for impl in grid.IMPLS:
                    key = (op, shape, impl, direction)
                    reason = grid.skip_reason(op, shape, impl)
                    if reason:
                        cells["skipped"][key] = reason
                        continue
                    label = f"{time_name}{key}"
                    cells["seconds"][key] = _need(times, key, missing, label)
                    cells["peak_bytes"][key] = _need(peaks, key, missing, f"{SCANS}.track_peak_cuda_memory{key}")
    copy_bw = _need(values(run, COPY), (), missing, COPY)
    if copy_bw is not None and version(run, COPY) == grid.COPY_VERSION:  # bytes/s in the runs before
        copy_bw *= 1e12

    failing = values(run, f"{PARITY}.track_failing_cases")
    cases = [c for c in grid.OP_NAMES + grid.MIXER_LABELS if any(k[0] == c for k in failing)]
    for case in cases or grid.OP_NAMES + grid.MIXER_LABELS:
        for direction in grid.PARITY_DIRECTIONS:
            rows = [r for r in parity["rows"] if r["op"] == case and r["direction"] == direction]
            count = _need(failing, (case, direction), missing, f"{PARITY}.track_failing_cases{(case, direction)}")
            if rows and count is not None and count != sum(not r["passed"] for r in rows):
                raise RenderError(f"parity rows of {case}/{direction} disagree with the asv track ({count} failing)")

    mixer_t, mixer_m = values(run, f"{MIXERS}.track_step_time"), values(run, f"{MIXERS}.track_peak_cuda_memory")
    mixer = dict(seconds={}, peak_bytes={})
    for key in itertools.product(grid.MEMORY_SHAPES, grid.MIXER_PATHS):
        mixer["seconds"][key] = _need(mixer_t, key, missing, f"{MIXERS}.track_step_time{key}")
        mixer["peak_bytes"][key] = _need(mixer_m, key, missing, f"{MIXERS}.track_peak_cuda_memory{key}")

    roofline = None
    if f"{SCALING}.track_time" in known:  # suites before the roofline had none
        peer_t, scale_t = values(run, f"{PEERS}.track_time"), values(run, f"{SCALING}.track_time")
        scaling = {key: _need(scale_t, key, missing, f"{SCALING}.track_time{key}")
                   for key in itertools.product(grid.SCALING_OPS, grid.SCALING_LOG2T)}
        roofline = ({k: v for k, v in peer_t.items() if v is not None}, {k: v for k, v in scaling.items() if v is not None})

    if missing and not partial:
        by_bench: dict[str, list[str]] = {}
        for label in missing:
            name, _, params = label.partition("(")
            by_bench.setdefault(name, []).append(f"({params}" if params else "")
        shown = "\n  ".join(f"{name}: {len(cells)} cell(s), e.g. {cells[0] or '(no params)'}"
                            for name, cells in sorted(by_bench.items()))
        raise RenderError(f"the run of {commit_hash[:12]} on {machine!r} lacks {len(missing)} cells the tables "
                          f"need:\n  {shown}\n(render it anyway with --partial)")
    env["partial"] = bool(missing)
    for table in (cells["seconds"], cells["peak_bytes"]):
        for key in [k for k, v in table.items() if v is None]:
            del table[key]
    latency = values(run, f"{SCANS}.track_call_latency")
    if ref_run is not None:
        latency.update({k: v for k, v in values(ref_run, f"{REFERENCES}.track_call_latency").items() if v is not None})
    env["time_method"] = time_name.rsplit(".", 1)[-1]
    bench = report.bench_payload(env, cells, copy_bw, report.seed_rows(cells["seconds"], latency))
    if f"{FORMS}.track_device_time" in run["results"]:  # runs before the call forms have none
        bench["forms"] = report.form_rows(values(run, f"{FORMS}.track_device_time"))
    if f"{BLOCKS}.track_device_time" in run["results"] and copy_bw is not None:  # runs before them have none
        bench["blocks"] = report.block_rows(values(run, f"{BLOCKS}.track_device_time"),
                                            values(run, f"{BLOCKS}.track_bytes"), copy_bw)
    paths = report.write("scan_bench", bench, out_dir)
    paths += report.write("scan_parity", report.parity_payload(env, parity["rows"]), out_dir)
    if roofline is not None and copy_bw is not None:
        from benchmarks.harness import roofline as rl

        roof = rl.payload(env, bench, *roofline, tried=rl.tried_figures(ROOT / "experiments" / "logs"))
        if f"{ROOFLINE}.track_device_time" in run["results"]:  # runs before issue 16's cells have none
            roof["issue16"] = rl.issue16_rows(values(run, f"{ROOFLINE}.track_device_time"),
                                              values(run, f"{ROOFLINE}.track_bytes"), copy_bw)
        if f"{CLIFFS}.track_device_time" in run["results"]:  # nor its cliff sweep
            roof.update(cliffs=rl.cliff_rows(values(run, f"{CLIFFS}.track_device_time"), copy_bw),
                        cliff_bar=grid.CLIFF_BAR, cliff_min_mib=grid.CLIFF_MIN_BYTES // 2 ** 20)
        paths += report.write("scan_roofline", roof, out_dir)
        rl.plot(roof, out_dir / "scan_roofline.png")
        paths.append(out_dir / "scan_roofline.png")
        if "cliffs" in roof:
            rl.plot_cliffs(roof["cliffs"], env, out_dir / "scan_cliffs.png")
            paths.append(out_dir / "scan_cliffs.png")
    if all(v is not None for v in mixer["seconds"].values()):
        peaks_ok = all(v is not None for v in mixer["peak_bytes"].values())
        memory = report.memory_payload(env, mixer) if peaks_ok else dict(env=env, rows=[], ratios=[])
        if f"{LAYERS}.track_step_time" in run["results"]:  # runs before the layer cells have none
            memory.update(impls=grid.LAYER_IMPLS, target=report.LAYER_TARGET)
            memory["layers"] = report.layer_rows({table: values(run, f"{LAYERS}.track_{track}")
                                                  for table, track in (("seconds", "step_time"),
                                                                       ("peak_bytes", "peak_cuda_memory"))})
        if f"{STACKS}.track_step_time" in run["results"]:  # runs before the stack cells have none
            memory.update(stack_mixers=grid.STACK_MIXERS)
            memory["stacks"] = report.stack_rows({table: values(run, f"{STACKS}.track_{track}")
                                                  for table, track in (("seconds", "step_time"),
                                                                       ("peak_bytes", "peak_cuda_memory"))})
        paths += report.write("scan_memory", memory, out_dir)
        if not missing:
            headline = headline_payload(env, bench, parity["rows"], memory)
            paths.append(write_text(out_dir / "scan_headline.md", report.render("scan_headline", headline)))
    return paths


def headline_payload(env, bench, parity_rows, memory) -> dict:
    """The README's headline: every op at `large`, parity count, the fused mixer's memory."""
    large = []
    for op in dict.fromkeys(r["op"] for r in bench["rows"]):
        cells = {r["direction"]: r for r in bench["rows"] if r["op"] == op and r["shape"] == "large"}
        large.append((op, cells))
    lab = [r for r in memory["rows"] if r["shape"].startswith("lab")]
    return dict(env=env, copy_bw=bench["copy_bw"], large=large, memory=lab,
                passed=sum(r["passed"] for r in parity_rows), total=len(parity_rows))


BEGIN, END = "<!-- headline:begin (tools/render_artifacts.py writes this block) -->", "<!-- headline:end -->"


def write_text(path: Path, text: str) -> Path:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return path


def update_readme(readme: Path, headline: Path) -> bool:
    """Replace the README's headline block with the rendered one; True when it changed."""
    text = readme.read_text()
    if BEGIN not in text or END not in text:
        raise RenderError(f"{readme} has no headline markers ({BEGIN} ... {END})")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    new = f"{head}{BEGIN}\n{headline.read_text().strip()}\n{END}{tail}"
    if new != text:
        write_text(readme, new)
    return new != text


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results-dir", default=str(ROOT / "experiments" / "asv" / "results"))
    parser.add_argument("--out", default=str(ROOT / "experiments" / "bench"), help="output folder")
    parser.add_argument("--machine", help="asv machine name (needed when the results hold several)")
    parser.add_argument("--commit", help="render this commit's run instead of the newest")
    parser.add_argument("--partial", action="store_true", help="render a run that lacks cells, marking them n/a")
    parser.add_argument("--readme", help="also write the headline block of this README (make render passes README.md)")
    args = parser.parse_args(argv)
    try:
        for path in render(Path(args.results_dir), Path(args.out), args.machine, args.commit, args.partial):
            print(f"wrote {path}")
            if args.readme and path.name == "scan_headline.md" and update_readme(Path(args.readme), path):
                print(f"wrote {args.readme} (headline block)")
    except RenderError as exc:
        print(f"render_artifacts: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
