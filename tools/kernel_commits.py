"""The commits that changed kernel code (check_regressions.KERNEL_PATHS) since the Triton
kernels landed, newest first, one hash a line: the backfill's list for asv.

    python tools/kernel_commits.py --missing h200 --out missing.txt
    asv run --record-samples -b 'Scans\\.' HASHFILE:missing.txt

``--missing MACHINE`` keeps only the commits whose committed results for that machine lack a
device time measured by this harness (the ``Scans.track_device_time`` version in
benchmarks.json): ``--skip-existing-commits`` would also pass over a commit that holds only an
older suite's result. It says on stderr how many are measured.
"""
import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tools.check_regressions import KERNEL_PATHS  # noqa: E402

TRITON_LANDED = "6d7ba83"  # "Triton kernels: elementwise (linear, log) and block affine scans ..."


def kernel_commits(since: str = TRITON_LANDED, until: str = "HEAD") -> list[str]:
    """Full hashes of the commits in since^..until (since included) that touch KERNEL_PATHS."""
    out = subprocess.run(["git", "log", "--format=%H", f"{since}^..{until}", "--", *KERNEL_PATHS], cwd=ROOT,
                         capture_output=True, text=True, check=True)
    return out.stdout.split()


RESULTS = ROOT / "experiments" / "asv" / "results"
DEVICE_TIME = "bench_scans.Scans.track_device_time"


def measured(machine: str) -> set[str]:
    """Hashes (8 characters, asv's file prefix) of the commits whose results on ``machine``
    hold this harness's device time (the current version, at least one cell measured)."""
    version = json.loads((RESULTS / "benchmarks.json").read_text())[DEVICE_TIME]["version"]
    done = set()
    for path in (RESULTS / machine).glob("*.json"):
        if path.name == "machine.json":
            continue
        data = json.loads(path.read_text())
        entry = data.get("results", {}).get(DEVICE_TIME)
        if entry is None:
            continue
        cells = dict(zip(data["result_columns"], entry))
        if cells.get("version") == version and any(v is not None for v in cells.get("result") or []):
            done.add(data["commit_hash"][:8])
    return done


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--since", default=TRITON_LANDED, help="first commit (included)")
    parser.add_argument("--until", default="HEAD")
    parser.add_argument("--out", help="write the list here and print its path (for asv's HASHFILE:)")
    parser.add_argument("--missing", metavar="MACHINE", help="only the commits not yet measured on MACHINE")
    args = parser.parse_args(argv)
    hashes = kernel_commits(args.since, args.until)
    if args.missing:
        done = measured(args.missing)
        print(f"{sum(h[:8] in done for h in hashes)} of {len(hashes)} kernel commits measured on {args.missing}",
              file=sys.stderr)
        hashes = [h for h in hashes if h[:8] not in done]
    text = "".join(h + "\n" for h in hashes)
    if args.out:
        Path(args.out).write_text(text)
        print(args.out)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
