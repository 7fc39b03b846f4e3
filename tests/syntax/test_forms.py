"""Form shapes, declared once (sx2torch/syntax/forms.py): every form's wrong number of
arguments, part of the wrong kind and keyword of the wrong kind is reported by `match`, in one
wording, at the item it is about, whether resolve reads the form or trace does."""

from __future__ import annotations

import pytest

from sx2torch.compiler import compile_source
from sx2torch.errors import SourceError
from sx2torch.syntax.echo import echo
from sx2torch.syntax.forms import DEFINITIONS, SHAPES, SPECIAL, match
from sx2torch.syntax.read import run as read

FORWARD = "(defun forward (x) x)\n"
STACK = "(defmodel blk () (defun forward (x) x))\n(defparam layers (stack 2 (blk)))\n"


def error(text: str) -> tuple:
    with pytest.raises(SourceError) as caught:
        compile_source(text, "m.lisp")
    return caught.value.span.line, caught.value.span.col, caught.value.message


def body(expression: str) -> str:
    """`expression` as forward's body, on line 3 after STACK, at column 20."""
    return STACK + f"(defun forward (x) {expression})\n"


WRONG = "wrong number of arguments: expected"
CASES = [
    # the definitions, which resolve reads
    ("(defconst d)\n" + FORWARD, 1, 1, f"{WRONG} (defconst NAME VALUE [DOC]), got 1"),
    ("(defflag f true 1 2)\n" + FORWARD, 1, 1, f"{WRONG} (defflag NAME VALUE [DOC]), got 4"),
    ('(defconst "d" 1)\n' + FORWARD, 1, 11, "expected a constant name, got a string"),
    ("(defconst d 1 2)\n" + FORWARD, 1, 15, "expected a docstring, got 2"),
    ("(defparam w)\n" + FORWARD, 1, 1,
     f"{WRONG} (defparam NAME INIT [DOC] &key :numerics :trainable :dtype :when), got 1"),
    ("(defparam w (ones [2]) :dtype :f16)\n" + FORWARD, 1, 31, ":dtype must be :f32 or :bf16, got :f16"),
    ("(defparam w (ones [2]) :trainable 0)\n" + FORWARD, 1, 35, ":trainable must be true or false, got 0"),
    ("(defparam w (ones [2]) :numerics :low)\n" + FORWARD, 1, 34, ":numerics must be :high, got :low"),
    ("(defun f)\n" + FORWARD, 1, 1, f"{WRONG} (defun NAME (ARG ... &key (K DEFAULT) ...) [DOC] BODY ...), got 1"),
    ("(defun f x x)\n" + FORWARD, 1, 10, "expected an argument list such as (x &key (eps 1e-6)), got 'x'"),
    ("(defmodel m)\n" + FORWARD, 1, 1, f"{WRONG} (defmodel NAME (&key (K DEFAULT) ...) [DOC] FORM ...), got 1"),
    ("(defmodel m d)\n" + FORWARD, 1, 13, "expected a key list such as (&key (d 128)), got 'd'"),
    ("(defparam w (ones [2]))\n(tie w)\n" + FORWARD, 2, 1,
     f"{WRONG} (tie NAME TARGET), as (tie lm-head.weight wte.weight), got 1"),
    ("(defparam w (ones [2]))\n(tie w 2)\n" + FORWARD, 2, 8, "expected a parameter's name, got 2"),
    ("(require)\n" + FORWARD, 1, 1, f"{WRONG} (require LIBRARY), as (require sexpgpu/nn), got 0"),
    ("(require 1)\n" + FORWARD, 1, 10, "expected a library name, got 1"),
    ("(defrun)\n" + FORWARD, 1, 1, f"{WRONG} (defrun NAME &key :precision :loss :optimizer :steps "
     ":batch-size :seq-len :schedule :grad-clip :inputs :generate :tp-reduce), got 0"),
    ("(defrun 1)\n" + FORWARD, 1, 9, "expected a run name, got 1"),
    ("(defrun r :precision :f16)\n" + FORWARD, 1, 22, ":precision must be :f32 or :bf16, got :f16"),
    ("(defrun r :loss 1)\n" + FORWARD, 1, 17, ":loss must be the name of the loss defun, got 1"),
    ("(defparam w (stack 2))\n" + FORWARD, 1, 13, f"{WRONG} (stack N (MODEL :k v ...)), got 1"),
    ("(defparam w (sequential (zeros [2])))\n" + FORWARD, 1, 25, "sequential takes sub-model instances, such as (block :d d)"),
    ("(defparam w (module-list (zeros [2])))\n" + FORWARD, 1, 26, "module-list takes sub-model instances, such as (block :d d)"),
    ("(defparam w (concat))\n" + FORWARD, 1, 13, f"{WRONG} (concat [INIT ...] &key :axis), got 0"),
    ("(defparam w (repeat 2))\n" + FORWARD, 1, 13, f"{WRONG} (repeat N INIT), got 1"),
    ("(defparam w (pow 2 (ones [2]) 3))\n" + FORWARD, 1, 13, f"{WRONG} (pow BASE INIT), got 3"),
    ("(defparam w (tensor))\n" + FORWARD, 1, 13, f"{WRONG} (tensor [VALUE ...]), got 0"),
    ("(defparam w (weight-norm (Linear 2 2) :name 3))\n" + FORWARD, 1, 45, ":name must be a parameter's name, got 3"),
    # a tensor initializer's shape is made from its registry entry
    ("(defparam w (normal))\n" + FORWARD, 1, 13, f"{WRONG} (normal SHAPE &key :mean :std :padding-idx), got 0"),
    ("(defparam w (normal :std 1 [2]))\n" + FORWARD, 1, 13, f"{WRONG} (normal SHAPE &key :mean :std :padding-idx), got 0"),
    ("(defparam w (zeros [2] :std 1))\n" + FORWARD, 1, 24, "unknown keyword :std in zeros (known: none)"),
    # the special forms, which trace's handlers trace
    (body("(let ((y x)))"), 3, 20, f"{WRONG} (let ((NAME EXPR) ...) BODY ...), got 1"),
    (body("(let x x)"), 3, 25, "expected the bindings ((NAME EXPR) ...), got 'x'"),
    (body("(with-numerics (:precision :bf16))"), 3, 20,
     f"{WRONG} (with-numerics (OPTION VALUE) BODY ...), as (with-numerics (:precision :bf16) "
     "(matmul x w)), got 1"),
    (body("(with-numerics :high x)"), 3, 35,
     "expected one option, (:sensitivity :high) or (:precision :bf16), got :high"),
    (body("(cast x)"), 3, 20, f"{WRONG} (cast X DTYPE), as (cast x :bf16), got 1"),
    (body("(cast x f32)"), 3, 28, "expected :f32 or :bf16 or :i64 or :i32 or :bool, got 'f32'"),
    (body("(gradient (sum x))"), 3, 20, f"{WRONG} (gradient Y X), got 1"),
    (body("(gradient (sum x) 2)"), 3, 38,
     "expected a name (an argument, a let local or a parameter), got 2"),
    (body("(chain layers)"), 3, 20, f"{WRONG} (chain LAYERS X ARG ...), got 1"),
    (body("(chain (layers) x)"), 3, 27, "expected the name of a stack, got a list"),
    (body("(nth layers)"), 3, 20, f"{WRONG} (nth STACK I X ...), got 1"),
    (body("(for (l layers) ((h x)))"), 3, 20, f"{WRONG} (for (I LAYER STACK) ((NAME INIT) ...) BODY ...), got 2"),
    (body("(for l ((h x)) (l h))"), 3, 25, "expected (I LAYER STACK) or (LAYER STACK), got 'l'"),
    (body("(for (l layers) h (l h))"), 3, 36, "expected the carried values, ((NAME INIT) ...), got 'h'"),
    (body("(if true x)"), 3, 20, f"{WRONG} (if CONDITION THEN ELSE), got 2"),
    (body("(if (not) x x)"), 3, 24, f"{WRONG} (not CONDITION), got 0"),
    (body("(if (and true) x x)"), 3, 24, f"{WRONG} (and CONDITION CONDITION ...), got 1"),
    (body("(if (or true) x x)"), 3, 24, f"{WRONG} (or CONDITION CONDITION ...), got 1"),
    (body("(if (in 1) x x)"), 3, 24, f"{WRONG} (in X [A B ...]), got 1"),
    (body("(if (in 1 2) x x)"), 3, 30, "expected a vector of choices, [A B ...], or a list, got 2"),
]  # fmt: skip


