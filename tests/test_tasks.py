"""The task-validation page's tasks: generators checked against independent computations,
and the tiny CPU configuration of each task learns (scores well above chance)."""
import itertools
import json
import math

import pytest
import torch

from tasks import data, run, train


@pytest.mark.parametrize("k", [3, 5])
def test_group_words_are_running_products(k, seed):
    b = data.s5(64, 13, seed, k)
    perms = list(itertools.permutations(range(k)))
    for n in range(0, 64, 7):
        state = tuple(range(k))
        for t in range(13):
            x = perms[b.inputs[n, t]]
            state = tuple(x[state[e]] for e in range(k))   # x o state: apply state, then x
            assert perms[b.targets[n, t]] == state
    assert b.mask.all() and b.inputs.max() < math.factorial(k)
    assert torch.equal(b.inputs, data.s5(64, 13, seed, k).inputs) and not torch.equal(b.inputs, data.s5(64, 13, seed + 1, k).inputs)


def test_mqar_queries_are_answered_with_their_keys_values(seed):
    pairs, queries, keys, values = 5, 7, 9, 6
    b = data.mqar(50, pairs, queries, keys, values, seed)
    assert b.inputs.shape == (50, 2 * pairs + queries)
    for n in range(50):
        ks, vs = b.inputs[n, 0:2 * pairs:2].tolist(), b.inputs[n, 1:2 * pairs:2].tolist()
        assert len(set(ks)) == pairs and all(0 <= k < keys for k in ks) and all(keys <= v < keys + values for v in vs)
        for t in range(2 * pairs, 2 * pairs + queries):
            assert b.mask[n, t] and b.targets[n, t] == vs[ks.index(b.inputs[n, t].item())]
        assert not b.mask[n, :2 * pairs].any()
    with pytest.raises(ValueError, match="pairs <= keys"):
        data.mqar(2, 5, 1, 4, 4, seed)


def test_pendulum_follows_its_equation(seed):
    b = data.pendulum(16, 40, seed, noise=0.0)
    theta, omega = b.targets[..., 0].double(), b.targets[..., 1].double()
    assert torch.equal(b.inputs[..., 0], b.targets[..., 0]) and torch.equal(b.inputs[..., 1], b.delta_t)
    assert (b.delta_t >= 1e-3).all() and (b.delta_t <= 1.0).all() and b.delta_t.std() > 0  # irregular
    # energy E = omega^2 / 2 + g/L (1 - cos theta) never grows (damping), up to RK4's error
    energy = omega ** 2 / 2 + 9.81 * (1 - torch.cos(theta))
    assert (energy[:, 1:] <= energy[:, :-1] * (1 + 1e-6) + 1e-9).all()
    # short gaps: theta's difference quotient is the mean angular velocity over the gap
    dt = b.delta_t[:, 1:].double()
    short = dt < 0.02
    if short.any():
        quot = (theta[:, 1:] - theta[:, :-1]) / dt
        mid = (omega[:, 1:] + omega[:, :-1]) / 2
        torch.testing.assert_close(quot[short], mid[short], atol=0.05, rtol=0.02)


def test_digits_are_a_fixed_permutation_and_a_disjoint_split():
    pytest.importorskip("sklearn")
    tr, te = data.digits(0, "train"), data.digits(0, "test")
    assert tr.inputs.shape == (1437, 64, 1) and te.inputs.shape == (360, 64, 1)
    assert tr.mask[:, -1].all() and not tr.mask[:, :-1].any() and set(tr.targets[:, -1].tolist()) == set(range(10))
    rows = {tuple(x.flatten().tolist()) for x in tr.inputs}
    assert sum(tuple(x.flatten().tolist()) in rows for x in te.inputs) < 10  # (a few duplicate images exist)
    assert 0.0 <= tr.inputs.min() and tr.inputs.max() <= 1.0


