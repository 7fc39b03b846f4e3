"""`gradient` through an `if` (a backward `if` on the same condition), and inside a loop's body."""

from __future__ import annotations

import pytest
import torch

IF_SOURCE = """
(defconst gated true)
(defparam w (normal [4 4]))
(defparam gate (normal [4]))
(defun forward (x)
  (gradient (sum (let ((h (matmul x w)))
                   (if gated (* (relu h) gate) (exp (* h 0.5)))))
            x))
"""


@pytest.mark.parametrize("gated", [True, False])
def test_gradient_through_if_follows_the_branch_the_module_takes(build, gated):
    module, code = build(IF_SOURCE)
    assert code.count("if self.gated:") == 2  # the forward's and the backward's
    model = module.Model(gated=gated)
    x = torch.randn(3, 4)
    reference = x.clone().requires_grad_()
    w, gate = model.w.detach(), model.gate.detach()
    h = reference @ w
    y = torch.relu(h) * gate if gated else torch.exp(h * 0.5)
    y.sum().backward()
    torch.testing.assert_close(model(x), reference.grad)


def test_a_branch_that_does_not_read_a_value_gives_it_zeros(build):
    source = """
(defun forward (a &key (pick-a true))
  (let ((b (* a 3.0)))
    (gradient (sum (if pick-a (* a a) (exp b))) a)))
"""
    module, _ = build(source)
    model = module.Model()
    a = torch.randn(5)
    torch.testing.assert_close(model(a), 2 * a)
    torch.testing.assert_close(model(a, pick_a=False), 3 * torch.exp(3 * a))


def test_gradient_inside_a_loop_body_differentiates_the_carried_value(build):
    """It once gave zeros: the backward looked for Y among the method's own nodes only."""
    source = """
(defmodel block ()
  (defparam w (normal [4 4] :std 0.5))
  (defun forward (x) (matmul x w)))
(defparam blocks (stack 3 (block)))
(defun forward (x0)
  (for (i layer blocks) ((x x0))
    (layer (gradient (sum (* x (sin x))) x))))
"""
    module, _ = build(source)
    model = module.Model()
    x = torch.randn(2, 4)
    expected = x
    for block in model.blocks:
        expected = (torch.sin(expected) + expected * torch.cos(expected)) @ block.w
    torch.testing.assert_close(model(x), expected.detach())