@pytest.mark.parametrize("text, line, col, message", CASES, ids=range(len(CASES)))
def test_a_form_of_the_wrong_shape_is_reported_where_it_is_wrong(
    text, line, col, message
):
    assert error(text) == (line, col, message)


def test_every_form_is_covered_by_a_case():
    written = {
        datum.items[0].name
        for text, *_ in CASES
        for datum in _lists(read(text))
        if datum.items and getattr(datum.items[0], "name", None) in SHAPES
    }
    assert written == set(SHAPES)
    assert not set(DEFINITIONS) & set(SPECIAL)


def _lists(data):
    for datum in data:
        if hasattr(datum, "items"):
            yield datum
            yield from _lists(datum.items)


@pytest.mark.parametrize(
    "text, parts, rest, keys",
    [
        ("(defconst d 4)", ["d", "4", None], [], {}),
        ('(defconst d 4 "width")', ["d", "4", '"..."'], [], {}),  # echo elides strings
        ("(defparam w (ones [2]) :dtype :bf16)", ["w", "(ones [2])", None], [], {"dtype": ":bf16"}),
        ('(defparam w (ones [2]) "the scale" :dtype :bf16)', ["w", "(ones [2])", '"..."'], [], {"dtype": ":bf16"}),
        ("(let ((y x)) y (relu y))", ["((y x))"], ["y", "(relu y)"], {}),
    ],
)  # fmt: skip
def test_match_gives_the_parts_the_body_and_the_keywords(text, parts, rest, keys):
    """The parts in the shape's order, an optional one not given as None."""
    (datum,) = read(text)
    matched = match(datum)
    assert [p and echo(p) for p in matched.parts] == parts
    assert [echo(b) for b in matched.body] == rest
    assert {k: echo(v) for k, v in matched.keys.items()} == keys
