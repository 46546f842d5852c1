"""tools/merge_asv_results.py on a real H200 result split in two parts: merged back whole,
and a benchmark in two parts refused."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "asv" / "results" / "h200"


def merge(*args):
    return subprocess.run([sys.executable, str(ROOT / "tools" / "merge_asv_results.py"), *map(str, args)],
                          capture_output=True, text=True)


def split(tmp_path):
    source = next(p for p in sorted(RESULTS.glob("*.json")) if p.name != "machine.json")
    whole = json.loads(source.read_text())
    names = sorted(whole["results"])
    parts = []
    for i, chosen in enumerate((names[::2], names[1::2])):
        part = dict(whole, results={n: whole["results"][n] for n in chosen})
        folder = tmp_path / f"part{i}" / "h200"
        folder.mkdir(parents=True)
        (folder / source.name).write_text(json.dumps(part))
        (folder / "machine.json").write_text((RESULTS / "machine.json").read_text())
        parts.append(folder.parent)
    return source.name, whole, parts


def test_parts_merge_back_whole(tmp_path):
    name, whole, parts = split(tmp_path)
    out = merge(tmp_path / "out", *parts)
    assert out.returncode == 0, out.stderr
    merged = json.loads((tmp_path / "out" / "h200" / name).read_text())
    assert merged["results"] == whole["results"] and merged["commit_hash"] == whole["commit_hash"]
    assert (tmp_path / "out" / "h200" / "machine.json").exists()


def test_a_benchmark_in_two_parts_is_refused(tmp_path):
    _, _, parts = split(tmp_path)
    out = merge(tmp_path / "out", parts[0], parts[0])
    assert out.returncode == 2 and "measured in two parts" in out.stderr
    assert not (tmp_path / "out" / "h200").exists() or not list((tmp_path / "out" / "h200").glob("*-*.json"))
