"""Everyday model code, each construct against plain PyTorch: state_dict keys kept exactly,
integer positions, masks, tied and deep reads, several return values, arithmetic, and the
small ops a port needs."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from cases import lisp
from sx2torch.compiler import Options, compile_source
from sx2torch.errors import SourceError


def error(source: str) -> tuple:
    """(line, col, message) of the diagnostic compiling `source` gives."""
    with pytest.raises(SourceError) as raised:
        compile_source(source, "model.lisp", Options())
    return raised.value.span.line, raised.value.span.col, raised.value.message


def test_state_dict_keys_are_the_source_names_even_keywords(build):
    module, code = build(lisp("exact-keys").read_text(), "exact-keys.lisp")

    class Self(nn.Module):
        def __init__(self):
            super().__init__()
            self.input = nn.Parameter(torch.randn(4, 4))
            self._buffers["type"] = torch.randn(4)

    plain = nn.Module()
    plain.register_parameter("class", nn.Parameter(torch.randn(4, 4)))
    plain.add_module("lambda", Self())
    plain._modules["type"] = nn.ModuleList(
        [Self(), Self()]
    )  # nn.Module.type is a method
    plain.self = nn.Parameter(torch.randn(4))
    model = module.ExactKeys()
    assert sorted(model.state_dict()) == sorted(plain.state_dict())
    model.load_state_dict(plain.state_dict(), strict=True)
    x = torch.randn(3, 4)
    h = x @ getattr(plain, "class")
    for sub in (getattr(plain, "lambda"), *plain._modules["type"]):
        h = h @ sub.input + sub._buffers["type"]
    assert torch.equal(model(x), plain.self * h)


def test_two_parameters_with_one_key_are_a_diagnostic():
    source = (
        "(defparam a-b (zeros [3]))\n(defparam a_b (ones [3]))\n(defun forward (x) x)"
    )
    assert error(source) == (
        2,
        11,
        "'a_b' and 'a-b' (line 1) would both have the state_dict key 'a_b': rename one",
    )
