"""Mixed precision: every mixer and path under torch.autocast (bf16) trains: h comes out in the
autocast dtype, close to the float64 layer, with grads for x and every parameter in theirs."""
import itertools

import pytest
import torch

import scankit

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
MIXERS = {
    "mingru": lambda **kw: scankit.MinGRU(5, 6, **kw),
    "signed": lambda **kw: scankit.SignedMinGRU(5, 6, **kw),
    "signed_coupled": lambda **kw: scankit.SignedMinGRU(5, 6, coupled=True, **kw),
    "rotation": lambda **kw: scankit.RotationMinGRU(5, 6, **kw),
    "givens": lambda **kw: scankit.GivensMinGRU(5, 8, block_size=4, rounds=2, **kw),
}
# (decay, h_0 given, packed): the fused gate kernels, decay's unfused terms, packed sequences
PATHS = list(itertools.product([False, True], [False, True], [False, True]))


@pytest.mark.parametrize("decay,given_h0,packed", PATHS, ids=lambda v: str(int(v)))
@pytest.mark.parametrize("name", list(MIXERS))
def test_mixer_trains_under_bf16_autocast(name, decay, given_h0, packed, kernel_mode, seed):
    torch.manual_seed(seed)
    m = MIXERS[name](decay=decay).to(DEVICE)
    T = 13
    B, lengths = (1, [4, 1, 8]) if packed else (2, None)
    N = len(lengths) if packed else B
    x = torch.randn(B, T if not packed else sum(lengths), 5, device=DEVICE)
    kw = {}
    if decay:
        kw["delta_t"] = torch.rand(x.shape[:2], device=DEVICE) * 2
    if given_h0:
        kw["h_0"] = torch.rand(N, m.hidden_size, device=DEVICE) + 0.1
    if packed:
        kw["cu_seqlens"] = torch.tensor([0, *itertools.accumulate(lengths)], device=DEVICE)
    xg = x.clone().requires_grad_()
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        h = m(xg, **kw)
    assert h.dtype == torch.bfloat16 and h.shape == (*x.shape[:2], m.hidden_size)
    h.float().square().sum().backward()
    assert xg.grad.dtype == torch.float32 and torch.isfinite(xg.grad).all()
    for pname, p in m.named_parameters():
        if given_h0 and pname == "h0":  # the block mixers' learned h_0, replaced by the given one
            assert p.grad is None
            continue
        assert p.grad is not None and p.grad.dtype == torch.float32 and torch.isfinite(p.grad).all(), pname
    with torch.no_grad():  # the oracle: the same layer in float64, eager
        m64 = m.double()
        kw64 = {k: v.double() if v.is_floating_point() else v for k, v in kw.items()}
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("MINGRU_SCAN", "eager")
            ref = m64(x.double(), **kw64)
    # bf16 projections and terms (8 bits): a few parts in a hundred of the state's size over 13 steps
    torch.testing.assert_close(h.double(), ref, rtol=0.05, atol=0.05 * max(1.0, ref.abs().max().item()))


@pytest.mark.parametrize("op_name", ["parallel_scan_log", "linear_scan", "linear_scan_state", "matrix_scan",
                                     "matrix_affine_scan"])
def test_ops_keep_their_inputs_dtype_under_autocast(op_name, kernel_mode, seed):
    """An op is not an autocast op: bf16 in, bf16 out on both paths (the eager references run
    outside autocast, whose fp32 exp / log would otherwise change their outputs' dtype), with
    values of the op outside autocast."""
    from benchmarks.harness.cases import OPS

    dims = {"parallel_scan_log": dict(B=2, D=5), "linear_scan": dict(B=2, D=5), "linear_scan_state": dict(B=2, D=5),
            "matrix_scan": dict(B=2, n=3), "matrix_affine_scan": dict(B=2, n=2, k=4, v=2)}[op_name]
    xs = [x.to(torch.bfloat16) for x in OPS[op_name].inputs(dict(dims, T=13), device=DEVICE, seed=seed)]
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        outs = OPS[op_name].fn(*xs)
    want = OPS[op_name].fn(*xs)
    for o, w in zip(outs if isinstance(outs, tuple) else (outs,), want if isinstance(want, tuple) else (want,)):
        assert o.dtype == torch.bfloat16
        torch.testing.assert_close(o, w)


@pytest.mark.parametrize("decay", [False, True])
@pytest.mark.parametrize("name", list(MIXERS))
def test_step_continues_forward_in_its_dtype_under_autocast(name, decay, kernel_mode, seed):
    """Streaming under autocast: forward over a prefix, then step from its final state, gives the
    states of one forward over the whole sequence, in the same dtype."""
    torch.manual_seed(seed)
    m = MIXERS[name](decay=decay).to(DEVICE)
    x = torch.randn(2, 9, 5, device=DEVICE)
    dt = torch.rand(2, 9, device=DEVICE) * 2 if decay else None
    with torch.no_grad(), torch.autocast(DEVICE, dtype=torch.bfloat16):
        whole = m(x, delta_t=dt)
        prefix, state = m(x[:, :5], delta_t=None if dt is None else dt[:, :5], return_final_state=True)
        steps = []
        for t in range(5, 9):
            state = m.step(x[:, t], state, None if dt is None else dt[:, t])
            steps.append(state)
    assert prefix.dtype == state.dtype == whole.dtype == torch.bfloat16
    got = torch.cat([prefix, torch.stack(steps, 1)], 1)
    torch.testing.assert_close(got.float(), whole.float(), rtol=0.05, atol=0.05 * max(1.0, whole.abs().max().item()))
