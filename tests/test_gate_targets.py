"""The gate's targets, measured on the committed H200 history of the current harness (device
time, ``grid.VERSION``): pairs of runs of unchanged kernel code raise at most one false alarm,
and a slowdown injected into one kernel cell of the later run of such a pair is caught. Each
pair is judged by a noise model fitted without it (leave one pair out), so a pair never sets
its own threshold. Runs of the retired block-median method carry another benchmark version:
asv and the gate do not compare across versions, so they are not part of these targets."""
import copy
import itertools
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import check_regressions as gate  # noqa: E402
from benchmarks.harness import grid  # noqa: E402
from benchmarks.harness.asv_results import benchmarks, runs, values, version  # noqa: E402
from test_regression_gate import TIME, set_result  # noqa: E402  (device time; one cell scaled, its statistics with it)

RESULTS = ROOT / "experiments" / "asv" / "results"


@pytest.fixture(scope="module")
def history():
    if not (RESULTS / "h200").exists():
        pytest.skip("no committed H200 history")
    found = [r for r in runs(RESULTS, "h200") if version(r, TIME) == grid.VERSION]
    same = {}
    for a, b in itertools.combinations(found, 2):
        same[a["commit_hash"], b["commit_hash"]] = same[b["commit_hash"], a["commit_hash"]] = \
            gate.kernels_unchanged(a["commit_hash"], b["commit_hash"])
    pairs = [(a, b) for a, b in itertools.combinations(sorted(found, key=lambda r: r["date"]), 2)
             if same[a["commit_hash"], b["commit_hash"]]]
    assert pairs, "the committed device-time history should hold a pair of runs of unchanged kernel code"
    return dict(runs=found, pairs=pairs, same=same, known=benchmarks(RESULTS))


def model_without(history, a, b):
    held_out = {a["commit_hash"], b["commit_hash"]}
    return gate.noise_model(history["runs"], lambda x, y: {x, y} != held_out and history["same"].get((x, y), False))


def scaled(run, params, factor):
    out = copy.deepcopy(run)
    set_result(out, TIME, params, factor=factor)
    return out


def kernel_cells(run, shapes):
    return [p for p, v in values(run, TIME).items() if v and p[2] == "triton" and p[1] in shapes]


def test_at_most_one_false_alarm_over_all_unchanged_pairs(history):
    alarms = []
    for a, b in history["pairs"]:
        changes = gate.compare(a, b, history["known"], 1.10, model=model_without(history, a, b))
        alarms += [(a["commit_hash"][:7], b["commit_hash"][:7], c["benchmark"], c["params"])
                   for c in changes if c["regression"]]
    assert len(alarms) <= 1, alarms


def _missed(history, shapes, factor):
    missed = []
    for a, b in history["pairs"]:
        model = model_without(history, a, b)
        for params in kernel_cells(b, shapes):
            if values(a, TIME).get(params) is None:
                continue
            changes = gate.compare(a, scaled(b, params, factor), history["known"], 1.10, model=model)
            hit = [c for c in changes if c["regression"] and c["benchmark"] == TIME
                   and c["params"] == ", ".join(map(str, params))]
            if not hit:
                missed.append((a["commit_hash"][:7], b["commit_hash"][:7], params))
    return missed


def test_a_1_2x_slowdown_of_any_large_or_vlong_kernel_cell_is_caught(history):
    assert _missed(history, ("large", "vlong"), 1.2) == []


def test_a_1_5x_slowdown_of_a_kernel_cell_at_any_shape_is_caught(history):
    assert _missed(history, ("lab", "longT", "large", "vlong"), 1.5) == []
