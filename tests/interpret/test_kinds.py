"""The interpreter's precision kinds (sx2torch/interpret/ops.py)."""

from __future__ import annotations

import torch

import sx2torch.interpret as interpret


def test_integer_arithmetic_stays_integer():
    """`(+ (positions ids) 1)` indexes a table, as the module's `torch.arange(...) + 1`
    does: the interpreter made the sum a float (`+` was FLOAT, the registry's KEEP) and
    the gather failed."""
    source = """
(defparam wpe (normal [8 4] :std 0.02))
(defun forward (ids)
  (take wpe (- (+ (positions ids :axis 1) 2) 1)))
"""
    wpe = torch.randn(8, 4)
    model = interpret.load(source, state={"wpe": wpe})
    ids = torch.zeros(2, 3, dtype=torch.long)
    assert torch.equal(model("forward", ids), wpe[torch.arange(3) + 1])
