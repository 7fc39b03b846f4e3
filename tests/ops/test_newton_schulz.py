"""newton-schulz: the runtime iteration against Muon's formula, the spread of
its singular values, and the op's bf16 region and f32 result."""

import pytest
import torch

from sx2torch.runtime import newton_schulz

COEFFICIENTS = (3.4445, -4.7750, 2.0315)


def reference(g, steps=5, dtype=torch.bfloat16):
    """Written from the formula: X = G / (|G|_F + 1e-7), transposed when tall; steps of
    A = X Xᵀ, B = b A + c A A, X = a X + B X; transposed back."""
    a, b, c = COEFFICIENTS
    x = g.to(dtype)
    tall = x.shape[-2] > x.shape[-1]
    if tall:
        x = x.transpose(-2, -1)
    x = x / (torch.linalg.matrix_norm(x.double(), keepdim=True).to(dtype) + 1e-7)
    for _ in range(steps):
        gram = x @ x.transpose(-2, -1)
        x = a * x + (b * gram + c * (gram @ gram)) @ x
    return x.transpose(-2, -1) if tall else x


SHAPES = [(32, 64), (96, 48), (40, 40), (3, 24, 16)]


@pytest.mark.parametrize("shape", SHAPES)
def test_matches_the_formula_in_bf16(shape):
    torch.manual_seed(0)
    g = torch.randn(*shape)
    got = newton_schulz(g)
    assert got.dtype == torch.float32 and got.shape == g.shape
    expected = reference(g).float()
    torch.testing.assert_close(
        got, expected, rtol=0, atol=0.05
    )  # a few bf16 ulps of values near 1
    close_to_exact = reference(
        g, dtype=torch.float64
    )  # the same iteration without rounding
    assert (got.double() - close_to_exact).abs().max() < 0.1


@pytest.mark.parametrize("shape", SHAPES)
def test_singular_values_lie_within_half_and_one_and_a_half(shape):
    torch.manual_seed(1)
    sigma = torch.linalg.svdvals(newton_schulz(torch.randn(*shape)).double())
    assert sigma.min() > 0.5 and sigma.max() < 1.5, (sigma.min(), sigma.max())


def test_keeps_the_singular_vectors():
    torch.manual_seed(2)
    u, _ = torch.linalg.qr(torch.randn(24, 24, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(16, 16, dtype=torch.float64))
    sigma = torch.linspace(1.0, 10.0, 16, dtype=torch.float64)
    g = (u[:, :16] * sigma) @ v.T
    out = newton_schulz(g.float()).double()
    # Uᵀ out V is diagonal up to bf16 rounding: the iteration only changes singular values.
    core = u[:, :16].T @ out @ v
    off_diagonal = core - torch.diag(torch.diagonal(core))
    assert off_diagonal.abs().max() < 0.05
    assert torch.diagonal(core).min() > 0.5


def test_iterates_in_bf16_and_returns_the_input_dtype():
    g = torch.randn(8, 12, dtype=torch.float64)
    out = newton_schulz(g, steps=2)
    assert out.dtype == torch.float64
    assert torch.equal(out, newton_schulz(g.to(torch.bfloat16), steps=2).double())
    with pytest.raises(ValueError, match="matrix"):
        newton_schulz(torch.randn(5))


SOURCE = """
(require sexpgpu/optim)
(defconst steps 5)
(defparam w (normal [16 8]))
(defun forward (g)
  (newton-schulz (matmul g w) :steps steps))
(defrun train :precision PRECISION)
"""


@pytest.mark.parametrize("precision", ["f32", "bf16"])
def test_the_op_is_a_bf16_region_with_an_f32_result(build, precision):
    module, code = build(SOURCE.replace("PRECISION", ":" + precision))
    assert "with sx.bf16_region():" in code
    assert "sx.newton_schulz(" in code and "steps=self.steps" in code
    torch.manual_seed(0)
    model = module.Model()
    g = torch.randn(24, 16)
    out = model(g)
    assert out.dtype == torch.float32
    if precision == "bf16":
        product = g.to(torch.bfloat16) @ model.w.detach().to(torch.bfloat16)
    else:  # the f32 product, cast down into the region
        product = (g @ model.w.detach()).to(torch.bfloat16)
    torch.testing.assert_close(out, newton_schulz(product).float(), rtol=0, atol=0)


def test_a_different_step_count_is_passed_through(build):
    module, _ = build(SOURCE.replace("PRECISION", ":f32"))
    model = module.Model(steps=2)
    g = torch.randn(24, 16)
    expected = newton_schulz((g @ model.w.detach()).to(torch.bfloat16), steps=2).float()
    torch.testing.assert_close(model(g), expected, rtol=0, atol=0)
