"""Mixers: forward equals the token-by-token step loop; decay, h_0, blocks, stacks."""
import math

import pytest
import torch

import scankit
from scankit.mixers import givens_matrix

MIXERS = {
    "mingru": lambda **kw: scankit.MinGRU(5, 6, **kw),
    "signed": lambda **kw: scankit.SignedMinGRU(5, 6, **kw),
    "signed_coupled": lambda **kw: scankit.SignedMinGRU(5, 6, coupled=True, **kw),
    "rotation": lambda **kw: scankit.RotationMinGRU(5, 6, **kw),
    "rotation_snap": lambda **kw: scankit.RotationMinGRU(5, 6, snap=(2, 3, 4), **kw),
    "givens": lambda **kw: scankit.GivensMinGRU(5, 16, **kw),
    "givens_k2_r1": lambda **kw: scankit.GivensMinGRU(5, 6, block_size=2, rounds=1, **kw),
    "givens_k4_r2": lambda **kw: scankit.GivensMinGRU(5, 8, block_size=4, rounds=2, **kw),
}


def step_loop(m, x, h0=None, delta_t=None):
    h, hs = h0, []
    for t in range(x.shape[1]):
        h = m.step(x[:, t], h, None if delta_t is None else delta_t[:, t])
        hs.append(h)
    return torch.stack(hs, 1)


@pytest.mark.parametrize("T", [1, 13, 40])
@pytest.mark.parametrize("decay", [False, True])
@pytest.mark.parametrize("name", list(MIXERS))
def test_forward_matches_step(name, decay, T, seed, scan_mode):
    scan_mode("eager")
    torch.manual_seed(seed)
    m = MIXERS[name](decay=decay).double()
    x = torch.randn(3, T, 5, dtype=torch.float64)
    dt = torch.rand(3, T, dtype=torch.float64) * 2 if decay else None
    h = m(x, delta_t=dt)
    assert h.shape == (3, T, m.hidden_size)
    torch.testing.assert_close(h, step_loop(m, x, delta_t=dt), atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("name", list(MIXERS))
def test_given_h0_is_used(name, seed, scan_mode):
    scan_mode("eager")
    torch.manual_seed(seed)
    m = MIXERS[name]().double()
    x = torch.randn(2, 13, 5, dtype=torch.float64)
    h0 = torch.rand(2, m.hidden_size, dtype=torch.float64) + 0.1
    h = m(x, h_0=h0)
    torch.testing.assert_close(h, step_loop(m, x, h0), atol=1e-10, rtol=1e-10)
    assert not torch.allclose(h[:, 0], m(x)[:, 0]), "h_0 had no effect on the first state"


def test_mingru_states_positive_and_default_h0(scan_mode):
    scan_mode("eager")
    m = scankit.MinGRU(5, 6).double()
    x = torch.randn(2, 9, 5, dtype=torch.float64)
    assert (m(x) > 0).all()
    torch.testing.assert_close(m(x), m(x, h_0=torch.full((2, 6), 0.5, dtype=torch.float64)))


def test_gradients_flow_to_every_parameter(scan_mode):
    scan_mode("eager")
    for name, make in MIXERS.items():
        m = make(decay=True)
        m(torch.randn(2, 7, 5), delta_t=torch.rand(2, 7)).square().sum().backward()
        for pname, p in m.named_parameters():
            assert p.grad is not None and torch.isfinite(p.grad).all(), f"{name}.{pname}"
            if pname != "h0" or "givens" in name or "rotation" in name:
                assert p.grad.abs().sum() > 0, f"{name}.{pname} got a zero gradient"


@pytest.mark.parametrize("k,rounds", [(2, 1), (4, 3), (8, 3), (16, 2)])
def test_givens_matrix_is_special_orthogonal_and_matches_explicit_product(k, rounds):
    angles = torch.rand(3, rounds, k // 2, dtype=torch.float64) * 2 * math.pi
    M = givens_matrix(angles, k)
    eye = torch.eye(k, dtype=torch.float64)
    torch.testing.assert_close(M @ M.transpose(-1, -2), eye.expand_as(M))
    torch.testing.assert_close(torch.linalg.det(M), torch.ones(3, dtype=torch.float64))
    expected = eye.expand(3, k, k)
    for r in range(rounds):
        G = eye.repeat(3, 1, 1)
        for p, i in enumerate(range(r % 2, k, 2)):
            i, j = i % k, (i + 1) % k
            c, s = torch.cos(angles[:, r, p]), torch.sin(angles[:, r, p])
            G[:, i, i], G[:, i, j], G[:, j, i], G[:, j, j] = c, -s, s, c
        expected = G @ expected
    torch.testing.assert_close(M, expected)


def test_rotation_snap_uses_straight_through(scan_mode):
    scan_mode("eager")
    m = scankit.RotationMinGRU(5, 6, snap=(4,))
    theta = torch.randn(2, 3, 3, requires_grad=True)
    snapped, _ = m._angles(torch.cat([theta, torch.zeros_like(theta)], -1))
    snapped = snapped[..., 0, 0]
    steps = snapped / (2 * math.pi / 4)
    torch.testing.assert_close(steps, steps.round())
    snapped.sum().backward()
    torch.testing.assert_close(theta.grad, torch.ones_like(theta))


@pytest.mark.parametrize("mixer", ["mingru", "signed", "rotation", "givens", ["givens", "mingru"]])
def test_stack_step_matches_forward(mixer, seed, scan_mode):
    scan_mode("eager")
    torch.manual_seed(seed)
    depth = 1 if isinstance(mixer, str) else len(mixer)
    stack = scankit.MinGRUStack(16, depth, mixer=mixer).double()
    x = torch.randn(2, 11, 16, dtype=torch.float64)
    y = stack(x)
    states, ys = None, []
    for t in range(x.shape[1]):
        y_t, states = stack.step(x[:, t], states)
        ys.append(y_t)
    torch.testing.assert_close(y, torch.stack(ys, 1), atol=1e-10, rtol=1e-10)


def test_block_is_pre_norm_residual(scan_mode):
    scan_mode("eager")
    block = scankit.MinGRUBlock(8, "signed")
    for p in list(block.mixer.parameters()) + list(block.mlp.parameters()):
        torch.nn.init.zeros_(p)
    x = torch.randn(2, 5, 8)
    torch.testing.assert_close(block(x), x)
