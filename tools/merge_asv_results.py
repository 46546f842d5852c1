#!/usr/bin/env python3
"""Merge asv results of one commit measured in parts (disjoint --bench selections, e.g. one
per GPU of a host) into one results database.

    python tools/merge_asv_results.py OUT_RESULTS_DIR PART_RESULTS_DIR...

Each part's MACHINE/COMMIT-ENV.json is merged benchmark by benchmark into OUT's file of the
same name (created when absent); a benchmark present in two parts is an error (exit 2), so
nothing measured is silently replaced. machine.json and benchmarks.json come from the parts.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path


def merge(out_dir: Path, parts: list[Path]) -> list[Path]:
    merged: dict[Path, dict] = {}
    for part in parts:
        for path in sorted(part.glob("*/*.json")):
            if path.name == "machine.json":
                continue
            target = out_dir / path.parent.name / path.name
            data = json.loads(path.read_text())
            base = merged.get(target)
            if base is None:
                merged[target] = data
                continue
            clash = set(base["results"]) & set(data["results"])
            if clash:
                raise ValueError(f"{path}: benchmarks measured in two parts: {sorted(clash)[:3]}")
            base["results"].update(data["results"])
            base["durations"].update(data.get("durations", {}))
    for part in parts:
        for extra in [*part.glob("*/machine.json"), part / "benchmarks.json"]:
            if extra.exists():
                dest = out_dir / extra.relative_to(part)
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(extra, dest)
    for target, data in merged.items():
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=None, sort_keys=True))
        os.replace(tmp, target)
    return list(merged)


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        for path in merge(Path(args[0]), [Path(p) for p in args[1:]]):
            print(f"merged {path}")
    except (ValueError, KeyError, json.JSONDecodeError) as exc:
        print(f"merge_asv_results: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
