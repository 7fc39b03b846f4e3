"""A defparam's docstring is comment lines above the statement that makes it in __init__,
whatever the parameter is (a tensor, a :when one, a sub-model); the options follow it.
"""

from __future__ import annotations

import pytest

from sx2torch.compiler import compile_source
from sx2torch.errors import SourceError

SOURCE = """
(defmodel m (&key (d 2)) (defparam v (zeros [d])) (defun forward (x) (+ x v)))
(defconst big true)
(defparam w (ones [4]) "the scale, as Llama's
  RMSNorm weight" :numerics :high)
(defparam g (ones [4]) "a gate" :when big)
(defparam s (m :d 4) "a sub-model")
(defun forward (x) (s (* x w g)))
"""


def test_a_docstring_is_a_comment_above_the_parameter():
    code = compile_source(SOURCE, "model.lisp")
    assert (
        "        # the scale, as Llama's\n"
        "        # RMSNorm weight\n"
        "        self.w = nn.Parameter(torch.ones(4))\n"
        "        # a gate\n"
        "        if big:\n"
        "            self.g = nn.Parameter(torch.ones(4))\n"
        "        # a sub-model\n"
        "        self.s = M(d=4)\n"
    ) in code


def test_a_sub_model_with_a_docstring_still_refuses_storage_options():
    source = '(defmodel m () (defun forward (x) x))\n(defparam s (m) "doc" :dtype :bf16)\n(defun forward (x) (s x))'
    with pytest.raises(SourceError) as caught:
        compile_source(source, "model.lisp")
    assert "a sub-model parameter takes no" in caught.value.message
    assert (caught.value.span.line, caught.value.span.col) == (
        2,
        23,
    )  # at :dtype, after the docstring
