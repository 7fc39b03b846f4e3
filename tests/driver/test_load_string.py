"""A source given as a string: its class is `Model` where the file name is a pseudo-name
(`<string>`, as for standard input), and `load_string` imports it as `load` imports a file,
with no `exec` of the caller's."""

from __future__ import annotations

import pytest
import torch

import sx2torch
from sx2torch.runtime import located

SOURCE = """(defparam w (normal [4 2]))
(defun forward (x) (matmul x w))
"""


def test_compile_string_without_a_file_name_names_the_class_model():
    code = sx2torch.compile_string(SOURCE)
    assert "class Model(nn.Module):" in code and '__all__ = ["Model"]' in code


def test_load_string_imports_the_module():
    module = sx2torch.load_string(SOURCE)
    model = module.Model()
    x = torch.randn(3, 4)
    assert torch.equal(model(x), x @ model.w)
    assert sx2torch.load_string(SOURCE) is module  # once per text


def test_load_string_names_the_class_after_a_given_file_name():
    assert hasattr(sx2torch.load_string(SOURCE, filename="rms-mlp.lisp"), "RmsMlp")


def test_a_run_time_error_in_a_loaded_string_names_its_form():
    module = sx2torch.load_string(SOURCE)
    with pytest.raises(RuntimeError) as caught:
        module.Model()(torch.randn(3, 5))
    (note,) = located.locate(caught.value)
    head, line, caret = note.splitlines()
    assert head.endswith(
        ":2:20: note: the error is raised in this form (" + head.split("(")[-1]
    )
    assert line.strip() == "(defun forward (x) (matmul x w))"
