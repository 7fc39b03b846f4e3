"""Gradients through loops whose layers branch, and through values a loop reads from around
it, against torch.autograd.grad of the same computation written in plain PyTorch."""

from __future__ import annotations

import pytest
import torch

from sx2torch.compiler import compile_source
from sx2torch.errors import SourceError

BLOCK = """
(defmodel blk (&key (d 4))
  (defparam w (normal [d d]))
  (defun forward (x) (if (= d 4) x {other})))
(defparam blocks (stack 2 (blk :d 4)))
(defun forward (x) (gradient (sum (chain blocks x)) x))
"""
TRANSPOSED = "(matmul x (transpose w [1 0]))"
HALVES = "(concat [(slice x :axis 1 :end 2) (slice x :axis 1 :start 2)] :axis 1)"


def autograd(f, x):
    x = x.detach().requires_grad_()
    (grad,) = torch.autograd.grad(f(x), x)
    return grad


@pytest.mark.parametrize("d", [4, 5])
def test_gradient_through_a_branching_layers_matmul(build, d):
    """The backward `if` reads the transpose its forward branch made; in the adjoint loop
    that branch's value is dead, and the transpose was dropped with it (a KeyError)."""
    module, _ = build(BLOCK.format(other=TRANSPOSED))
    model = module.Model()
    for block in model.blocks:
        block.d = d  # the else branch, on the 4x4 weights made with d = 4
    x = torch.randn(3, 4)

    def reference(x):
        for block in model.blocks:
            x = x if d == 4 else x @ block.w.detach().T
        return x.sum()

    assert torch.allclose(model(x), autograd(reference, x), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("d", [4, 5])
def test_gradient_through_a_branching_layers_concat_of_slices(build, d):
    module, _ = build(BLOCK.format(other=HALVES))
    model = module.Model()
    for block in model.blocks:
        block.d = d
    x = torch.randn(3, 4)
    assert torch.equal(model(x), torch.ones(3, 4))


def test_gradient_through_a_branch_on_a_const_in_a_for(build):
    source = """
(defconst flag true)
(defparam w (normal [4 4]))
(defmodel blk (&key (d 4)) (defparam w (normal [d d])) (defun forward (x) x))
(defparam blocks (stack 2 (blk :d 4)))
(defun forward (x y)
  (gradient (sum (for (layer blocks) ((h y)) (if flag h (matmul h (transpose w [1 0]))))) y))
"""
    module, _ = build(source)
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    model = module.Model(flag=False)
    w = model.w.detach()
    expected = autograd(lambda y: (y @ w.T @ w.T).sum(), y)
    assert torch.allclose(model(x, y), expected, rtol=1e-6, atol=1e-6)
    assert torch.equal(module.Model()(x, y), torch.ones(3, 4))


LOOP = """
(defmodel blk (&key (d 4)) (defparam w (normal [d d])) (defun forward (x) x))
(defparam blocks (stack 2 (blk :d 4)))
(defun forward (x) (gradient (sum (for (layer blocks) ((h x)) (* h x))) x))
(defun given (x) (gradient (mean (for (layer blocks) ((h x)) x)) x))
"""


def test_a_value_read_around_a_loop_and_carried_from_it_gives_both_contributions(
    build,
):
    """x * x * x: the gradient is 3x^2; the read of x around the loop was lost when the
    carried h started as that same x, which left x^2."""
    module, _ = build(LOOP)
    model = module.Model()
    x = torch.full((2, 4), 1 + 2**-8)
    assert torch.equal(model(x), 3 * x * x)
    x = torch.randn(2, 4)
    assert torch.allclose(model(x), autograd(lambda x: (x * x * x).sum(), x))


def test_a_loop_that_gives_a_value_read_around_it(build):
    """The body gives x itself: the mean's gradient 1/8 reaches x through the loop, not 0."""
    module, _ = build(LOOP)
    assert torch.equal(
        module.Model().given(torch.randn(2, 4)), torch.full((2, 4), 1 / 8)
    )


INSIDE = """
(defmodel blk (&key (d 4)) (defparam w (normal [d d])) (defun forward (x) x))
(defparam blocks (stack 2 (blk :d 4)))
(defun fixed (x y) (for (layer blocks) ((c y)) (layer (* c (gradient (sum (* c x)) x)))))
(defun forward (x) (for (layer blocks) ((c x)) (layer (- c (gradient (sum (* c c c)) c)))))
"""


def _inside_reference(step, c, n=2):
    """`step(c)` per layer, each gradient taken by autograd through all that came before."""
    for _ in range(n):
        c = step(c)
    return c


def test_a_gradient_in_a_loop_reaching_a_carried_value_that_needs_no_x(build):
    """c starts as y and each iteration multiplies it by d(sum c*x)/dx = c, which does not
    depend on x: the carried value depends on x only as the gradient node reads it, so the
    backward holds it fixed rightly, as autograd does."""
    module, _ = build(INSIDE)
    x = torch.randn(2, 4).requires_grad_()
    y = torch.randn(2, 4)

    def step(c):
        (g,) = torch.autograd.grad((c * x).sum(), x, create_graph=True)
        return c * g

    want = _inside_reference(step, y)
    assert torch.allclose(module.Model().fixed(x.detach(), y), want, rtol=1e-6)


def test_a_gradient_in_a_loop_of_a_carried_value_that_never_depends_on_x(build):
    """c starts as y and becomes d(mean c)/dx, zeros: it never depends on x, so the zeros
    are the gradient of every iteration and no diagnostic is due."""
    line = "(defun forward (x y) (for (layer blocks) ((c y)) (gradient (mean c) x)))"
    module, _ = build(INSIDE.split("(defun fixed")[0] + line)
    x, y = torch.randn(2, 4), torch.randn(2, 4)
    assert torch.equal(module.Model()(x, y), torch.zeros(2, 4))


def test_a_gradient_in_a_loop_with_respect_to_the_carried_value(build):
    module, _ = build(INSIDE)
    x = torch.randn(2, 4)

    def step(c):
        c = c.detach().requires_grad_()
        (g,) = torch.autograd.grad((c * c * c).sum(), c)
        return c.detach() - g

    want = _inside_reference(step, x)
    assert torch.allclose(module.Model()(x), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "start, body",
    [
        ("x", "(layer (* c (gradient (sum (* c x)) x)))"),  # c is x at first
        ("y", "(layer (+ x (* c (gradient (sum (* c x)) x))))"),  # x + ... after one
        # Y reads x only through c, which starts as x or x^2: no backward node reached c,
        # and the gradient compiled to zeros where the first iteration's is 2x/8 or 1/8
        ("(square x)", "(gradient (mean c) x)"),
        ("x", "(gradient (mean c) x)"),
        # a start computed from x before the loop depends on x as x itself does
        ("(square x)", "(layer (+ c (gradient (sum (* c x)) x)))"),
    ],
)
def test_a_gradient_in_a_loop_through_a_carried_value_that_depends_on_x(start, body):
    """known-6: where c is x, d(sum c*x)/dx is c + x, not c; after an iteration c depends
    on x through the layers before (and this gradient's value): the backward would have to
    go back through them, a diagnostic at the gradient form. So also where c starts as a
    value computed from x, and where Y reads x only through c."""
    line = f"(defun forward (x y) (for (layer blocks) ((c {start})) {body}))"
    source = INSIDE.split("(defun fixed")[0] + line
    with pytest.raises(SourceError) as error:
        compile_source(source, "model.lisp")
    assert (error.value.line, error.value.column) == (4, line.index("(gradient") + 1)
    assert error.value.message.startswith(
        "this gradient reaches 'c', which the loop around it carries and which depends "
        "on 'x' through the iterations before"
    )


def test_an_adjoint_loop_keeps_a_branchs_value_its_backward_reads(build):
    """The adjoint loop computes the layer's `if` again, a value nothing reads: its name was
    taken as free and given to the (* x 3) inside the else branch, which the branch's end
    then overwrote with the cos before the backward's sin read it (difftest seed 1058707).
    """
    source = """
(defmodel blk (&key (idx 0)) (defun forward (x) (if (= idx 1) (* x 3) (cos (* x 3)))))
(defparam blocks (stack (i 2) (blk :idx i)))
(defun forward (x) (gradient (mean (for (layer blocks) ((c x)) (layer c))) x))
"""
    module, _ = build(source)
    model = module.Model()
    x = torch.randn(2, 4)

    def reference(x):
        return (torch.cos(x * 3) * 3).mean()

    torch.testing.assert_close(model(x), autograd(reference, x))


ALIASED = """
(defmodel blk () (defun forward (x) x))
(defparam blocks (stack 2 (blk)))
(defun forward (x) (for (layer blocks) ((c {start})) (* c (gradient (sum (* x c)) c))))
"""


def test_a_gradient_to_a_carried_value_whose_start_y_reads_is_a_diagnostic():
    """In the first iteration c is x, so d/dc sum(x c) is 2x; in the second c is x², and
    it is x: no one backward of the body is right (difftest seed 1051441, at b3f533d: the
    module gave x³ where the rules give 2x³)."""
    source = ALIASED.format(start="x")
    with pytest.raises(SourceError) as error:
        compile_source(source, "m.lisp")
    assert "starting as 'x', and Y reads that start too" in error.value.message
    line = source.splitlines()[error.value.span.line - 1]
    assert line[error.value.span.col - 1 :].startswith("(gradient (sum (* x c)) c)")


def test_a_gradient_to_a_carried_value_started_from_a_copy_holds_x_fixed(build):
    module, _ = build(ALIASED.format(start="(* x 1.0)"))
    x = torch.randn(2, 4)
    torch.testing.assert_close(module.Model()(x), x**3)


def test_a_gradient_through_a_for_inside_a_for(build):
    """The outer adjoint loop computes the inner loop again for the lists it records; its
    value is dead there, and prune dropped it (difftest seed 1072468: a KeyError)."""
    source = """
(defmodel blk () (defun forward (x) x))
(defparam blocks (stack 2 (blk)))
(defun forward (x)
  (gradient (mean (for (layer blocks) ((c x)) (for (inner blocks) ((h c)) (* h c)))) x))
"""
    module, _ = build(source)
    x = torch.rand(2, 4) + 0.5
    torch.testing.assert_close(module.Model()(x), autograd(lambda x: (x**9).mean(), x))


def test_a_start_no_iteration_reads_gets_no_contribution(build):
    """corpus found-adjoint-unread-start: c starts as x w2 (a frozen, bf16-stored w2 under
    :bf16) and no iteration reads it: the start's backward does not run on zeros, which
    made x's gradient bf16; x's gradient is the iterations' own, f32: 1/8 from the last."""
    module, code = build(
        "(defmodel blk () (defun forward (x) x))\n"
        "(defparam blocks (stack 2 (blk)))\n"
        "(defparam w2 (normal [4 4]) :trainable false)\n"
        "(defun forward (x) (gradient (mean (for (layer blocks) ((c (matmul x w2))) x)) x))\n"
        "(defrun train :precision :bf16)\n"
    )
    assert "transpose" not in code
    got = module.Model()(torch.randn(2, 4))
    assert got.dtype == torch.float32 and torch.equal(got, torch.full((2, 4), 1 / 8))
