"""Gradients flow through defun calls and sub-model calls traced inside the gradient form."""

from __future__ import annotations

import pytest
import torch

from sx2torch.compiler import compile_source
from sx2torch.errors import SourceError

SOURCE = """
(defmodel mlp (&key (d 3) (hidden 16))
  (defparam w1 (normal [d hidden] :std 0.5))
  (defparam w2 (normal [hidden 1] :std 0.1))
  (defun hidden-layer (pos) (tanh (matmul pos w1)))
  (defun forward (pos) (sum (matmul (hidden-layer pos) w2))))
(defconst hidden 16)
(defparam potential (mlp :d 3 :hidden hidden))
(defparam scale (ones [1]))
(defun forward (pos) (neg (gradient (sum (* (potential pos) scale)) pos)))
(defun loss (pos target) (mean (square (- (forward pos) target))))
(defrun train :precision :f32)
"""


def reference_forces(pos, w1, w2, scale, create_graph=False):
    pos = pos.detach().requires_grad_()
    energy = (torch.tanh(pos @ w1) @ w2).sum() * scale
    (grad,) = torch.autograd.grad(energy.sum(), pos, create_graph=create_graph)
    return -grad


@pytest.fixture
def model(build):
    module, code = build(SOURCE, "sub.lisp")
    torch.manual_seed(0)
    return module.Sub(hidden=8), code


def test_forces_through_a_sub_model_equal_autograd(model):
    net, code = model
    assert "self.potential.w1" in code and "self.potential.w2" in code
    pos = torch.randn(5, 3)
    p = net.potential
    expected = reference_forces(pos, p.w1.detach(), p.w2.detach(), net.scale.detach())
    torch.testing.assert_close(net(pos), expected, rtol=1e-6, atol=1e-6)


def test_sub_model_parameters_train_through_the_emitted_backward(model):
    net, _ = model
    pos, target = torch.randn(5, 3), torch.randn(5, 3)
    got = torch.autograd.grad(
        net.loss(pos, target), [net.potential.w1, net.potential.w2, net.scale]
    )
    leaves = [
        t.detach().clone().requires_grad_()
        for t in (net.potential.w1, net.potential.w2, net.scale)
    ]
    ref = ((reference_forces(pos, *leaves, create_graph=True) - target) ** 2).mean()
    for g, e in zip(got, torch.autograd.grad(ref, leaves)):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6)


def test_the_sub_model_keeps_its_forward(model):
    net, _ = model
    pos = torch.randn(5, 3)
    expected = (torch.tanh(pos @ net.potential.w1) @ net.potential.w2).sum()
    torch.testing.assert_close(net.potential(pos), expected)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            "(let ((e (* (potential pos) scale))) (gradient (sum e) pos))",
            "traced outside the gradient form",
        ),
    ],
)
def test_a_call_traced_outside_the_gradient_form_is_a_diagnostic(body, message):
    source = SOURCE.replace(
        "(neg (gradient (sum (* (potential pos) scale)) pos))", body
    )
    with pytest.raises(SourceError, match=message):
        compile_source(source, "sub.lisp")
