"""causal-attention: the explicit composition against float64 references and
`F.scaled_dot_product_attention`, its dtypes under both policies, and the mask."""

import math

import pytest
import torch
import torch.nn.functional as F

from sx2torch.runtime import causal_mask


def reference(q, k, v):
    """softmax(Q Kᵀ / sqrt(d) + causal mask) V in float64."""
    q, k, v = q.double(), k.double(), v.double()
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    above = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).triu(1)
    return torch.softmax(scores.masked_fill(above, -math.inf), dim=-1) @ v


def bf16_by_the_rules(q, k, v):
    """Each step as the :bf16 policy rounds it: bf16 matmuls and scale, an f32 mask and softmax."""
    q, k, v = (x.to(torch.bfloat16) for x in (q, k, v))
    scores = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
    above = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).triu(1)
    weights = torch.softmax(scores.float().masked_fill(above, -math.inf), dim=-1)
    return weights.to(torch.bfloat16) @ v


SOURCE = """
(require sexpgpu/nn)
(defun forward (q k v)
  (let ((q (cast q :bf16))
        (k (cast k :bf16))
        (v (cast v :bf16)))
    (causal-attention q k v)))
(defrun fast :precision :bf16)
(defrun exact :precision :f32)
"""
F32_SOURCE = """
(defun forward (q k v)
  (causal-attention q k v))
"""


def qkv(*shape, keys=None, seed=0):
    torch.manual_seed(seed)
    batch, time, d = shape[:-2], shape[-2], shape[-1]
    keys = keys or time
    return (
        torch.randn(*shape),
        torch.randn(*batch, keys, d),
        torch.randn(*batch, keys, d),
    )


@pytest.mark.parametrize("shape", [(1, 1, 8), (2, 3, 17, 16), (4, 64, 32)])
def test_f32_matches_float64(build, shape):
    module, _ = build(F32_SOURCE)
    q, k, v = qkv(*shape)
    got = module.Model()(q, k, v)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), reference(q, k, v), rtol=1e-5, atol=1e-5)


def test_bf16_computes_each_step_as_the_rules_round_it(build):
    module, code = build(SOURCE, run="fast")
    q, k, v = qkv(2, 4, 33, 32)
    got = module.Model()(q, k, v)
    assert got.dtype == torch.bfloat16  # the second matmul reads bf16 V
    assert torch.equal(got, bf16_by_the_rules(q, k, v))
    error = (got.double() - reference(q, k, v)).abs().max()
    assert error < 0.05, error


def test_bf16_softmax_is_an_f32_island_and_the_matmuls_are_bf16(build):
    _, code = build(SOURCE, run="fast")
    function = code[code.index("def causal_attention") : code.index("class ")]
    before, after = function.split("# (causal-attention q k v)")  # no GEMM: no block
    assert "scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5" in before
    assert "weights = torch.softmax(sx.causal_mask(scores.float()), dim=-1)" in after
    assert "return weights.to(torch.bfloat16) @ v" in after


def test_f32_run_of_the_same_file_casts_nothing_up(build):
    _, code = build(SOURCE, run="exact")
    assert "scores.float()" not in code and "weights.to(" not in code


@pytest.mark.parametrize("queries, keys", [(5, 5), (3, 7), (7, 3)])
def test_the_mask_is_aligned_top_left_as_sdpa_is_causal(build, queries, keys):
    module, _ = build(F32_SOURCE)
    q, k, v = (x.double() for x in qkv(2, queries, 8, keys=keys))
    got = module.Model()(q, k, v)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


def test_gradients_match_sdpa_in_float64(build):
    module, _ = build(F32_SOURCE)
    q, k, v = (x.double().requires_grad_() for x in qkv(2, 2, 9, 8))
    weight = torch.randn(2, 2, 9, 8, dtype=torch.float64)
    ours = torch.autograd.grad((module.Model()(q, k, v) * weight).sum(), (q, k, v))
    fused = torch.autograd.grad(
        (F.scaled_dot_product_attention(q, k, v, is_causal=True) * weight).sum(),
        (q, k, v),
    )
    for got, expected in zip(ours, fused):
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)


def test_causal_mask_keeps_the_diagonal_and_below():
    scores = torch.zeros(2, 3, 4)
    masked = causal_mask(scores)
    expected = torch.tensor(
        [
            [0.0, -math.inf, -math.inf, -math.inf],
            [0.0, 0.0, -math.inf, -math.inf],
            [0.0, 0.0, 0.0, -math.inf],
        ]
    )
    assert torch.equal(masked, expected.expand(2, 3, 4))
    assert causal_mask(scores.to(torch.bfloat16)).dtype == torch.bfloat16


def test_causal_mask_compiles_without_graph_breaks():
    explanation = torch._dynamo.explain(causal_mask)(torch.randn(2, 5, 5))
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1


@pytest.mark.parametrize(
    "expression, reference",
    [
        ("(causal-mask x :fill 0.0)", lambda x, q: causal_mask(x, fill=0.0)),
        ("(attention-scale x q)", lambda x, q: x * q.shape[-1] ** -0.5),
    ],
)
def test_derivative_rules_of_the_mask_and_the_scale(build, expression, reference):
    module, _ = build(f"(defun forward (x q c) (gradient (sum (* {expression} c)) x))")
    torch.manual_seed(0)
    x, q, c = torch.randn(2, 3, 4), torch.randn(2, 3, 16), torch.randn(2, 3, 4)
    leaf = x.clone().requires_grad_()
    (expected,) = torch.autograd.grad((reference(leaf, q) * c).sum(), leaf)
    torch.testing.assert_close(module.Model()(x, q, c), expected)
