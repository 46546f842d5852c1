"""The look-back step itself (``elementwise._look_back``) on status words laid out by hand: every
column of a tile at its own depth (its newest inclusive prefix 1 to 9 tiles back, aggregates
after it), words below that unpublished, stale (another call's epoch) or of any flag, windows
of 1 and 4; against the float64 composition. On a GPU tiles publish in any order, so columns
reach their prefixes at different depths; the interpreter runs programs in order and never
shows it through the scans."""
import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from scankit.triton import elementwise

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@triton.jit
def _probe(words_ptr, out_a_ptr, out_h_ptr, ti, n_tiles, epoch, BLOCK_D: tl.constexpr, WINDOW: tl.constexpr):
    col = tl.arange(0, BLOCK_D)
    a, h = elementwise._look_back(words_ptr, words_ptr + n_tiles * BLOCK_D, ti, BLOCK_D, col, col < BLOCK_D, epoch,
                                  BLOCK_D, WINDOW)
    tl.store(out_a_ptr + col, a)
    tl.store(out_h_ptr + col, h)


def _word(value: np.float32, flag: int, epoch: int) -> int:
    bits = int(np.float32(value).view(np.uint32))
    word = bits | ((epoch * 4 + flag) << 32)
    return word - (1 << 64) if word >= 1 << 63 else word  # as int64


@pytest.mark.parametrize("window", [1, 4])
@pytest.mark.parametrize("seed", range(3))
def test_each_column_composes_back_to_its_own_newest_prefix(window, seed):
    rng = np.random.default_rng(seed)
    block_d, n_tiles, ti, epoch = 16, 12, 11, 5
    words = np.zeros((2, n_tiles, block_d), dtype=np.int64)
    want_a, want_h = np.ones(block_d), np.zeros(block_d)
    for c in range(block_d):
        depth = int(rng.integers(1, 10))  # tile ti - depth holds the column's newest inclusive prefix
        for t in range(ti - depth):  # below it: anything (never needed)
            flag, ep = int(rng.integers(0, 3)), int(rng.choice([epoch, epoch - 1]))
            words[:, t, c] = [_word(rng.normal(), flag, ep), _word(rng.normal(), flag, ep)]
        a, h = np.float32(rng.uniform(0.5, 1.0)), np.float32(rng.normal())
        words[:, ti - depth, c] = [_word(a, 2, epoch), _word(h, 2, epoch)]
        acc_a, acc_h = float(a), float(h)
        for t in range(ti - depth + 1, ti):  # after it: aggregates, composed in order
            a, h = np.float32(rng.uniform(0.5, 1.0)), np.float32(rng.normal())
            words[:, t, c] = [_word(a, 1, epoch), _word(h, 1, epoch)]
            acc_a, acc_h = acc_a * float(a), float(a) * acc_h + float(h)
        want_a[c], want_h[c] = acc_a, acc_h
    buf = torch.from_numpy(words.reshape(-1)).to(DEVICE)
    out_a, out_h = (torch.empty(block_d, device=DEVICE) for _ in range(2))
    _probe[(1,)](buf, out_a, out_h, ti, n_tiles, epoch, BLOCK_D=block_d, WINDOW=window)
    torch.testing.assert_close(out_a.cpu().double(), torch.from_numpy(want_a), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out_h.cpu().double(), torch.from_numpy(want_h), rtol=1e-5, atol=1e-5)
