"""group-norm: F.group_norm bit for bit in f32; under :bf16 one call in an f32 island, as
bf16 autocast runs group_norm (on its fp32 list), on every target, the interpreter agreeing.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sx2torch import interpret

SOURCE = """
(defparam conv (normal [4 4]))
(defparam weight (normal [4]))
(defparam bias (normal [4]))
(defun forward (x)
  (group-norm (transpose (matmul x conv) [0 2 1]) 2 weight bias :eps 1e-6))
(defun weight-gradient (x)
  (gradient (sum (* (group-norm (transpose (matmul x conv) [0 2 1]) 2 weight bias)
                    (transpose x [0 2 1])))
            weight))
(defrun train :precision %s)
"""


def _state(model) -> dict:
    return {k: v.detach() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("target", ["cuda", "cpu"])
def test_under_bf16_it_is_autocasts_group_norm_of_the_bf16_activations(build, target):
    """What a bf16 model's nn.GroupNorm computes under CUDA autocast: the bf16 activation
    and the f32 weight and bias into group_norm in f32, an f32 output."""
    module, code = build(SOURCE % ":bf16", target=target)
    assert "F.group_norm(" in code  # in an island, with no block: it makes no GEMM
    model = module.Model()
    torch.manual_seed(0)
    x = torch.randn(2, 5, 4)
    state = _state(model)
    h = (x.bfloat16() @ state["conv"].bfloat16()).transpose(1, 2)
    expected = F.group_norm(h.float(), 2, state["weight"], state["bias"], eps=1e-6)
    got = model(x)
    assert got.dtype == torch.float32 and torch.equal(got, expected)
    interpreted = interpret.load(SOURCE % ":bf16", state=state)
    assert torch.equal(interpreted.evaluate("forward", [x]), expected)
    # bit for bit: both are torch.autograd's differentiable backward of F.group_norm in
    # f32 on a contiguous gradient (on the transposed one it adds in another order)
    assert torch.equal(
        model.weight_gradient(x), interpreted.evaluate("weight-gradient", [x])
    )


def test_in_f32_it_is_f_group_norm_and_its_gradient_torch_autograds(build):
    module, _ = build(SOURCE % ":f32")
    model = module.Model()
    x = torch.randn(2, 5, 4)
    state = _state(model)
    weight = state["weight"].clone().requires_grad_()
    h = (x @ state["conv"]).transpose(1, 2)
    out = F.group_norm(h, 2, weight, state["bias"], eps=1e-6)
    assert torch.equal(model(x), out)
    plain = F.group_norm(h, 2, weight, state["bias"])
    (expected,) = torch.autograd.grad((plain * x.transpose(1, 2)).sum(), weight)
    torch.testing.assert_close(model.weight_gradient(x), expected)


def test_the_backward_s_bits_do_not_depend_on_the_gradient_s_layout():
    """sx.group_norm_backward of a transposed gradient gives the bits of the same values
    laid out contiguously (the differentiable backward's sums follow the layout: 2.4e-7
    apart on these values before)."""
    from sx2torch.runtime import group_norm_backward

    torch.manual_seed(0)
    x, weight = torch.randn(2, 4, 5), torch.randn(4)
    grad = torch.randn(2, 5, 4).transpose(1, 2)
    for part in (0, 1, 2):
        assert torch.equal(
            group_norm_backward(grad, x, 2, weight, part=part),
            group_norm_backward(grad.contiguous(), x, 2, weight, part=part),
        )
