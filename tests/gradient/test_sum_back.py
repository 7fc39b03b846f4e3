"""The gradient pass sums an operand's gradient back to its shape only where the forward
broadcast it: where the shapes after trace show the broadcast kept the operand's shape, the
gradient is used as it is; where they do not (a size or rank not known), it is summed.
"""

from __future__ import annotations

import pytest
import torch

from conftest import method_code as method, seeded_model

SOURCE = """
(defparam a (normal [2 3 4]))
(defparam b (normal [4]))
(defparam w (normal [4 5]))
(defun to-a (x) (* x (gradient (sum (* (tanh a) b)) a)))
(defun to-b (x) (* x (gradient (sum (* (tanh a) b)) b)))
(defun squared (x) (gradient (sum (* x x)) x))
(defun to-w (x) (* x (gradient (sum (tanh (matmul a w))) w)))
(defun through-w (x) (* x (gradient (sum (tanh (matmul a w))) a)))
(defun forward (x) (gradient (sum (* x b)) x))
(defun by-mean (x) (gradient (sum (* x (mean x :axes [-1] :keepdims true))) x))
"""


@pytest.fixture(scope="module")
def built():
    return seeded_model(SOURCE)


@pytest.mark.parametrize(
    "name, summed",
    [
        ("to_a", False),  # b, [4], broadcast against a, [2 3 4], keeps a's shape
        ("to_b", True),
        ("squared", False),  # x times x: one shape, whatever it is
        ("to_w", True),  # a's batch axis: w's gradient is summed over it
        ("through_w", False),  # w has no batch axes
        ("forward", True),  # x's shape is not known
    ],
)
def test_a_sum_back_is_written_where_a_broadcast_happened(built, name, summed):
    _, code = built
    assert ("sum_to_size" in method(code, name)) == summed


def test_a_reduction_keeping_its_axes_broadcasts_as_its_input(built):
    """x's mean keeping its axes broadcasts against x keeping x's shape, whatever it is: x's
    contribution is not summed back, the mean's (a real broadcast) is."""
    _, code = built
    body = method(code, "by_mean")
    assert "sum_to_size(x.shape)" not in body
    assert "sum_to_size(mean_x.shape)" in body


def test_the_gradients_are_autograds(built):
    model, _ = built
    a, b, w = (
        p.detach().double().requires_grad_() for p in (model.a, model.b, model.w)
    )
    y = torch.tanh(a) * b
    da, db = torch.autograd.grad(y.sum(), (a, b))
    m = torch.tanh(a @ w)
    dw, da_w = torch.autograd.grad(m.sum(), (w, a))
    x = torch.randn(3, 4, dtype=torch.float64)
    one = torch.ones((), dtype=torch.float64)
    close = torch.testing.assert_close
    close(model.to_a(one.float()).double(), da, rtol=1e-5, atol=1e-6)
    close(model.to_b(one.float()).double(), db, rtol=1e-5, atol=1e-6)
    close(model.to_w(one.float()).double(), dw, rtol=1e-5, atol=1e-6)
    close(model.through_w(one.float()).double(), da_w, rtol=1e-5, atol=1e-6)
    close(model.squared(x.float()).double(), 2 * x.float().double(), rtol=0, atol=0)
    close(model.forward(x.float()).double(), b.detach().expand(3, 4), rtol=0, atol=0)
    leaf = x.clone().requires_grad_()
    (by_mean,) = torch.autograd.grad((leaf * leaf.mean(-1, keepdim=True)).sum(), leaf)
    close(model.by_mean(x.float()).double(), by_mean, rtol=1e-5, atol=1e-6)


def test_a_sum_back_to_a_0_d_operand_is_a_full_sum():
    """(- b (sum x)) broadcasts the 0-d sum to b's shape: its gradient is summed over all
    of b's axes, without computing the sum for its shape (it read torch.sum(x).shape)."""
    model, code = seeded_model(
        "(defparam b (normal [4]))\n(defun forward (x) (gradient (sum (- b (sum x))) x))\n"
    )
    body = method(code, "forward")
    assert "(-grad_sub_b).sum()" in body and "torch.sum(x)" not in body
    x = torch.randn(3, 4)
    assert torch.equal(model(x), torch.full((3, 4), -4.0))
