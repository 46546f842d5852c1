"""Launch geometry on the host: plain-integer cdiv / next_pow2, and the T-chunking rule."""
import pytest
import torch

from scankit.triton import common

CPU = torch.device("cpu")


@pytest.mark.parametrize("a,b", [(0, 4), (1, 4), (4, 4), (5, 4), (4096, 64), (13, 1)])
def test_cdiv(a, b):
    assert common.cdiv(a, b) == -(-a // b) == (a + b - 1) // b


@pytest.mark.parametrize("n,want", [(0, 1), (1, 1), (2, 2), (3, 4), (64, 64), (65, 128)])
def test_next_pow2(n, want):
    assert common.next_pow2(n) == want


def test_chunks_fill_the_device_and_stay_two_tiles_long(monkeypatch):
    monkeypatch.setattr(common, "CHUNKING", {"min_tiles": 0, "programs_per_sm": None})
    assert common.num_chunks(1, 40, 8, CPU) == 3      # wants 4 programs, capped by chunks >= 16 long
    assert common.num_chunks(4, 4096, 8, CPU) == 1    # the programs fill the (interpreter's) device
    assert common.num_chunks(1, 13, 8, CPU) == 1


def test_short_walks_are_not_chunked(monkeypatch):
    monkeypatch.setattr(common, "CHUNKING", {"min_tiles": 6, "programs_per_sm": None})
    assert common.num_chunks(1, 40, 8, CPU) == 1      # 5 tiles < 6: one pass, fewer launches
    assert common.num_chunks(1, 48, 8, CPU) == 3      # 6 tiles: chunked as before


def test_a_kernels_own_programs_per_sm_aim(monkeypatch):
    """``per_sm`` (the 2x2 kernels' aim) replaces the family's and CHUNKING's on the GPU."""
    monkeypatch.setattr(common, "CHUNKING", {"min_tiles": 0, "programs_per_sm": None})
    monkeypatch.setattr(common, "_sm_count", lambda index: 10)
    gpu = torch.device("cuda", 0)
    assert common.num_chunks(40, 4096, 16, gpu, family="affine") == 1               # 40 >= 4 x 10
    assert common.num_chunks(40, 4096, 16, gpu, family="affine", per_sm=32) == 8    # 320 / 40
    assert common.num_chunks(40, 64, 16, gpu, family="affine", per_sm=32) == 2      # chunks >= 32 long


def test_int64_offsets_exactly_where_a_view_reaches_2_31_elements():
    """needs_int64 against the largest element offset written out (meta tensors: no memory)."""
    limit = common.INT32_LIMIT
    big = torch.empty(2, limit // 2, device="meta")                     # numel == 2^31
    cases = [
        (torch.empty(limit - 1, device="meta"), False),                 # contiguous, span 2^31 - 1
        (big, True),
        (big[:, :-1], False),                                           # strided: last offset 2^31 - 2
        (big[:1], False),                                               # one row: 2^30
        (big.t(), True),                                                # transposed, same span
        (big[:, :1], False),                                            # offsets 0 and 2^30
        (torch.empty(8, device="meta").expand(limit, 8), False),        # stride 0: span 8
        (torch.empty(0, device="meta"), False),
        (torch.empty(3, limit // 2, device="meta")[::2, :8], True),      # 16 elements, 2^31 apart
    ]
    for t, want in cases:
        span = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride())) if t.numel() else 0
        assert (span >= limit) == want, (t.shape, t.stride(), span)
        assert common.needs_int64(None, t) is want, (t.shape, t.stride())