@pytest.fixture
def one_thread():
    """Training runs on one intra-op thread: under pytest-xdist every worker would otherwise
    start a thread per core (4 workers x all cores: a tiny run took 4x its serial time)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# one mixer per task in CI (the whole tiny grid: python -m tasks.run --config tiny, ~2 minutes)
LEARNS = [("s5", "givens", False, 0.8), ("mqar", "rotation", False, None), ("pendulum", "mingru", True, 0.5),
          ("digits", "rotation", False, None)]


@pytest.mark.parametrize("task,mixer,decay,at_least", LEARNS, ids=[x[0] for x in LEARNS])
def test_tiny_configuration_learns(task, mixer, decay, at_least, scan_mode, one_thread):
    if task == "digits":
        pytest.importorskip("sklearn")
    scan_mode("auto")
    r = train.run(task, mixer, seed=0, config="tiny", decay=decay)
    floor = at_least if at_least is not None else 2 * r["chance"]
    assert r["score"] >= floor > r["chance"], r
    assert r["fitted"] == (r["score"] >= r["threshold"]) and r["ms_per_step"] > 0


def test_runner_writes_every_row_and_the_fit_rates(tmp_path, scan_mode, one_thread):
    scan_mode("auto")
    out = tmp_path / "rows.json"
    assert run.main(["--config", "tiny", "--tasks", "pendulum", "--mixers", "signed", "--seeds", "1",
                     "--out", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [(r["task"], r["mixer"], r["decay"]) for r in rows] == [("pendulum", "signed", False),
                                                                   ("pendulum", "signed", True)]
    text = run.summary(rows)
    assert "signed +decay" in text and "fit" in text
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.parametrize("page,config", [("tiny-cpu", "tiny"), ("full-h100", "full")])
def test_committed_task_page_is_the_rendering_of_its_rows(page, config, tmp_path):
    from pathlib import Path

    from tasks import render

    root = Path(__file__).resolve().parents[1]
    src = root / "experiments" / "tasks" / f"{page}.json"
    rows = json.loads(src.read_text())
    assert rows and {r["config"] for r in rows} == {config} and {r["mixer"] for r in rows} == set(train.MIXERS)
    if config == "tiny":  # the CPU page is whole; the GPU page grows over sessions (run.py continues it)
        assert {r["task"] for r in rows} == {t for t, task in train.TASKS.items() if "tiny" in task.configs}
    assert src.with_suffix(".md").read_text() == render.render(rows, f"experiments/tasks/{page}.json")
    assert src.with_suffix(".png").stat().st_size > 0
    render.plot(rows, tmp_path / "page.png")
    assert (tmp_path / "page.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("config", ["tiny", "full"])
def test_every_task_makes_what_its_model_reads(config):
    """Each task's examples in each configuration it has: token ids under its vocab, targets
    under its outputs (or regression targets), something scored; the chance named is guessing's."""
    for name, task in train.TASKS.items():
        if config not in task.configs:
            continue
        if name == "digits":
            pytest.importorskip("sklearn")
        cfg = dict(task.configs[config], split="test")
        b = task.make(3, cfg, 0)
        assert b.mask.any(), name
        if task.vocab:
            assert 0 <= int(b.inputs.min()) and int(b.inputs.max()) < task.vocab, name
        else:
            assert b.inputs.shape[-1] == task.features, name
        if task.regression:
            assert b.targets.shape[-1] == task.outputs, name
        else:
            assert int(b.targets[b.mask].max()) < task.outputs, name
        family = name.split("-")[0]
        guess = {"s5": lambda: 1 / math.factorial(cfg["k"]), "mqar": lambda: 1 / cfg["values"],
                 "digits": lambda: 0.1, "pendulum": lambda: 0.0}[family]()
        assert cfg["chance"] == pytest.approx(guess), name


def test_tasks_without_a_configuration_are_skipped_or_refused(tmp_path, monkeypatch):
    """--config tiny runs the tasks that have a tiny configuration; naming one without it is an error."""
    trained = []
    row = dict(metric="accuracy", score=0.0, fitted=False, ms_per_step=1.0)
    monkeypatch.setattr(train, "run", lambda task, *a, **k: trained.append(task) or row)
    monkeypatch.setattr(run, "write", lambda *a: None)
    monkeypatch.setattr(run, "summary", lambda rows: "")
    assert run.main(["--config", "tiny", "--mixers", "signed", "--seeds", "1", "--out", str(tmp_path / "r.json")]) == 0
    assert set(trained) == {t for t, task in train.TASKS.items() if "tiny" in task.configs} and "s5-16" not in trained
    with pytest.raises(SystemExit):
        run.main(["--config", "tiny", "--tasks", "s5-16", "--out", str(tmp_path / "r.json")])


def test_runner_continues_a_cut_off_run_and_refuses_another_config(tmp_path, scan_mode, one_thread, monkeypatch):
    """A second run with the same --out keeps the rows there and trains only the missing cells
    (the full page over several GPU sessions); a file of another configuration is refused."""
    scan_mode("auto")
    out = tmp_path / "rows.json"
    args = ["--config", "tiny", "--tasks", "pendulum", "--mixers", "signed", "--out", str(out)]
    assert run.main(args + ["--seeds", "1"]) == 0
    first = json.loads(out.read_text())
    trained = []
    real = train.run
    monkeypatch.setattr(train, "run", lambda *a, **k: trained.append(a[:3] + (k["decay"],)) or real(*a, **k))
    assert run.main(args + ["--seeds", "2"]) == 0
    rows = json.loads(out.read_text())
    assert rows[:2] == first and len(rows) == 4
    assert trained == [("pendulum", "signed", 1, False), ("pendulum", "signed", 1, True)]
    assert sorted(run.cell(r) for r in rows) == sorted({run.cell(r) for r in rows})  # no cell twice
    with pytest.raises(SystemExit, match="not 'full'"):
        run.main(["--config", "full", "--tasks", "pendulum", "--mixers", "signed", "--out", str(out)])
    out.write_text("{half")
    with pytest.raises(SystemExit, match="not a results file"):
        run.main(args)


def test_render_writes_the_page_and_its_plot_whole(tmp_path):
    """``python -m tasks.render X.json`` writes X.md and X.png, nothing left half-written beside."""
    from pathlib import Path

    from tasks import render

    src = Path(__file__).resolve().parents[1] / "experiments" / "tasks" / "tiny-cpu.json"
    rows = tmp_path / "rows.json"
    rows.write_text(src.read_text())
    assert render.main([str(rows)]) == 0
    assert rows.with_suffix(".md").read_text() == render.render(json.loads(src.read_text()), str(rows))
    assert rows.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows.json", "rows.md", "rows.png"]
    rows.write_text("[]")
    assert render.main([str(rows)]) == 2  # no rows: said, nothing written over
