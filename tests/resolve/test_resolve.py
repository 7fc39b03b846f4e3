"""resolve: top-level data -> a Program; the checks made before any body is traced."""

from __future__ import annotations

import pytest

from sx2torch import resolve
from sx2torch.syntax import read
from sx2torch.errors import SourceError
from sx2torch.syntax.program import Program


def program(text: str, top: str = "net") -> Program:
    return resolve.run(read.run(text), top)


def error(text: str) -> tuple:
    with pytest.raises(SourceError) as caught:
        program(text)
    return caught.value.span.line, caught.value.span.col, caught.value.message


BLOCK = """\
(defmodel block (&key (d 8))
  "A block."
  (defparam w (normal [d (* 4 d)] :std 0.02) :numerics :high)
  (defun forward (x) (matmul x w)))
"""


def test_structure():
    p = program(
        BLOCK
        + '(require sexpgpu/nn)\n(defconst d 4 "width")\n(defparam frozen (zeros [d]) :trainable false)\n'
        '(defparam blocks (stack 2 (block :d d)))\n(defun forward (x &key (eps 1e-6)) "doc" (chain blocks x))\n'
        "(defrun train :precision :bf16)\n(defrun eval)\n"
    )
    assert list(p.models) == ["block"] and p.top.name == "net" and p.top.is_top
    assert [(r.name, r.precision) for r in p.runs] == [
        ("train", "bf16"),
        ("eval", "f32"),
    ]
    assert p.top.consts["d"].value.value == 4
    assert p.top.params["frozen"].trainable is False
    blocks = p.top.params["blocks"]
    assert (
        blocks.init.kind,
        blocks.init.model,
        blocks.init.count.value,
        blocks.is_module,
    ) == ("stack", "block", 2, True)
    forward = p.top.defuns["forward"]
    assert (
        [a.name for a in forward.args],
        [k.name for k, _ in forward.keys],
        forward.doc,
    ) == (["x"], ["eps"], "doc")
    block = p.models["block"]
    assert block.doc == "A block." and block.params["w"].numerics_high
    assert [s.value for s in block.params["w"].init.args["shape"]] == [8, 32]


# A sub-model whose sizes its arguments decide, where its defaults make a legal one.
BUILT = """
(defmodel blk (&key (n 4))
  (defconst h (// 8 n))
  (defparam g (ones [n (* h h)]))
  (defun forward (x) (* x g)))
(defmodel wide (&key (n 4))
  (defparam g (ones [n n]))
  (defun forward (x) x))
(defmodel outer (&key (k 2))
  (defparam layers (stack k (blk)))
  (defun forward (x) x))
"""


