"""einsum: torch.einsum of the equation, in f32 and bf16 the same call on the same operands
(the interpreter agreeing), its derivative an einsum of the gradient and the other operands
(against torch.autograd); a bad equation is a diagnostic at the form (tests/ops/
test_op_diagnostics.py)."""

from __future__ import annotations

import pytest
import torch

from sx2torch import interpret

SOURCE = """
(defparam w (normal [4 3]))
(defparam v (normal [3]))
(defun forward (x q)
  (let ((h (einsum "bi,ij->bj" x w)))
    [(einsum "bj,j->b" h v) (einsum "...j,j->...j" h v)
     (einsum "bhqd,bhkd->bhqk" q q) (einsum "ij->ji" w)]))
(defun loss (x)
  (sum (* (einsum "bi,ij,j->b" x w v) (einsum "bi->b" (* x x)))))
(defun grads (x)
  [(gradient (loss x) w) (gradient (loss x) v) (gradient (loss x) x)])
(defrun train :precision :%s)
"""


def _inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(5, 4, generator=g), torch.randn(2, 3, 5, 4, generator=g)


def _reference(x, q, w, v):
    h = torch.einsum("bi,ij->bj", x, w)
    return [
        torch.einsum("bj,j->b", h, v),
        torch.einsum("...j,j->...j", h, v),
        torch.einsum("bhqd,bhkd->bhqk", q, q),
        w.T,
    ]


@pytest.mark.parametrize("precision", ["f32", "bf16"])
def test_it_is_torchs_einsum_on_the_operands_the_policy_gives(build, precision):
    module, code = build(SOURCE % precision)
    assert 'torch.einsum("bhqd,bhkd->bhqk", ' in code
    model = module.Model()
    state = {k: v.detach() for k, v in model.state_dict().items()}
    x, q = _inputs()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    # q meets no parameter: it stays f32 under :bf16 (contagion)
    want = _reference(*(t.to(dtype) for t in (x, q, state["w"], state["v"])))
    want[2] = torch.einsum("bhqd,bhkd->bhqk", q, q)
    got = model(x, q)
    theirs = interpret.load(SOURCE % precision, state=state).evaluate("forward", [x, q])
    for value, interpreted, expected in zip(got, theirs, want):
        assert value.dtype == interpreted.dtype == expected.dtype
        assert torch.equal(value, expected) and torch.equal(interpreted, expected)


def test_its_derivative_is_torch_autograds_in_f32(build):
    module, code = build(SOURCE % "f32")
    assert 'torch.einsum("b,bi,ij->j", ' in code  # by v: the gradient and the others
    # its parameters drawn from a seeded generator: from whatever state the tests before
    # it in the process left, one of 20 gradients missed the bound by 3e-6 relative
    torch.manual_seed(0)
    model = module.Model()
    x, _ = _inputs()
    w, v = (p.detach().clone().requires_grad_() for p in (model.w, model.v))
    xs = x.clone().requires_grad_()
    loss = (torch.einsum("bi,ij,j->b", xs, w, v) * (xs * xs).sum(1)).sum()
    want = torch.autograd.grad(loss, [w, v, xs])
    for got, expected in zip(model.grads(x), want):
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
    state = {k: p.detach() for k, p in model.state_dict().items()}
    theirs = interpret.load(SOURCE % "f32", state=state).evaluate("grads", [x])
    for got, interpreted in zip(model.grads(x), theirs):
        torch.testing.assert_close(got, interpreted, rtol=1e-6, atol=1e-6)
