"""`(gradient Y X)` needs a 0-d Y: decided by rank where the compiler knows it, checked when
the module runs where Y's rank depends on an argument."""

from __future__ import annotations

import pytest
import torch

from sx2torch.compiler import compile_source
from sx2torch.errors import SourceError


def test_a_matrix_reduced_over_both_axes_is_a_scalar(build):
    module, code = build("""
(defparam w (normal [3 4]))
(defparam v (normal [4 4]))
(defun forward (x)
  (* x (gradient (sum (* (tanh (matmul w v)) w) :axes [0 1]) w)))
""")
    assert "expect_scalar" not in code  # known to be 0-d: no check when it runs
    torch.manual_seed(0)
    model = module.__dict__[module.__all__[0]]()
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    w = model.w.detach().double().requires_grad_()
    v = model.v.detach().double()
    (expected,) = torch.autograd.grad((torch.tanh(w @ v) * w).sum(dim=(0, 1)), w)
    torch.testing.assert_close(
        model.forward(x).double(), x.double() * expected, rtol=1e-5, atol=1e-5
    )


def test_a_full_sum_in_a_branch_is_a_scalar_as_at_the_top(build):
    """A node inside a conditional has its shape as it is made, as one at the method's top
    (the ranks of a branch's nodes were unknown: a run-time check and a longer backward).
    """
    module, code = build("""
(defun forward (x &key (flag true))
  (if flag (gradient (sum (* x x)) x) x))
""")
    assert "expect_scalar" not in code and "grad_x_2 = grad_mul_x * x" in code
    model = module.__dict__[module.__all__[0]]()
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    leaf = x.double().requires_grad_()
    (expected,) = torch.autograd.grad((leaf * leaf).sum(), leaf)
    torch.testing.assert_close(model.forward(x).double(), expected)
    assert torch.equal(model.forward(x, flag=False), x)


def test_the_gradient_of_an_argument_by_itself_checks_it_when_the_module_runs(build):
    """Y an argument: its shape, as it is made, is unknown (the fuzzer's `(gradient x x)`)."""
    module, code = build("(defun forward (x) (gradient x x))")
    assert code.count('sx.expect_scalar(x, "x")') == 1
    model = module.__dict__[module.__all__[0]]()
    assert torch.equal(model.forward(torch.tensor(3.0)), torch.tensor(1.0))
    with pytest.raises(ValueError, match="gradient needs a scalar Y"):
        model.forward(torch.ones(2))


SOURCE_OF_UNKNOWN_RANK = """
(defun forward (x)
  (gradient (sum (* x x) :axes [0]) x))
"""


def test_a_y_of_unknown_rank_is_checked_when_the_module_runs(build):
    module, code = build(SOURCE_OF_UNKNOWN_RANK)
    assert code.count("sx.expect_scalar(") == 1
    model = module.__dict__[module.__all__[0]]()
    with pytest.raises(ValueError) as raised:
        model.forward(torch.randn(3, 4))
    assert str(raised.value).startswith(
        "(sum (* x x) :axes [0]): gradient needs a scalar Y, got a tensor of shape [4]"
    )


def test_a_y_of_unknown_rank_that_is_a_scalar_gets_its_gradient(build):
    module, _ = build(SOURCE_OF_UNKNOWN_RANK)
    x = torch.randn(5, generator=torch.Generator().manual_seed(1))
    got = module.__dict__[module.__all__[0]]().forward(x)
    torch.testing.assert_close(got, 2 * x)


def test_a_y_of_known_rank_above_zero_is_a_compile_time_error():
    with pytest.raises(SourceError) as raised:
        compile_source(
            "(defparam w (normal [3 4]))\n(defun forward (x) (gradient (relu w) w))\n",
            "model.lisp",
        )
    assert (raised.value.span.line, raised.value.span.col) == (2, 30)
