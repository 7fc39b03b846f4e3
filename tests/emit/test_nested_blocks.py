"""Deeply nested with-numerics forms give Python that compiles (at most 20 nested blocks) and
computes what the innermost form says."""

from __future__ import annotations

import pytest
import torch

from sx2torch.compiler import compile_source

FORMS = ["(with-numerics (:sensitivity :high)", "(with-numerics (:precision :bf16)"]


def nested(levels: int) -> str:
    opened = " ".join(FORMS[i % 2] for i in range(levels))
    return (
        "(defparam w (normal [4 4]))\n"
        f"(defun forward (x) {opened} (tanh (matmul x w)){')' * levels})\n"
        "(defrun train :precision :bf16)\n"
    )


@pytest.mark.parametrize("levels", [30, 31, 61])
def test_deep_nesting_compiles_and_the_innermost_form_wins(build, levels):
    module, code = build(nested(levels))
    compile(code, "<generated>", "exec")
    assert code.count("with ") <= 4
    torch.manual_seed(0)
    model = module.Model()
    x = torch.randn(3, 4)
    if levels % 2:  # innermost: an island, f32 from the master weight
        expected = torch.tanh(x @ model.w)
    else:  # innermost: a bf16 region
        expected = torch.tanh(x.to(torch.bfloat16) @ model.w.to(torch.bfloat16))
    result = model(x)
    assert result.dtype == expected.dtype and torch.equal(result, expected)


def test_deeper_than_the_reader_allows_is_a_diagnostic():
    from sx2torch.errors import SourceError

    with pytest.raises(SourceError, match="forms nested deeper than 64 levels"):
        compile_source(nested(100), "model.lisp")
