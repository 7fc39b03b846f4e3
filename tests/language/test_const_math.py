"""Integer and function math on consts: `int`, `floor`, `ceil`, `log`, `exp`, `sqrt` of
compile-time numbers, as transformers' configs compute sizes
(`int(partial_rotary_factor * head_dim)`). A const's stays an expression the constructor
computes, so a caller's value changes it; a literal's is folded."""

from __future__ import annotations

import math

import pytest
import torch

from sx2torch import interpret
from sx2torch.compiler import Options, compile_source
from sx2torch.errors import SourceError

ROTARY = """
(defconst head-dim 8)
(defconst partial-rotary-factor 0.5)
(defconst rotary-dim (int (* partial-rotary-factor head-dim)))
(defconst buckets (floor (log (* 2.5 head-dim))))
(defparam w (normal [head-dim rotary-dim]))
(defparam table (normal [buckets]))
(defun forward (x &key (scale 4))
  (* (matmul x w) (ceil (/ scale 3)) (exp (log scale)) (sqrt scale) (sum table)))
(defrun train :precision :f32)
"""


def test_a_const_function_is_computed_by_the_constructor_from_the_callers_values(build):
    module, code = build(ROTARY)
    assert "rotary_dim = int(partial_rotary_factor * head_dim)" in code
    assert "buckets = math.floor(math.log(2.5 * head_dim))" in code
    assert code.splitlines()[2] == "import math"
    assert module.Model().w.shape == (8, 4)
    assert module.Model(partial_rotary_factor=0.25).w.shape == (8, 2)
    assert module.Model(head_dim=12).table.shape == (math.floor(math.log(30.0)),)


def test_functions_of_a_key_compute_as_pythons_when_the_module_runs(build):
    module, _ = build(ROTARY)
    torch.manual_seed(0)
    model = module.Model()
    x = torch.randn(3, 8)
    for scale in (4, 7):
        product = (x @ model.w) * math.ceil(scale / 3) * math.exp(math.log(scale))
        want = product * scale**0.5 * model.table.sum()
        assert torch.equal(model(x, scale=scale), want)
    interpreted = interpret.load(ROTARY)
    torch.manual_seed(0)
    got = interpreted.evaluate("forward", [x], keys={"scale": 7})
    assert got.shape == (3, 4)


def test_a_literals_function_is_folded_and_no_math_is_imported(build):
    module, code = build(
        "(defconst n (int (* 2.9 (ceil 1.5))))\n"
        "(defparam w (normal [n]))\n(defun forward (x) (* x (sum w)))\n"
    )
    assert "n=5" in code and "import math" not in code
    assert module.Model().w.shape == (5,)


def test_tensor_floor_ceil_and_int_are_torchs(build):
    module, _ = build(
        "(defun forward (x) (let ((h (cast x :bf16))) (+ (floor h) (ceil h))))\n"
        "(defun whole (x) (int x))\n(defrun train :precision :bf16)\n"
    )
    x = torch.tensor([-2.5, -0.5, 0.5, 1.75, 300.7])
    model = module.Model()
    assert torch.equal(
        model(x), (torch.floor(x.bfloat16()) + torch.ceil(x.bfloat16())).float()
    )
    whole = model.whole(x)
    assert whole.dtype == torch.int64 and torch.equal(whole, x.long())


BAD = [
    ("(defconst k (log 0))", "'log' is not defined at 0"),
    ("(defconst z 0)\n(defconst k (log z))", "not defined at 0 (with the consts"),
    (
        "(defconst z 2)\n(defconst k (tanh z))",
        "expected a number known at compile time",
    ),
    ("(defconst k (int 1e300))", "number out of range"),
    ("(defconst k (int true))", "'int' needs a number, got true"),
]


@pytest.mark.parametrize("consts, message", BAD, ids=[m for _, m in BAD])
def test_bad_const_math_is_a_diagnostic_at_the_form(consts, message):
    source = consts + "\n(defun forward (x) (* x k))\n"
    with pytest.raises(SourceError) as caught:
        compile_source(source, "bad.lisp", Options())
    assert message in caught.value.message
    assert caught.value.span.line == consts.count("\n") + 1


def test_a_function_of_a_key_that_no_const_function_is_refused_at_the_form():
    source = "(defun forward (x &key (k 2)) (* x (tanh k)))\n"
    with pytest.raises(SourceError) as caught:
        compile_source(source, "bad.lisp", Options())
    assert (
        "'tanh' of a const is not known when the file compiles" in caught.value.message
    )
    assert (caught.value.span.line, caught.value.span.col) == (1, 36)


def test_a_source_name_math_beside_the_import_is_renamed_and_otherwise_kept(build):
    """`math` is a name like any other (the replay corpus has consts, keys and locals so
    named), until the module imports math: then the source's is `math_`."""
    module, code = build(
        "(defconst math 2.0)\n(defconst n (floor (* math 1.5)))\n"
        "(defparam w (normal [n]))\n(defun forward (x) (* x math (sum w)))\n"
    )
    assert "n = math.floor(math_ * 1.5)" in code
    assert module.Model(math_=3.0).w.shape == (4,)
    _, code = build("(defconst math 2.0)\n(defun forward (x) (* x math))\n")
    assert "math=2.0" in code and "import math" not in code


def test_the_names_pass_takes_math_where_the_module_imports_it():
    """The names pass knows the module's imports from the plan: `--dump-after names` shows
    the name the module binds (`math_`), not one that emission would have to change."""
    source = (
        "(defconst math 2.0)\n(defconst n (floor (* math 1.5)))\n"
        "(defun forward (x &key (math 1.0)) (* x math n))\n"
    )
    dumped = compile_source(source, "model.lisp", Options(dump_after="names"))
    assert "math -> math_" in dumped and ":math math_" in dumped
    code = compile_source(source, "model.lisp", Options())
    assert "def forward(self, x, *, math_=1.0):" in code
    assert "n = math.floor(math_ * 1.5)" in code


def test_a_consts_membership_of_literals_is_folded(build):
    """`(in 2 [1 2])` of literals alone is a literal (it was an internal error: the check
    for literals read the vector of choices as a number)."""
    module, code = build(
        "(defconst wide (in 2 [1 2]))\n(defun forward (x) (if wide x (* x 2)))\n"
    )
    assert "wide=True" in code
    x = torch.randn(3)
    assert torch.equal(module.Model()(x), x)
    assert torch.equal(module.Model(wide=False)(x), x * 2)
