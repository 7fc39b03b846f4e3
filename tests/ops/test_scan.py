"""linear-scan and matrix-scan: the runtime's parallel scans against sequential
loops in float64, their gradients against autograd through those loops, and
the op's emission and f32 mark."""

import pytest
import torch

from sx2torch.runtime import linear_scan, matrix_scan

LENGTHS = [1, 2, 3, 37, 1000]


def linear_loop(a, b, dim):
    a, b = torch.broadcast_tensors(a.movedim(dim, 0), b.movedim(dim, 0))
    h, out = torch.zeros_like(b[0]), []
    for a_t, b_t in zip(a, b):
        h = a_t * h + b_t
        out.append(h)
    return torch.stack(out).movedim(0, dim)


def matrix_loop(a, b, dim):
    a, b = a.movedim(dim, 0), b.movedim(dim, 0)
    h, out = torch.zeros_like(b[0]), []
    for a_t, b_t in zip(a, b):
        h = (a_t @ h.unsqueeze(-1)).squeeze(-1) + b_t
        out.append(h)
    return torch.stack(out).movedim(0, dim)


def decays(*shape, dtype=torch.float32):
    """Gates in (0.5, 1): the state remembers hundreds of steps back."""
    return (0.5 + 0.5 * torch.rand(*shape, dtype=torch.float64)).to(dtype)


def contractions(*shape, n, dtype=torch.float32):
    """Matrices of spectral norm below 1, so long products stay bounded."""
    m = torch.randn(*shape, n, n, dtype=torch.float64)
    return (0.95 * m / torch.linalg.matrix_norm(m, ord=2, keepdim=True)).to(dtype)


@pytest.mark.parametrize("length", LENGTHS)
def test_linear_scan_matches_the_loop(length):
    torch.manual_seed(length)
    a, b = decays(2, length, 3), torch.randn(2, length, 3)
    expected = linear_loop(a.double(), b.double(), 1)
    got = linear_scan(a, b, dim=1)
    assert got.dtype == torch.float32 and got.shape == (2, length, 3)
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("length", LENGTHS)
def test_linear_scan_is_exact_in_float64(length):
    torch.manual_seed(length)
    a, b = decays(length, 2, dtype=torch.float64), torch.randn(
        length, 2, dtype=torch.float64
    )
    torch.testing.assert_close(
        linear_scan(a, b, dim=0), linear_loop(a, b, 0), rtol=1e-12, atol=1e-12
    )


def test_linear_scan_broadcasts_a_gate_and_takes_a_negative_axis():
    torch.manual_seed(0)
    a, b = decays(4, 1, 9), torch.randn(4, 5, 9)
    got = linear_scan(a, b, dim=-1)
    torch.testing.assert_close(
        got.double(), linear_loop(a.double(), b.double(), -1), rtol=1e-5, atol=1e-5
    )
    assert got.shape == (4, 5, 9)


@pytest.mark.parametrize("length", LENGTHS)
def test_matrix_scan_matches_the_loop(length):
    torch.manual_seed(length)
    a, b = contractions(2, length, n=4), torch.randn(2, length, 4)
    expected = matrix_loop(a.double(), b.double(), 1)
    got = matrix_scan(a, b, dim=1)
    assert got.dtype == torch.float32 and got.shape == (2, length, 4)
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)


def test_matrix_scan_shape_convention():
    """dim counts the shared batch axes (negative from the last of them); A broadcasts."""
    torch.manual_seed(1)
    a, b = contractions(n=3), torch.randn(2, 7, 3)  # one A for every step
    got = matrix_scan(a, b, dim=-1)
    expected = matrix_loop(a.expand(2, 7, 3, 3).double(), b.double(), 1)
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="batch axes"):
        matrix_scan(a, b, dim=2)
    with pytest.raises(ValueError, match=r"\[\.\.\., 3, 3\]"):
        matrix_scan(torch.randn(7, 2, 2), b, dim=1)


def test_matrix_scan_of_diagonal_matrices_is_the_linear_scan():
    torch.manual_seed(2)
    a, b = decays(3, 11, 5), torch.randn(3, 11, 5)
    torch.testing.assert_close(
        matrix_scan(torch.diag_embed(a), b), linear_scan(a, b), rtol=1e-5, atol=1e-6
    )


def grad(y, xs):
    """A step's A never meets h_{-1} = 0, so at length 1 the scan does not read it: zero gradient."""
    return torch.autograd.grad(y, xs, materialize_grads=True)


class _Scans(torch.nn.Module):
    def forward(self, a, b, m):
        return linear_scan(a, b, dim=1), matrix_scan(m, b, dim=1)


def test_an_exported_scan_takes_any_sequence_length():
    """torch.export with a dynamic length: the rounds are counted for the most the length
    may be, the ones past it changing nothing, so the program exported at length 6 gives
    the eager scan's bits at every other length."""
    length = torch.export.Dim("T", min=2, max=64)
    torch.manual_seed(0)
    shapes = ({1: length}, {1: length}, {1: length})
    exported = torch.export.export(
        _Scans(),
        (decays(2, 6, 3), torch.randn(2, 6, 3), contractions(2, 6, n=3)),
        dynamic_shapes=shapes,
    ).module()
    for t in (2, 13, 37):
        args = decays(2, t, 3), torch.randn(2, t, 3), contractions(2, t, n=3)
        for got, want in zip(exported(*args), _Scans()(*args)):
            assert torch.equal(got, want)


