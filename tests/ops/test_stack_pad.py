"""stack (torch.stack) and pad (F.pad, constant mode): moves of data, rounding nowhere,
against torch on the cuda and cpu targets and the interpreter, with torch's derivatives.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sx2torch import interpret

SOURCE = """
(defparam w (normal [4 4]))
(defun forward (x)
  (let ((h (matmul x w)))
    (* (stack [h x h] :axis -1) (sum (pad h [1 2 0 1] :value 0.5)))))
(defun grad (x) (gradient (sum (square (forward x))) w))
(defrun train :precision :PRECISION)
"""
X = torch.tensor(
    [[0.5, -1.25, 2.0, 3.0], [1.5, 0.25, -0.75, 1.0], [0.1, 0.2, 0.3, 0.4]]
)


def _reference(x, w):
    h = x @ w
    return torch.stack([h, x, h], dim=-1) * F.pad(h, (1, 2, 0, 1), value=0.5).sum()


@pytest.mark.parametrize("target", ["cuda", "cpu"])
def test_stack_and_pad_are_torchs_calls_with_torchs_derivatives_in_f32(build, target):
    source = SOURCE.replace("PRECISION", "f32")
    module, code = build(source, target=target)
    assert "torch.stack([h, x, h], dim=-1)" in code
    assert "F.pad(h, (1, 2, 0, 1), value=0.5)" in code
    torch.manual_seed(0)
    model = module.Model()
    w = model.w.detach().clone().requires_grad_()
    want = _reference(X, w)
    assert torch.equal(model(X), want)
    (grad,) = torch.autograd.grad(want.square().sum(), w)
    torch.testing.assert_close(model.grad(X), grad, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("target", ["cuda", "cpu"])
def test_under_bf16_they_round_nowhere_and_the_interpreter_agrees(build, target):
    """The pad value 0.5 is a bf16 number; the stacked values are the bf16 products."""
    source = SOURCE.replace("PRECISION", "bf16")
    module, _ = build(source, target=target)
    torch.manual_seed(0)
    model = module.Model()
    want = _reference(X.bfloat16(), model.w.detach().bfloat16())
    assert torch.equal(model(X).float(), want.float())
    torch.manual_seed(0)
    interpreted = interpret.load(source)
    assert torch.equal(interpreted.evaluate("forward", [X]).float(), want.float())
    torch.manual_seed(0)
    assert torch.equal(interpreted.evaluate("grad", [X]).float(), model.grad(X).float())
