"""One registry of tasks and their configurations, the task model, and its training run.

A run trains ``TaskModel`` (an input embedding, a ``MinGRUStack`` of one mixer kind, a linear
head) on a task's training set for a fixed step budget and scores it on a held-out set drawn
with another seed: accuracy at the scored positions (classification) or R^2 of the targets
(the pendulum). A run "fits" when its score reaches the task's threshold.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn
from torch.nn import functional as F

import scankit

from . import data


@dataclass(frozen=True)
class Task:
    name: str
    make: Callable[[int, dict, int], data.Batch]   # (examples, config, seed) -> Batch; digits ignore n
    vocab: int          # token ids (0: the inputs are features)
    features: int       # input features per step (0: tokens)
    outputs: int        # classes, or regression targets
    regression: bool
    threshold: float    # accuracy or R^2 that counts as fitted
    uses_dt: bool = False
    # "tiny" (CI, CPU, seconds) and "full" (one GPU); each names its "chance": what guessing scores
    configs: dict = field(default_factory=dict)


def _s5(n, c, seed):
    return data.s5(n, c["length"], seed, c["k"])


def _mqar(n, c, seed):
    return data.mqar(n, c["pairs"], c["pairs"], c["keys"], c["values"], seed)


FULL = dict(train=20000, test=2000, steps=3000, batch=128, dim=128, depth=2)  # the tokens tasks' GPU budget


def _s5_task(name, length, tiny=None):
    configs = {"full": dict(k=5, length=length, **FULL, chance=1 / 120)}
    return Task(name, _s5, vocab=120, features=0, outputs=120, regression=False, threshold=0.9,
                configs=configs if tiny is None else dict(configs, tiny=tiny))


def _mqar_task(name, keys, tiny=None):
    """MQAR with ``keys`` keys and as many values, ``keys / 2`` pairs and as many queries (length 3 keys / 2)."""
    configs = {"full": dict(pairs=keys // 2, keys=keys, values=keys, **FULL, chance=1 / keys)}
    return Task(name, _mqar, vocab=2 * keys, features=0, outputs=2 * keys, regression=False, threshold=0.9,
                configs=configs if tiny is None else dict(configs, tiny=tiny))


# "s5" and "mqar" run in both configurations; "s5-16" / "s5-256" and "mqar-64" / "mqar-128" are the
# full page's other lengths and key counts (S5 over lengths 16-256, MQAR over several lengths and
# key counts), too big for the CPU page
TASKS = {
    "s5-16": _s5_task("s5-16", 16),
    "s5": _s5_task("s5", 64, tiny=dict(k=3, length=8, train=2048, test=512, steps=300, batch=64, dim=32, depth=1,
                                      chance=1 / 6)),
    "s5-256": _s5_task("s5-256", 256),
    "mqar": _mqar_task("mqar", 32, tiny=dict(pairs=4, keys=8, values=8, train=4096, test=512, steps=300, batch=64,
                                             dim=48, depth=1, chance=1 / 8)),
    "mqar-64": _mqar_task("mqar-64", 64),
    "mqar-128": _mqar_task("mqar-128", 128),
    "pendulum": Task("pendulum", lambda n, c, seed: data.pendulum(n, c["length"], seed), vocab=0, features=2,
                     outputs=2, regression=True, threshold=0.9, uses_dt=True,
                     configs={"tiny": dict(length=32, train=512, test=128, steps=150, batch=32, dim=32, depth=1,
                                           chance=0.0),
                              "full": dict(length=256, train=4096, test=512, steps=2000, batch=64, dim=128, depth=2,
                                           chance=0.0)}),
    "digits": Task("digits", lambda n, c, seed: data.digits(seed, c["split"]), vocab=0, features=1, outputs=10,
                   regression=False, threshold=0.9,
                   configs={"tiny": dict(steps=200, batch=64, dim=32, depth=1, chance=0.1),
                            "full": dict(steps=3000, batch=64, dim=128, depth=2, chance=0.1)}),
}
MIXERS = ("mingru", "signed", "rotation", "givens")


class TaskModel(nn.Module):
    def __init__(self, task: Task, mixer: str, dim: int, depth: int, decay: bool):
        super().__init__()
        self.embed = nn.Embedding(task.vocab, dim) if task.vocab else nn.Linear(task.features, dim)
        self.stack = scankit.MinGRUStack(dim, depth, mixer=mixer, decay=decay)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, task.outputs)

    def forward(self, x, delta_t=None):
        return self.head(self.norm(self.stack(self.embed(x), delta_t=delta_t)))


def _split(task: Task, cfg: dict, seed: int):
    if task.name == "digits":
        return task.make(0, dict(cfg, split="train"), seed), task.make(0, dict(cfg, split="test"), seed)
    return task.make(cfg["train"], cfg, seed), task.make(cfg["test"], cfg, seed + 10_000)


def _loss(task: Task, out, batch: data.Batch, scale):
    m = batch.mask
    if task.regression:
        return F.mse_loss(out[m] / scale, batch.targets[m] / scale)
    return F.cross_entropy(out[m], batch.targets[m])


@torch.no_grad()
def score(task: Task, model: TaskModel, batch: data.Batch, device, decay: bool) -> float:
    """Accuracy at the scored positions, or R^2 averaged over the regression targets; the
    model sees the time steps only if it was built with decay."""
    model.eval()
    b = _to(batch, device)
    out = model(b.inputs, b.delta_t if decay else None).cpu()
    model.train()
    m = batch.mask
    if not task.regression:
        return (out[m].argmax(-1) == batch.targets[m]).float().mean().item()
    y, p = batch.targets[m], out[m]
    return (1 - ((y - p) ** 2).mean(0) / y.var(0, unbiased=False)).mean().item()


def run(task_name: str, mixer: str, seed: int, config: str = "tiny", decay: bool = False, device="cpu") -> dict:
    """Train one model; the result row (score, fitted, step time, what ran)."""
    task = TASKS[task_name]
    cfg = task.configs[config]
    train, test = _split(task, cfg, seed)
    torch.manual_seed(seed)
    model = TaskModel(task, mixer, cfg["dim"], cfg["depth"], decay).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=cfg["steps"], pct_start=0.1)
    scale = train.targets[train.mask].std(0).to(device) if task.regression else None
    g = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    for _ in range(cfg["steps"]):
        b = _to(train.take(torch.randint(0, len(train), (cfg["batch"],), generator=g)), device)
        loss = _loss(task, model(b.inputs, b.delta_t if decay else None), b, scale)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
    if device != "cpu":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    value = score(task, model, test, device, decay)
    return dict(task=task_name, mixer=mixer, decay=decay, seed=seed, config=config,
                metric="r2" if task.regression else "accuracy", score=round(value, 4),
                fitted=value >= task.threshold, threshold=task.threshold, chance=round(cfg["chance"], 4),
                steps=cfg["steps"], ms_per_step=round(1e3 * seconds / cfg["steps"], 3), device=str(device),
                gpu=torch.cuda.get_device_name(device) if torch.device(device).type == "cuda" else None)


def _to(b: data.Batch, device) -> data.Batch:
    return data.Batch(b.inputs.to(device), b.targets.to(device), b.mask.to(device),
                      None if b.delta_t is None else b.delta_t.to(device))