@pytest.mark.parametrize("length", [1, 2, 3, 37])
def test_linear_scan_gradients_match_autograd_through_the_loop(length):
    torch.manual_seed(length)
    a = decays(2, length, 3, dtype=torch.float64).requires_grad_()
    b = torch.randn(2, length, 3, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(2, length, 3, dtype=torch.float64)
    scan_grads = grad((linear_scan(a, b) * weight).sum(), (a, b))
    loop_grads = grad((linear_loop(a, b, 1) * weight).sum(), (a, b))
    for got, expected in zip(scan_grads, loop_grads):
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("length", [1, 2, 3, 37])
def test_matrix_scan_gradients_match_autograd_through_the_loop(length):
    torch.manual_seed(length)
    a = contractions(2, length, n=3, dtype=torch.float64).requires_grad_()
    b = torch.randn(2, length, 3, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(2, length, 3, dtype=torch.float64)
    scan_grads = grad((matrix_scan(a, b) * weight).sum(), (a, b))
    loop_grads = grad((matrix_loop(a, b, 1) * weight).sum(), (a, b))
    for got, expected in zip(scan_grads, loop_grads):
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)


def test_scan_gradients_in_float32_at_length_1000():
    torch.manual_seed(3)
    a = decays(1, 1000, 2).requires_grad_()
    b = torch.randn(1, 1000, 2, requires_grad=True)
    weight = torch.randn(1, 1000, 2)
    scan_grads = torch.autograd.grad((linear_scan(a, b) * weight).sum(), (a, b))
    a64, b64 = (
        a.detach().double().requires_grad_(),
        b.detach().double().requires_grad_(),
    )
    loop_grads = torch.autograd.grad(
        (linear_loop(a64, b64, 1) * weight.double()).sum(), (a64, b64)
    )
    for got, expected in zip(scan_grads, loop_grads):
        torch.testing.assert_close(got.double(), expected, rtol=1e-4, atol=1e-4)


def mamba_slow_path_loop(discrete_a, delta_b_u):
    """The recurrence as transformers' MambaMixer.slow_forward writes it: [batch, inner,
    time, state], the state from zeros, one multiply and one add a step."""
    state, states = torch.zeros_like(delta_b_u[:, :, 0]), []
    for i in range(delta_b_u.shape[2]):
        state = discrete_a[:, :, i, :] * state + delta_b_u[:, :, i, :]
        states.append(state)
    return torch.stack(states, dim=2)


def mamba_inputs(inner=64, length=37, state=64):
    """A Mamba block's decays exp(A dt), A = -[1..state] as its initialisation, and inputs."""
    torch.manual_seed(4)
    dt = torch.nn.functional.softplus(torch.randn(1, inner, length, 1) - 2)
    a = -torch.arange(1, state + 1, dtype=torch.float32)
    return torch.exp(a * dt), dt * torch.randn(1, inner, length, state)


@pytest.mark.parametrize("dim", [2, -2])
def test_a_wide_recurrence_on_the_cpu_gives_the_bits_of_the_loop_as_written(dim):
    """Each step holds 4,096 elements: the runtime runs the loop, several times faster
    than the scan there, and gets the bits of a model file's own loop."""
    discrete_a, delta_b_u = mamba_inputs()
    assert torch.equal(
        linear_scan(discrete_a, delta_b_u, dim=dim),
        mamba_slow_path_loop(discrete_a, delta_b_u),
    )


def test_the_loops_gradients_match_autograd_through_the_loop_in_float64():
    discrete_a, delta_b_u = (t.requires_grad_() for t in mamba_inputs(length=9))
    weight = torch.randn(delta_b_u.shape)
    got = grad(
        (linear_scan(discrete_a, delta_b_u, dim=2) * weight).sum(),
        (discrete_a, delta_b_u),
    )
    a64, b64 = (t.detach().double().requires_grad_() for t in (discrete_a, delta_b_u))
    loop = mamba_slow_path_loop(a64, b64)
    expected = grad((loop * weight.double()).sum(), (a64, b64))
    for g, e in zip(got, expected):
        torch.testing.assert_close(g.double(), e, rtol=1e-5, atol=1e-6)


SOURCE = """
(defconst d 8)
(defparam w (normal [d d] :std 0.1))
(defun forward (x)
  (let ((a (sigmoid (matmul x w)))
        (b (matmul x w)))
    (linear-scan a b :axis 1)))
(defun rotate (m x)
  (matrix-scan (matmul m w) (matmul x w)))
(defrun train :precision PRECISION)
"""


@pytest.mark.parametrize("precision", ["f32", "bf16"])
def test_the_ops_emit_one_call_in_an_f32_island(build, precision):
    module, code = build(SOURCE.replace("PRECISION", ":" + precision))
    assert "sx.linear_scan(" in code and "sx.matrix_scan(" in code and "dim=1" in code
    torch.manual_seed(0)
    model = module.Model()
    x = torch.randn(2, 5, 8)
    h = model(x)
    assert h.dtype == torch.float32  # f32 under :bf16 too: the scan is an island
    w = model.w.detach()
    if precision == "bf16":
        w = w.to(torch.bfloat16)
        x = x.to(torch.bfloat16)
    expected = linear_loop(torch.sigmoid(x @ w).double(), (x @ w).double(), 1)
    torch.testing.assert_close(h.double(), expected, rtol=1e-5, atol=1e-5)
    m = torch.randn(2, 5, 8, 8) * 0.1
    assert model.rotate(m, x.float()).dtype == torch.float32


def test_the_bf16_scan_reads_its_inputs_up(build):
    _, code = build(SOURCE.replace("PRECISION", ":bf16"))
    assert "sx.linear_scan(a.float(), b.float(), dim=1)" in code
