#!/usr/bin/env python3
"""Run the asv suite offline for every commit of a range: what plain ``asv run A..B`` does,
plus what asv lacks (several GPUs, a guarded merge into the committed database).

    python tools/run_history.py REV_RANGE [--machine h200] [--python python3] [--bench REGEX]
        [--gpus 0,1] [--timeout S] [--log-dir DIR] [--dry-run]

Every commit is measured by this checkout's one harness (benchmarks/): asv installs the
commit into its virtualenv environment (asv.conf.json) and runs the suite against it, into
a staging results dir; the result (and its parity rows) is then merged into the committed
database (experiments/asv/results). With several ``--gpus`` the suite's benchmark modules
are shared out over them (one asv process per GPU, at once) and the parts merged back into
one result (tools/merge_asv_results.py). Commits that already have a complete result on the
machine are skipped; a partial new result never replaces a complete one; a result in which
every benchmark failed is never filed. Commits without the scankit package are skipped.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))



def git(*args, cwd=ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


DATABASE = ROOT / "experiments" / "asv" / "results"


def sees_cuda(python: str) -> bool:
    return subprocess.run([python, "-c", "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"],
                          capture_output=True).returncode == 0


def commits(rev_range: str) -> list[str]:
    return git("rev-list", "--reverse", "--first-parent", rev_range).split() if ".." in rev_range \
        else [git("rev-parse", rev_range)]


# What a whole suite run records, at every commit that has a suite (a --bench run lacks some)
CORE = ("bench_scans.Scans.track_device_time", "bench_scans.track_copy_bandwidth",
        "bench_parity.Parity.track_failing_cases", "bench_mixers.MixerStep.track_step_time")


def complete(results_dir: Path, machine: str, commit: str) -> bool:
    """Whether the database holds a whole-suite result of ``commit`` (values for every core
    benchmark of this harness, and its per-case parity rows). A result that a commit's own
    older suite recorded has no device time: that commit is measured again."""
    from benchmarks.harness.asv_results import values

    for path in result_files(results_dir, machine, commit):
        run = json.loads(path.read_text())
        has_rows = (results_dir.parent / "parity" / machine / f"{run['commit_hash']}.json").exists()
        if has_rows and all(any(v is not None for v in values(run, name).values()) for name in CORE):
            return True
    return False


def result_files(results_dir: Path, machine: str, commit: str) -> list[Path]:
    return [p for p in (results_dir / machine).glob(f"{commit[:8]}-*.json")]


# Relative cost of each suite module (cold, on the H200), to share them out over GPUs
MODULE_COST = {"bench_scans": 3.0, "bench_parity": 2.0, "bench_roofline": 1.5, "bench_mixers": 0.5}


def share_out(modules: list[str], n: int) -> list[list[str]]:
    """Benchmark modules in ``n`` groups of near-equal cost (costliest first, each to the
    lightest group); empty groups dropped."""
    groups: list[list[str]] = [[] for _ in range(n)]
    load = [0.0] * n
    for mod in sorted(modules, key=lambda m: (-MODULE_COST.get(m, 1.0), m)):
        i = load.index(min(load))
        groups[i].append(mod)
        load[i] += MODULE_COST.get(mod, 1.0)
    return [g for g in groups if g]


def measure(commit: str, machine: str, python: str, bench: str | None, stage: Path,
            gpus: list[str] | None = None, timeout: float | None = None, log_dir: Path | None = None) -> Path:
    """asv run of ``commit`` (installed into asv's environment) into ``stage`` (one asv process per GPU of
    ``gpus``, its share of the suite each); returns the staged dir."""
    from merge_asv_results import merge as merge_parts

    conf = json.loads(subprocess.run([python, "-c", "import asv.util, json, sys; "
                                      "print(json.dumps(asv.util.load_json(sys.argv[1], js_comments=True)))",
                                      str(ROOT / "asv.conf.json")], check=True, capture_output=True, text=True).stdout)
    env = dict(os.environ, SCANKIT_ASV_MACHINE=machine, SCANKIT_ASV_COMMIT=commit,
               SCANKIT_ASV_PARITY_DIR=str(stage / "parity"),
               SCANKIT_ASV_SITE_PYTHON=shutil.which(python) or python)  # its torch + triton (tools/asv_env.py)
    asv = [python, "-m", "asv"]
    conf.update(repo=str(ROOT), benchmark_dir=str(ROOT / "benchmarks"), results_dir=str(stage / "results"),
                env_dir=str(ROOT / ".asv" / "env"), html_dir=str(stage / "html"),
                install_command=[c.replace("{conf_dir}", str(ROOT)) for c in conf["install_command"]])
    conf.pop("plugins", None)  # publishing plugins, imported relative to the repository root
    (stage / "asv.conf.json").write_text(json.dumps(conf))
    subprocess.run([python, str(ROOT / "tools" / "asv_machine.py"), "--machine", machine], env=env, check=True,
                   capture_output=True)
    if bench or not gpus or len(gpus) < 2:
        selections = [bench]
    else:
        modules = sorted(p.stem for p in (ROOT / "benchmarks").glob("bench_*.py"))
        selections = [f"^({'|'.join(group)})\\." for group in share_out(modules, len(gpus))]
    # parts share the host's CPUs out too: a part's compiles must not slow another's
    # host-bound timings (small shapes measure launch overhead)
    cpus = sorted(os.sched_getaffinity(0))
    per = max(1, len(cpus) // len(selections))
    cpu_sets = [set(cpus[i * per:(i + 1) * per]) or set(cpus) for i in range(len(selections))] \
        if len(selections) > 1 else [None]
    procs = []
    for i, selection in enumerate(selections):
        part = stage / f"part{i}"
        part.mkdir()
        # parts run at once: each its own environment (one pip at a time per environment)
        part_env_dir = conf["env_dir"] + (f"-part{i}" if len(selections) > 1 else "")
        (part / "asv.conf.json").write_text(json.dumps(dict(conf, results_dir=str(part / "results"),
                                                            env_dir=part_env_dir)))
        cmd = asv + ["run", f"{commit}^!", "--machine", machine, "--show-stderr", "--record-samples"] + \
            (["--bench", selection] if selection else [])
        part_env = dict(env, CUDA_VISIBLE_DEVICES=gpus[i]) if gpus else env
        log = open(log_dir / f"{commit[:8]}-part{i}.log", "w") if log_dir else None
        where = (f" on GPU {gpus[i]}" if gpus else "") + \
            (f", CPUs {min(cpu_sets[i])}-{max(cpu_sets[i])}" if cpu_sets[i] else "")
        print(f"part {i}{where}: {selection or 'whole suite'}", flush=True)
        pin = (lambda c=cpu_sets[i]: os.sched_setaffinity(0, c)) if cpu_sets[i] else None
        # own session: a timeout kills asv and the benchmark processes it spawned
        procs.append((subprocess.Popen(cmd, cwd=part, env=part_env, stdout=log, stderr=log,
                                       preexec_fn=pin, start_new_session=True), log))
    deadline = time.monotonic() + timeout if timeout else None
    for i, (proc, log) in enumerate(procs):
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()) if deadline else None)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            print(f"part {i}: stopped at the {timeout:.0f} s limit", flush=True)
        if log:
            log.close()
    merge_parts(stage / "results", [stage / f"part{i}" / "results" for i in range(len(procs))])
    return stage


def measured_anything(path: Path) -> bool:
    """Whether an asv result file holds at least one value (a run on a machine that could not
    run the suite records every benchmark as failed)."""
    from benchmarks.harness.asv_results import values

    run = json.loads(path.read_text())
    return any(v is not None for name in run.get("results", {}) for v in values(run, name).values())


def merge(stage: Path, results_dir: Path, machine: str, commit: str) -> str:
    """Move the staged result into the database unless that would replace a complete one;
    never a result in which every benchmark failed."""
    staged = result_files(stage / "results", machine, commit)
    if not staged:
        return "no result produced"
    if not any(measured_anything(p) for p in staged):
        return "not filed: every benchmark failed (no value recorded)"
    had_complete = complete(results_dir, machine, commit)
    staged_complete = complete(stage / "results", machine, commit)
    if had_complete and not staged_complete:
        return "kept the complete result already there (the new one is partial)"
    (results_dir / machine).mkdir(parents=True, exist_ok=True)
    for path in result_files(results_dir, machine, commit):
        path.unlink()
    for path in staged:
        shutil.copy2(path, results_dir / machine / path.name)
    # the machine as this run found it (GPU, driver, torch, triton: tools/asv_machine.py)
    shutil.copy2(stage / "results" / machine / "machine.json", results_dir / machine / "machine.json")
    # benchmarks.json describes the suite: every commit is measured by this checkout's harness
    staged_suite = stage / "results" / "benchmarks.json"
    if staged_suite.exists():
        shutil.copy2(staged_suite, results_dir / "benchmarks.json")
    parity = stage / "parity" / machine / f"{commit}.json"
    if parity.exists():
        target = results_dir.parent / "parity" / machine
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy2(parity, target / parity.name)
    return "complete" if staged_complete else "partial"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("rev_range", help="e.g. d75d36e..main, or one commit")
    parser.add_argument("--machine", default="h200")
    parser.add_argument("--python", default=sys.executable, help="interpreter with torch + triton (+ asv)")
    parser.add_argument("--bench", help="asv --bench regex (a subset: results will be partial)")
    parser.add_argument("--gpus", help="comma-separated GPU ids: the suite shared out over them, one asv per GPU")
    parser.add_argument("--timeout", type=float, help="seconds each asv process may run (what finished is kept)")
    parser.add_argument("--log-dir", help="write each asv process's output to DIR/COMMIT-partN.log")
    parser.add_argument("--results-dir", default=str(DATABASE))
    parser.add_argument("--dry-run", action="store_true", help="say what would run")
    args = parser.parse_args(argv)
    results_dir = Path(args.results_dir)
    smoke = os.environ.get("SCANKIT_BENCH_SMOKE", "0") not in ("", "0")
    if smoke and results_dir.resolve() == DATABASE.resolve():
        print("run_history: SCANKIT_BENCH_SMOKE=1 (CPU smoke shapes) never files into the committed database; "
              "give --results-dir", file=sys.stderr)
        return 2
    if not smoke and not args.dry_run and not sees_cuda(args.python):
        print(f"run_history: {args.python} sees no CUDA device (or has no torch); the suite times and checks "
              "the kernels on a GPU (README: Running the benchmarks on a GPU machine)", file=sys.stderr)
        return 2
    try:
        todo = commits(args.rev_range)
    except subprocess.CalledProcessError as exc:
        print(f"run_history: bad range {args.rev_range!r}: {exc.stderr.strip()}", file=sys.stderr)
        return 2
    failed = False
    for commit in todo:
        label = f"{commit[:12]} {git('log', '-1', '--format=%s', commit)[:60]}"
        if complete(results_dir, args.machine, commit):
            print(f"skip  {label}: already measured on {args.machine}")
            continue
        if subprocess.run(["git", "cat-file", "-e", f"{commit}:scankit/__init__.py"], cwd=ROOT).returncode:
            print(f"skip  {label}: no scankit package at this commit")
            continue
        if args.dry_run:
            print(f"run   {label}")
            continue
        with tempfile.TemporaryDirectory(prefix="scankit-history-") as tmp:
            measure(commit, args.machine, args.python, args.bench, Path(tmp),
                    gpus=args.gpus.split(",") if args.gpus else None, timeout=args.timeout,
                    log_dir=Path(args.log_dir) if args.log_dir else None)
            outcome = merge(Path(tmp), results_dir, args.machine, commit)
            print(f"done  {label}: {outcome}")
            failed = failed or outcome.startswith(("not filed", "no result"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
