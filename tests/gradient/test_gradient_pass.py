"""`gradient` is a pass after trace: trace leaves one GRADIENT node reading Y and X, with the
marks of the with-numerics forms wrapped around it; the pass writes the backward in its place.
"""

from __future__ import annotations

import pytest
import torch

from sx2torch.compiler import Options, compile_source
from sx2torch.errors import SourceError

from cases import GOLDEN

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
    # the sum's gradient is ones shaped like (tanh ...), which has the matmul's shape: the
    # sum is no longer computed
    assert "  %4 grad_tanh-matmul = ones-like(%2) [island]  @4:58" in lines
    assert not any(" sum(" in line for line in lines)
    # the let's name is the value's, and the reader of the gradient reads its value
    assert "  %9 grad_x = matmul(%7, %8) [island]  @4:69" in lines
    assert any(line.startswith("  %10 = *(%9, 2.0)") for line in lines)
    assert "  return %10" in lines


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


def test_the_backward_computes_no_value_only_for_its_shape():
    """A full sum's gradient is ones of its input's shape (no sum with a rounding and a hook
    computed for ones_like); a sum back to a shape reads a value computed anyway; the
    rules' products by a literal 1 are the other factor."""
    source = (GOLDEN / "gradient-regions.lisp").read_text()
    code = compile_source(source, "gradient-regions.lisp", Options(target="cpu"))
    chained = code.split("    def chained(")[1]
    assert "torch.sum(" not in chained
    assert "grad_x = torch.ones_like(x, dtype=torch.float32)" in chained
    assert "grad_x = grad_chain" not in chained  # the seed starts the adjoint loop
    assert ".sum_to_size(matmul_x.shape)" in chained
    assert "* 1.0" not in chained.split("# (gradient")[1]
