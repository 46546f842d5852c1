"""The commits that changed kernel code (check_regressions.KERNEL_PATHS) since the Triton
kernels landed, newest first, one hash a line: the backfill's list for asv.

    python tools/kernel_commits.py > kernel-commits.txt
    asv run --skip-existing-commits --record-samples -b 'Scans\\.' HASHFILE:kernel-commits.txt
"""
import argparse
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--since", default=TRITON_LANDED, help="first commit (included)")
    parser.add_argument("--until", default="HEAD")
    parser.add_argument("--out", help="write the list here and print its path (for asv's HASHFILE:)")
    args = parser.parse_args(argv)
    hashes = kernel_commits(args.since, args.until)
    text = "".join(h + "\n" for h in hashes)
    if args.out:
        Path(args.out).write_text(text)
        print(args.out)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
