"""A conditional the method returns that nests, or any statement's conditional too long for
its line, is written as `if` statements (sx2torch/emit/conditionals.py): the text a PyTorch
engineer writes, the same choices and numbers, compiled whole by torch.compile."""

from __future__ import annotations

import itertools

import libcst as cst
import torch

from sx2torch.compiler import Options, compile_source
from sx2torch.emit import conditionals

SOURCE = """\
(defflag fast false "relu")
(defflag smooth true "tanh, else sigmoid")
(defconst scale 2.0)
(defun forward (x)
  (if fast (relu x) (if smooth (tanh x) (sigmoid x))))
(defun pick (x y)
  (let ((z (if fast x (if smooth y x))))
    (let ((long (if smooth (+ (* (tanh z) scale) (sigmoid (* z scale)) (relu (* y scale))) z)))
      (* long z))))
"""

METHODS = """\
    def forward(self, x):
        if self.fast:
            return torch.relu(x)
        if self.smooth:
            return torch.tanh(x)
        return torch.sigmoid(x)

    def pick(self, x, y):
        z = x if self.fast else y if self.smooth else x
        if self.smooth:
            long = (
                torch.tanh(z) * self.scale
                + torch.sigmoid(z * self.scale)
                + torch.relu(y * self.scale)
            )
        else:
            long = z
        return long * z
"""


def test_nested_flags_return_by_if_statements_and_one_line_ones_stay(build):
    module, code = build(SOURCE)
    assert code.endswith(METHODS), code
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    for fast, smooth in itertools.product((False, True), repeat=2):
        model = module.Model(fast=fast, smooth=smooth)
        chosen = torch.relu if fast else torch.tanh if smooth else torch.sigmoid
        assert torch.equal(model(x), chosen(x))
        z = x if fast or not smooth else y
        long = torch.tanh(z) * 2.0 + torch.sigmoid(z * 2.0) + torch.relu(y * 2.0)
        assert torch.equal(model.pick(x, y), (long if smooth else z) * z)


def test_torch_compile_takes_the_statements_whole_and_follows_a_flag_set_later(build):
    module, _ = build(SOURCE)
    model = module.Model()
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    x = torch.randn(2, 4)
    assert torch.equal(compiled(x), torch.tanh(x))
    model.fast = True  # a flag is read when the module runs: a guard, then a new graph
    assert torch.equal(compiled(x), torch.relu(x))
    torch._dynamo.reset()


def test_each_line_keeps_its_source_location():
    code = compile_source(SOURCE, "model.lisp", Options(source_lines=True))
    assert (
        "        if self.fast:\n"
        "            return torch.relu(x)  # model.lisp:5:3\n"
        "        if self.smooth:\n"
        "            return torch.tanh(x)  # model.lisp:5:3\n"
        "        return torch.sigmoid(x)  # model.lisp:5:3\n"
    ) in code


def rewritten(code: str) -> str:
    return conditionals.statements(cst.parse_module(code)).code


def test_a_branch_that_keeps_the_value_is_left_out():
    """A cast of an argument a caller may pass as None, too long for its line (T5's
    position bias), is the cast under the negated test; an else giving the name back is
    no else."""
    name = "encoder_decoder_position_bias"
    cast = f"{name} = None if {name} is None else {name}.to(torch.bfloat16)\n"
    assert rewritten(cast) == (
        f"if {name} is not None:\n    {name} = {name}.to(torch.bfloat16)\n"
    )
    kept = (
        f"x = torch.zeros_like(x, dtype=torch.bfloat16) + {name} if not flag else x\n"
    )
    assert rewritten(kept) == (
        f"if not flag:\n    x = torch.zeros_like(x, dtype=torch.bfloat16) + {name}\n"
    )
    body = f"x = x if flag and other else torch.zeros_like(x, dtype=torch.bfloat16) + {name}\n"
    assert rewritten(body).startswith(
        "if not (flag and other):\n    x = torch.zeros_like"
    )


def test_an_else_that_chooses_again_is_an_elif_and_a_short_line_stays():
    long = "very_long_name_" * 3
    code = f"y = {long}a if i == 9 else {long}b if i == 10 else {long}c\n"
    assert rewritten(code) == (
        f"if i == 9:\n    y = {long}a\nelif i == 10:\n    y = {long}b\n"
        f"else:\n    y = {long}c\n"
    )
    short = "y = a if i == 9 else b if i == 10 else c\nreturn a if c else b\n"
    assert rewritten(short) == short


def test_a_returned_conditional_in_the_then_branch_nests_its_statements():
    code = "def f():\n    return (a if p else b) if q else c\n"
    assert rewritten(code) == (
        "def f():\n    if q:\n        if p:\n            return a\n"
        "        return b\n    return c\n"
    )
