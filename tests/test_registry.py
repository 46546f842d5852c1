"""The registry: seeded builders, named shapes, byte models, the parity grid; shape fuzzing."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.harness import cases
from benchmarks.harness.cases import OPS, SHAPES, bytes_moved
from oracles import oracle

COPY_BW = 4.24e12  # bytes/s, ANCHORS.md


def meta_outputs(op, xs):
    with torch.device("meta"):
        out = op.eager(*[torch.empty(x.shape, dtype=x.dtype) for x in xs])
    return out if isinstance(out, tuple) else (out,)


@pytest.mark.parametrize("op_name", list(OPS))
def test_input_shapes_match_builders(op_name):
    op = OPS[op_name]
    dims = dict(op.dims_at(SHAPES["lab"]), B=2, T=5)
    assert [tuple(x.shape) for x in op.inputs(dims)] == [tuple(s) for s in op.input_shapes(dims)]


@pytest.mark.parametrize("op_name", list(OPS))
def test_builders_are_seeded_and_fresh(op_name):
    op = OPS[op_name]
    dims = dict(op.dims_at(SHAPES["lab"]), B=2, T=5)
    a, b, c = op.inputs(dims, seed=1), op.inputs(dims, seed=1), op.inputs(dims, seed=2)
    for x, y, z in zip(a, b, c):
        assert torch.equal(x, y) and not torch.equal(x, z)


# fwd / fwd+bwd floors of ANCHORS.md at `large`, in microseconds
ANCHOR_FLOORS = {
    "linear_scan": (506, 1519),
    "linear_scan_state": (380, 1140),  # ANCHORS: 3 tensors x 512 MiB -> 380 us (h-only floor)
    "parallel_scan_log": (380, 1140),
    "matrix_scan": (190, 570),
    "matrix_affine_scan": (570, 1709),
}


@pytest.mark.parametrize("op_name", list(OPS))
def test_byte_model_matches_anchor_floors(op_name):
    op = OPS[op_name]
    dims = op.dims_at(SHAPES["large"])
    xs = [torch.empty(s, device="meta") for s in op.input_shapes(dims)]
    outs = meta_outputs(op, xs)
    for direction, floor_us in zip(("fwd", "fwdbwd"), ANCHOR_FLOORS[op_name]):
        assert bytes_moved(xs, outs, direction) / COPY_BW * 1e6 == pytest.approx(floor_us, rel=0.01)


def test_parity_grid_has_the_seed_size():
    grid = list(cases.check_dims())
    assert len(grid) == 300  # the seed's 290 (x fwd, grad = 580 rows) + 10 of linear_scan_state
    assert {op for op, _ in grid} == set(OPS)


@settings(max_examples=25, deadline=None)
@given(op_name=st.sampled_from(list(OPS)), B=st.integers(1, 3), T=st.integers(1, 70), W=st.integers(1, 6),
       kv=st.tuples(st.integers(1, 5), st.integers(1, 4)), seed=st.integers(0, 2**31))
def test_fuzz_shapes_against_oracle(op_name, B, T, W, kv, seed):
    op = OPS[op_name]
    dims = {"parallel_scan_log": dict(B=B, T=T, D=W), "linear_scan": dict(B=B, T=T, D=W),
            "linear_scan_state": dict(B=B, T=T, D=W),
            "matrix_scan": dict(B=B, T=T, n=W), "matrix_affine_scan": dict(B=B, T=T, n=W, k=kv[0], v=kv[1])}[op_name]
    xs = op.inputs(dims, dtype=torch.float64, seed=seed)
    out, ref = op.eager(*xs), oracle(op_name, xs)
    for o, r in zip(out if isinstance(out, tuple) else (out,), ref if isinstance(ref, tuple) else (ref,)):
        torch.testing.assert_close(o, r, atol=1e-9, rtol=1e-9)
