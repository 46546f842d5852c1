"""The validation tasks, generated offline and deterministically from a seed.

Each generator returns a ``Batch``: inputs (token ids (N, T) or features (N, T, F)), targets,
a mask of the positions that are scored, and ``delta_t`` (N, T) where time steps are irregular.

* ``s5``: word problems over the symmetric group S5 (the "Illusion of State" setup): a sequence
  of random permutations of 5 elements, predict at every step the running product
  ``y_t = x_t o y_{t-1}`` (120 classes; the CPU configuration uses S3, 6 classes, which a tiny
  model can learn in seconds). A positive diagonal recurrence cannot track it; a
  recurrence with rotations or signs can (Grazzi et al., ICLR 2025).
* ``mqar``: multi-query associative recall (Zoology): key-value pairs, then queries of some of
  the keys, answered with their values.
* ``pendulum``: a damped pendulum observed at irregular times with noise; predict the true
  state (angle, angular velocity) at each observation; the models get the time steps.
* ``digits``: scikit-learn's 8x8 digit images as permuted sequences of 64 pixels, classify at
  the last step (permuted sequential pixels; MNIST itself is not shipped offline).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Optional

import torch


@dataclass
class Batch:
    inputs: torch.Tensor            # (N, T) int64 tokens or (N, T, F) float32 features
    targets: torch.Tensor           # (N, T) int64 classes or (N, T, F) float32 values
    mask: torch.Tensor              # (N, T) bool: the scored positions
    delta_t: Optional[torch.Tensor] = None  # (N, T) float32 time steps, or None

    def __len__(self) -> int:
        return self.inputs.shape[0]

    def take(self, idx: torch.Tensor) -> "Batch":
        return Batch(self.inputs[idx], self.targets[idx], self.mask[idx],
                     None if self.delta_t is None else self.delta_t[idx])


@lru_cache(maxsize=None)
def group_table(k: int = 5) -> torch.Tensor:
    """(k!, k!) int64: ``table[i, j]`` = index of permutation i o j (apply j, then i) of the
    symmetric group S_k, permutations in lexicographic order (0 is the identity)."""
    perms = list(itertools.permutations(range(k)))
    index = {p: i for i, p in enumerate(perms)}
    return torch.tensor([[index[tuple(p[q[e]] for e in range(k))] for q in perms] for p in perms])


def s5(n: int, length: int, seed: int, k: int = 5) -> Batch:
    """Word problems over S_k (k = 5: S5, 120 classes): tokens are permutations, the target at
    step t their running product ``y_t = x_t o y_{t-1}`` from the identity."""
    g = torch.Generator().manual_seed(seed)
    table = group_table(k)
    x = torch.randint(0, table.shape[0], (n, length), generator=g)
    y = torch.empty_like(x)
    state = torch.zeros(n, dtype=torch.int64)
    for t in range(length):
        state = table[x[:, t], state]
        y[:, t] = state
    return Batch(x, y, torch.ones(n, length, dtype=torch.bool))


def mqar(n: int, pairs: int, queries: int, keys: int, values: int, seed: int) -> Batch:
    """Tokens: ``pairs`` (key, value) pairs (keys distinct, ids 0..keys-1; values keys..keys+values-1),
    then ``queries`` keys drawn from them; each query's target is its key's value. Length
    2 * pairs + queries; only the query positions are scored."""
    if pairs > keys or queries < 1:
        raise ValueError(f"mqar needs pairs <= keys and queries >= 1; got pairs={pairs}, keys={keys}, queries={queries}")
    g = torch.Generator().manual_seed(seed)
    k = torch.stack([torch.randperm(keys, generator=g)[:pairs] for _ in range(n)])
    v = keys + torch.randint(0, values, (n, pairs), generator=g)
    ask = torch.randint(0, pairs, (n, queries), generator=g)
    tokens = torch.cat([torch.stack([k, v], dim=2).reshape(n, 2 * pairs), k.gather(1, ask)], dim=1)
    targets = torch.zeros_like(tokens)
    targets[:, 2 * pairs:] = v.gather(1, ask)
    mask = torch.zeros_like(tokens, dtype=torch.bool)
    mask[:, 2 * pairs:] = True
    return Batch(tokens, targets, mask)


def pendulum(n: int, length: int, seed: int, noise: float = 0.05, mean_dt: float = 0.1) -> Batch:
    """theta'' = -(g / L) sin(theta) - c theta' (g / L = 9.81, c = 0.1), from a random state,
    observed at times with exponential gaps (mean ``mean_dt``): inputs (noisy theta, its
    time step), targets (theta, omega) at each observation, ``delta_t`` the gaps."""
    g = torch.Generator().manual_seed(seed)
    theta = (torch.rand(n, generator=g, dtype=torch.float64) * 2 - 1) * 0.8 * math.pi
    omega = torch.randn(n, generator=g, dtype=torch.float64)
    gaps = -mean_dt * torch.log1p(-torch.rand(n, length, generator=g, dtype=torch.float64))  # Exp(mean_dt)
    gaps = gaps.clamp(1e-3, 1.0)
    states = torch.empty(n, length, 2, dtype=torch.float64)

    def deriv(th, om):
        return om, -9.81 * torch.sin(th) - 0.1 * om

    for t in range(length):
        steps = 20
        h = gaps[:, t] / steps
        for _ in range(steps):  # RK4 over the gap
            k1 = deriv(theta, omega)
            k2 = deriv(theta + h / 2 * k1[0], omega + h / 2 * k1[1])
            k3 = deriv(theta + h / 2 * k2[0], omega + h / 2 * k2[1])
            k4 = deriv(theta + h * k3[0], omega + h * k3[1])
            theta = theta + h / 6 * (k1[0] + 2 * k2[0] + 2 * k3[0] + k4[0])
            omega = omega + h / 6 * (k1[1] + 2 * k2[1] + 2 * k3[1] + k4[1])
        states[:, t, 0], states[:, t, 1] = theta, omega
    observed = states[..., :1] + noise * torch.randn(n, length, 1, generator=g, dtype=torch.float64)
    inputs = torch.cat([observed, gaps.unsqueeze(-1)], dim=-1).float()
    return Batch(inputs, states.float(), torch.ones(n, length, dtype=torch.bool), gaps.float())


def digits(seed: int, split: str) -> Batch:
    """scikit-learn's 1797 8x8 digits, pixels (scaled to [0, 1]) in one fixed random order (the
    permutation from seed 0, so train and test share it), a label at the last pixel. ``split``:
    "train" (the first 1437 of a seeded shuffle) or "test" (the other 360)."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = torch.tensor(data.images, dtype=torch.float32).reshape(-1, 64) / 16.0
    y = torch.tensor(data.target, dtype=torch.int64)
    perm = torch.randperm(64, generator=torch.Generator().manual_seed(0))
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    cut = int(0.8 * len(y))
    idx = order[:cut] if split == "train" else order[cut:]
    x, y = x[idx][:, perm].unsqueeze(-1), y[idx]
    targets = torch.zeros(len(idx), 64, dtype=torch.int64)
    targets[:, -1] = y
    mask = torch.zeros(len(idx), 64, dtype=torch.bool)
    mask[:, -1] = True
    return Batch(x, targets, mask)
