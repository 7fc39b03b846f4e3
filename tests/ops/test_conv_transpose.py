"""conv-transpose1d and conv-transpose2d: torch's F.conv_transpose1d/2d with torch's weight
layout ([C_in, C_out/groups, K...]), the same call in f32 and bf16 (the interpreter
agreeing), its derivative the adjoint convolution (against torch.autograd)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sx2torch import interpret

SOURCE = """
(defparam w (normal [4 3 3]))
(defparam b (normal [6]))
(defparam w2 (normal [2 3 3 2]))
(defun forward (x img)
  [(conv-transpose1d x w b :stride 2 :padding 1 :output-padding 1 :groups 2)
   (conv-transpose2d img w2 :stride [2 1] :dilation 2)])
(defun loss (x img)
  (let (([a c] (forward x img))) (+ (sum (* a a)) (sum (* c c)))))
(defun grads (x img)
  [(gradient (loss x img) w) (gradient (loss x img) b) (gradient (loss x img) w2)
   (gradient (loss x img) x) (gradient (loss x img) img)])
(defrun train :precision :%s)
"""


def _inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(2, 4, 5, generator=g), torch.randn(2, 2, 4, 3, generator=g)


def _reference(x, img, w, b, w2):
    return [
        F.conv_transpose1d(x, w, b, stride=2, padding=1, output_padding=1, groups=2),
        F.conv_transpose2d(img, w2, stride=(2, 1), dilation=2),
    ]


@pytest.mark.parametrize("precision", ["f32", "bf16"])
def test_it_is_torchs_transposed_convolution(build, precision):
    module, code = build(SOURCE % precision)
    model = module.Model()
    state = {k: v.detach() for k, v in model.state_dict().items()}
    x, img = _inputs()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    params = [state[k].to(dtype) for k in ("w", "b", "w2")]
    want = _reference(x.to(dtype), img.to(dtype), *params)
    got = model(x, img)
    theirs = interpret.load(SOURCE % precision, state=state).evaluate(
        "forward", [x, img]
    )
    for value, interpreted, expected in zip(got, theirs, want):
        assert value.shape == expected.shape and value.dtype == expected.dtype
        assert torch.equal(value, expected) and torch.equal(interpreted, expected)


def test_its_derivative_is_torch_autograds_in_f32(build):
    module, code = build(SOURCE % "f32")
    assert "torch.nn.grad.conv1d_weight(" in code
    model = module.Model()
    x, img = _inputs()
    leaves = [p.detach().clone().requires_grad_() for p in (model.w, model.b, model.w2)]
    xs, imgs = x.clone().requires_grad_(), img.clone().requires_grad_()
    a, c = _reference(xs, imgs, *leaves)
    want = torch.autograd.grad((a * a).sum() + (c * c).sum(), [*leaves, xs, imgs])
    got = model.grads(x, img)
    for value, expected in zip(got, want):
        torch.testing.assert_close(value, expected, rtol=1e-5, atol=1e-5)
    state = {k: v.detach() for k, v in model.state_dict().items()}
    theirs = interpret.load(SOURCE % "f32", state=state).evaluate("grads", [x, img])
    for value, interpreted in zip(got, theirs):
        torch.testing.assert_close(value, interpreted, rtol=1e-5, atol=1e-5)
