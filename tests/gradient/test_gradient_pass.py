"""`gradient` is a pass after trace: trace leaves one GRADIENT node reading Y and X, with the
marks of the with-numerics forms wrapped around it; the pass writes the backward in its place.
"""

from __future__ import annotations

import pytest
import torch

from sx2torch.compiler import Options, compile_source
from sx2torch.errors import SourceError

SOURCE = """
(defparam w (normal [4 4]))
(defun forward (x)
  (let ((g (with-numerics (:sensitivity :high) (gradient (sum (tanh (matmul x w))) x))))
    (* g 2.0)))
"""


def dumped(source: str, after: str) -> list:
    return compile_source(source, "model.lisp", Options(dump_after=after)).splitlines()


def test_the_trace_dump_shows_the_graph_before_differentiation():
    lines = dumped(SOURCE, "trace")
    assert "  %5 g = gradient(%4, %0) marks=[island]  @4:48" in lines
    assert not any("ones-like" in line for line in lines)


def test_the_gradient_dump_shows_the_backward_in_its_place():
    lines = dumped(SOURCE, "gradient")
    assert not any("gradient(" in line for line in lines)
    assert "  %5 grad_sum-tanh = ones-like(%4) [island]  @4:58" in lines
    # the let's name is the value's, and the reader of the gradient reads its value
    assert any(line.startswith("  %12 = *(%11, 2.0)") for line in lines)
    assert "  return %12" in lines


def test_a_gradient_of_a_gradient_differentiates_the_expanded_one(build):
    module, _ = build(
        "(defun forward (x) (gradient (sum (gradient (sum (* x x x)) x)) x))"
    )
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(module.Model()(x), 6 * x)


def test_an_unused_gradient_is_still_checked():
    source = "(defun forward (x) (let ((g (gradient (sum (// x 2.0)) x))) x))"
    with pytest.raises(SourceError) as error:
        compile_source(source, "model.lisp")
    assert "'//' has no gradient" in str(error.value)
