"""Independent float64 oracles: plain sequential loops over time, no scan tricks."""
import torch


def affine_loop(A, B, h0=None, elementwise=False, reverse=False):
    """Prefix (Abar, Bbar) and states h of h_t = A_t h_{t-1} + B_t, in float64 (``reverse``:
    h_t = A_t h_{t+1} + B_t from the end, outputs in time order).

    Elementwise: A, B (batch, T, ...) multiply elementwise. Matrix: A (..., k, k),
    B (..., k, v) multiply as matrices.
    """
    A, B = A.double(), B.double()
    T = A.shape[1]
    if elementwise:
        Abar = torch.ones_like(A[:, 0])
    else:
        Abar = torch.eye(A.shape[-1], dtype=torch.float64).expand_as(A[:, 0]).clone()
    Bbar = torch.zeros_like(B[:, 0])
    h = torch.zeros_like(B[:, 0]) if h0 is None else h0.double().clone()
    As, Bs, hs = [], [], []
    for t in (reversed(range(T)) if reverse else range(T)):
        if elementwise:
            Abar, Bbar, h = A[:, t] * Abar, A[:, t] * Bbar + B[:, t], A[:, t] * h + B[:, t]
        else:
            Abar, Bbar, h = A[:, t] @ Abar, A[:, t] @ Bbar + B[:, t], A[:, t] @ h + B[:, t]
        As.append(Abar), Bs.append(Bbar), hs.append(h)
    if reverse:
        As, Bs, hs = As[::-1], Bs[::-1], hs[::-1]
    return torch.stack(As, 1), torch.stack(Bs, 1), torch.stack(hs, 1)


def log_loop(log_coeffs, log_values, reverse=False):
    """h_1..h_T of h_t = exp(lc_t) h_{t-1} + exp(lv_t), h_0 = exp(lv_0), in float64
    (``reverse``: h_t = exp(lc_t) h_{t+1} + exp(lv_t) from h_{T+1} = exp(lv_0))."""
    a, b = log_coeffs.double().exp(), log_values.double().exp()
    h, hs = b[:, 0], []
    for t in (reversed(range(a.shape[1])) if reverse else range(a.shape[1])):
        h = a[:, t] * h + b[:, t + 1]
        hs.append(h)
    return torch.stack(hs[::-1] if reverse else hs, 1)


def mingru_loop(gate_hidden, h0=None):
    """minGRU's states from its pre-activations [k | v] (B, T, 2D), in float64, step by step:
    h_t = (1 - z_t) h_{t-1} + z_t g(v_t), z = sigmoid(k), g(v) = v + 1/2 (v >= 0), sigmoid(v)."""
    k, v = gate_hidden.double().chunk(2, dim=-1)
    z, g = torch.sigmoid(k), torch.where(v >= 0, v + 0.5, torch.sigmoid(v))
    h = torch.zeros_like(k[:, 0]) if h0 is None else h0.double()
    hs = []
    for t in range(k.shape[1]):
        h = (1 - z[:, t]) * h + z[:, t] * g[:, t]
        hs.append(h)
    return torch.stack(hs, 1)


def signed_loop(proj, h0=None, coupled=False):
    """The signed minGRU's states from its pre-activations [s | zk | v] (B, T, 3D), in float64,
    step by step: h_t = a_t h_{t-1} + z_t v_t, z = sigmoid(zk), a = tanh(s) (times 1 - z coupled)."""
    s, zk, v = proj.double().chunk(3, dim=-1)
    z = torch.sigmoid(zk)
    a = torch.tanh(s) * (1 - z if coupled else 1)
    h = torch.zeros_like(s[:, 0]) if h0 is None else h0.double()
    hs = []
    for t in range(s.shape[1]):
        h = a[:, t] * h + z[:, t] * v[:, t]
        hs.append(h)
    return torch.stack(hs, 1)


def oracle(op_name, inputs, h0=None):
    """The oracle's outputs for a registry op, as the op returns them (prefix form)."""
    if op_name == "parallel_scan_log":
        return log_loop(*inputs)
    if op_name == "linear_scan":
        A, Bc, _ = affine_loop(*inputs, elementwise=True)
        return A, Bc
    if op_name == "linear_scan_state":
        return affine_loop(*inputs, elementwise=True)[2]
    if op_name == "matrix_scan":
        M, b = inputs
        A, Bc, _ = affine_loop(M, b.unsqueeze(-1))
        return A, Bc.squeeze(-1)
    A, Bc, _ = affine_loop(*inputs)
    return A, Bc


def states(op_name, inputs, h0):
    """The oracle's states h from h0 (zeros when None) for the three affine ops."""
    if op_name in ("linear_scan", "linear_scan_state"):
        return affine_loop(*inputs, h0=h0, elementwise=True)[2]
    if op_name == "matrix_scan":
        M, b = inputs
        return affine_loop(M, b.unsqueeze(-1), None if h0 is None else h0.unsqueeze(-1))[2].squeeze(-1)
    return affine_loop(*inputs, h0=h0)[2]


def poison_cuda_cache(value=float("nan")):
    """Fill the CUDA caching allocator's free blocks with ``value`` (NaN): a kernel or graph
    that reads memory nobody wrote then fails at once, instead of passing on the zeros of
    fresh device memory (a process that ran other work first hands out stale values)."""
    if not torch.cuda.is_available():
        return
    blocks = [torch.full((1 << 17,), value, device="cuda") for _ in range(64)]  # small pool: 512 KiB blocks
    blocks += [torch.full((1 << 24,), value, device="cuda") for _ in range(4)]  # large pool: 64 MiB blocks
    torch.cuda.synchronize()
    del blocks