@pytest.mark.parametrize(
    "text, line, col, message",
    [
        ("(defun forward (x) x)\n(defrun r :loss x)", 2, 17, "unknown defun 'x' for :loss (known: forward)"),
        ("(defun forward (x) x)\n(require numpy)", 2, 10, "unknown library 'numpy' (known: sexpgpu/nn, sexpgpu/optim)"),
        ("(defun forward (x) x)\n(defrun r :precision)", 2, 11, "keyword :precision without a value in defrun"),
        ("(defun forward (x) x)\n(defrun r)\n(defrun r)", 3, 9, "run 'r' is already defined"),
        ("(defun forward (x) x)\n(defparam b (block :e 1))\n" + BLOCK, 2, 20, "model 'block' has no key :e (known: :d)"),
        ("(defun forward (x) x)\n(defparam b (blok))", 2, 13, "unknown initializer or model 'blok'"),
        ("(defun forward (x) x)\n(defparam b (stack 2 (zeros [1])))", 2, 22,
         "stack takes a sub-model instance, such as (block :d d)"),
        ("(defun forward (x) x)\n(defparam w (zeros [-1]))", 2, 21, "a size must not be negative, got -1"),
        ("(defun forward (x) x)\n(defparam w (normal [2] :sd 1))", 2, 25,
         "unknown keyword :sd in normal (known: :mean, :std, :padding-idx)"),
        ("(defun forward (x) x)\n(defparam w (ones [2]) :trainable 0)", 2, 35, ":trainable must be true or false, got 0"),
        ("(defun forward (x) x)\n(defparam w (ones [2]) :numerics :low)", 2, 34, ":numerics must be :high, got :low"),
        ("(defun forward (x &key eps) x)", 1, 24, "a &key argument needs a default: (eps DEFAULT)"),
        ("(defun forward (x x) x)", 1, 19, "argument 'x' given twice"),
        ("(defun forward (x))", 1, 1, "defun 'forward' has no body"),
        ("(defun let (x) x)", 1, 8, "a defun cannot be named 'let': that is a special form"),
        ("(defun 3 (x) x)", 1, 8, "expected a function name, got 3"),
        ("x", 1, 1, "expected a top-level form such as (defun ...), got 'x'"),
        ("(defvar x 1)", 1, 2, "unknown definition form 'defvar'"),
        ("(defmodel m () (defrun r))\n(defun forward (x) x)", 1, 16, "'defrun' belongs at the top level of the file"),
        ("(defmodel m ())\n(defun forward (x) x)", 1, 11, "model 'm' defines no 'forward' defun"),
        ("(defconst d (/ 1 0))", 1, 13, "division by zero (with the consts at their defaults)"),
        ("(defconst d (+ 1 :a))", 1, 13, "arithmetic needs numbers, got :a"),
        ("(defconst c (** -8 0.5))", 1, 13, "-8 ** 0.5 is not a real number (with the consts at their defaults)"),
        ("(defun forward (x) x)\n(defparam w (linspace -3))", 2, 23, "linspace's size must not be negative, got -3"),
        ("(defun forward (x) x)\n(defparam p (blk :n 5e-324))\n" + BUILT, 2, 13,
         "building 'blk' with these arguments: parameter 'g' has a size 5e-324, not a non-negative integer"),
        ("(defun forward (x) x)\n(defparam p (wide :n (** 2 20)))\n" + BUILT, 2, 13,
         "building 'wide' with these arguments: parameter 'g' has 1,099,511,627,776 elements, past the limit of 68,719,476,736"),
        ("(defun forward (x) x)\n(defparam p (blk :n 0))\n" + BUILT, 2, 13,
         "building 'blk' with these arguments: (8 // n) cannot be computed (integer division or modulo by zero)"),
        ("(defun forward (x) x)\n(defparam p (stack (i 3) (blk :n (+ 2 (* -2 i)))))\n" + BUILT, 2, 26,
         "building 'blk' with these arguments: parameter 'g' has a size -2, not a non-negative integer"),
        ("(defun forward (x) x)\n(defparam p (outer :k 70000))\n" + BUILT, 2, 13,
         "building 'outer' with these arguments: stack 'layers' has 70000 layers, not an integer from 0 to 65,536"),
    ],
)  # fmt: skip
def test_errors(text, line, col, message):
    assert error(text) == (line, col, message)


def test_a_defmodel_cannot_take_the_top_models_name():
    assert error("(defmodel net () (defun forward (x) x))") == (
        1,
        11,
        "a defmodel cannot be named 'net': the file's top model has that name",
    )


def test_a_model_cannot_hold_itself():
    text = (
        "(defmodel a () (defparam me (a)) (defun forward (x) x))\n(defun forward (x) x)"
    )
    assert error(text) == (1, 29, "unknown initializer or model 'a'")
    text = (
        "(defmodel a () (defparam q (b)) (defun forward (x) x))\n"
        "(defmodel b () (defparam p (c)) (defun forward (x) x))\n"
        "(defmodel c () (defparam r (a)) (defun forward (x) x))\n(defun forward (x) x)"
    )
    assert error(text) == (3, 26, "model 'a' contains itself (a -> b -> c -> a)")


def test_no_forward_is_reported_at_the_start():
    assert error("") == (
        1,
        1,
        "the file defines no 'forward' defun: expected (defun forward (x ...) ...)",
    )
