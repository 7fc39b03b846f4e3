"""Compile-time arithmetic of a thousand operands (a const, a &key argument, a body) compiles
without recursing once per operand, and computes the left fold the source writes."""

from __future__ import annotations

import pytest
import torch

from sx2torch.compiler import compile_source
from sx2torch.errors import SourceError


def test_a_thousand_operands(build):
    source = (
        "(defconst k 2)\n"
        f"(defconst j (+ k{' 1.5' * 1999}))\n"
        f"(defparam w (zeros [(+ k{' 1' * 999})]))\n"
        f"(defun forward (x &key (q 3)) (* x (sum w) j (+ q{' -1' * 1999}) (* k{' 1' * 999})))\n"
    )
    module, code = build(source)
    compile(code, "<generated>", "exec")
    model = module.Model()
    j = 2.0
    for _ in range(1999):
        j += 1.5
    assert model.j == j and model.w.shape == (1001,)
    x = torch.tensor([1.0, -2.0])
    assert torch.equal(model(x), x * 0.0 * j * (3 - 1999) * 2)
    wide = module.Model(k=3)
    assert wide.w.shape == (1002,) and wide.j == j + 1


def test_too_many_operands_is_a_diagnostic():
    source = (
        f"(defconst k 2)\n(defconst j (+ k{' 1.5' * 2000}))\n(defun forward (x) x)\n"
    )
    with pytest.raises(SourceError, match="at most 2000 operands") as error:
        compile_source(source, "model.lisp")
    assert (error.value.span.line, error.value.span.col) == (2, 13)
