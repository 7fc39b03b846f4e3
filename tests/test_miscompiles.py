"""Silent miscompiles found by an adversarial corpus, each run against plain PyTorch."""

from __future__ import annotations

import pytest
import torch

from sx2torch.compiler import compile_source
from sx2torch.errors import SourceError
from sx2torch.ops import REGISTRY


def test_chain_extra_argument_keeps_the_callers_value(build):
    """`(chain ls layer layer)`: every block gets the carried value and the caller's `layer`."""
    source = """
(defmodel blk ()
  (defparam w (normal [4 4]))
  (defun forward (x y) (+ (matmul x w) y)))
(defparam ls (stack 3 (blk)))
(defun forward (layer) (chain ls layer layer))
"""
    module, _ = build(source)
    model = module.Model()
    layer = torch.randn(2, 4)
    expected = layer
    for block in model.ls:
        expected = expected @ block.w + layer
    assert torch.equal(model(layer), expected)


def test_a_specialization_never_takes_a_source_defuns_name(build):
    source = """
(defparam w (normal [4 4]))
(defun f (x) (matmul x w))
(defun f-bf16 (x) (* x 2.0))
(defun g (x) (f (cast x :bf16)))
(defun forward (x) (+ (f x) (f-bf16 x)))
(defrun train :precision :bf16)
"""
    module, code = build(source)
    model = module.Model()
    x = torch.randn(3, 4)
    assert torch.equal(model.f_bf16(x), x * 2.0)
    assert "def f_bf16(self, x):\n        return x * 2.0" in code


def test_a_const_named_like_a_class_does_not_shadow_it(build):
    source = """
(defconst Block 3)
(defmodel block ()
  (defparam w (normal [4 4]))
  (defun forward (x) (matmul x w)))
(defparam b (block))
(defun forward (x) (* (b x) Block))
"""
    module, _ = build(source)
    model = module.Model(Block_=5)
    x = torch.randn(2, 4)
    assert torch.equal(model(x), (x @ model.b.w) * 5)


def test_slice_with_key_bounds_uses_the_callers_values(build):
    """The default of `i` is 0; `pick :i 2` must take element 2, not elements 0..2."""
    source = """
(defparam v (normal [8]))
(defun pick (&key (i 0)) (slice v :start i :end (+ i 1)))
(defun forward (x) (* x (pick :i 2)))
"""
    module, _ = build(source)
    model = module.Model()
    assert torch.equal(model.pick(i=2), model.v[2:3])
    assert torch.equal(model.pick(i=0), model.v[0:1])
    x = torch.randn(3, 1)
    assert torch.equal(model(x), x * model.v[2:3])


def test_reshape_with_a_key_size_is_not_the_keep_marker(build):
    """`0` in a reshape keeps the input's size, but a key whose default is 0 is a size."""
    source = """
(defun f (x &key (n 0)) (reshape x [n -1]))
(defun forward (x) (f x :n 2))
"""
    module, _ = build(source)
    x = torch.arange(12.0).reshape(3, 4)
    assert module.Model()(x).shape == (2, 6)
    assert module.Model().f(x, n=4).shape == (4, 3)


def test_reshape_with_a_const_size_follows_the_constructor(build):
    source = """
(defconst n 0)
(defun forward (x) (reshape x [n -1]))
"""
    module, _ = build(source)
    x = torch.arange(12.0).reshape(3, 4)
    assert module.Model(n=6)(x).shape == (6, 2)


@pytest.mark.parametrize(
    "body, at",
    [
        ("(sum x :axes [0] :keepdims k)", "k)"),
        ("(sum x :axes [k])", "[k]"),
        ("(transpose x [k 0])", "[k 0]"),
        ("(slice x :axis k :end 1)", "k :end"),
        ("(logsumexp x :axes [0] :keepdims k)", "k)"),
    ],
)
def test_an_argument_that_decides_the_shape_must_be_a_literal(body, at):
    default = "false" if "keepdims" in body else "0"
    line = f"(defun f (x &key (k {default})) {body})"
    with pytest.raises(SourceError) as error:
        compile_source(line + "\n(defun forward (x) (f x))\n", "model.lisp")
    assert error.value.span.line == 1
    assert error.value.span.col == line.rindex(at) + 1
    assert "must be written as" in str(error.value)


def test_the_key_defaults_golden_case_runs_with_the_callers_values():
    from pathlib import Path

    from conftest import load_module

    source = Path(__file__).parent.parent / "golden" / "key-defaults.lisp"
    module = load_module(compile_source(source.read_text(), source.name))
    model = module.KeyDefaults()
    x = torch.randn(4, 3)
    expected = x.reshape(2, -1) * torch.sum(model.table[2:4])
    assert torch.equal(model(x), expected)


@pytest.mark.parametrize(
    "name", sorted(name for name, op in REGISTRY.items() if op.internal)
)
def test_an_internal_op_is_unknown_to_source(name):
    """`(newton-schulz-bf16 ...)` from source would skip the bf16 region its caller opens."""
    source = f"(defparam w (normal [4 4]))\n(defun forward (x) ({name} x w))\n"
    with pytest.raises(SourceError) as error:
        compile_source(source, "model.lisp")
    assert str(error.value).startswith(f"unknown op or function '{name}'")
    assert (error.value.span.line, error.value.span.col) == (2, 21)


def test_the_internal_ops_are_the_compilers_own():
    internal = {name for name, op in REGISTRY.items() if op.internal}
    assert {"newton-schulz-bf16", "sum-to", "cross-entropy-backward"} <= internal
    assert not {"newton-schulz", "matmul", "softmax", "outer"} & internal


def test_a_cast_written_in_one_branch_is_not_read_in_the_other(build):
    """The shared `y.to(bf16)` of the then-branch once served the else-branch too, where
    it was never assigned: a NameError whenever the module took the else-branch."""
    source = """
(defparam w (normal [4 4]))
(defun forward (x &key (c true))
  (let ((y (with-numerics (:sensitivity :high) (exp x))))
    (if c (let ((a (matmul y w))) (* a (matmul y w))) (let ((b (matmul y w))) b))))
(defrun train :precision :bf16)
"""
    module, _ = build(source, target="cpu")
    model = module.Model()
    x = torch.randn(3, 4)
    w = model.w.detach().bfloat16()
    y = torch.exp(x).bfloat16()
    assert torch.equal(model(x, c=False), (y @ w).float())
    assert torch.equal(model(x), ((y @ w) * (y @ w)).float())
