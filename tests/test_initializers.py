"""Initializers at the edges of what torch accepts: they build, with the values torch gives."""

from __future__ import annotations

import torch


def test_edge_ranges_build(build):
    source = (
        "(defparam a (normal [3] :mean 2 :std 0))\n"
        "(defparam b (uniform [3] :low 1.5 :high 1.5))\n"
        "(defparam c (eye 0))\n"
        "(defun forward (x) (* x (sum a)))\n"
    )
    module, _ = build(source)
    model = module.Model()
    assert torch.equal(model.a, torch.full((3,), 2.0))
    assert torch.equal(model.b, torch.full((3,), 1.5))
    assert model.c.shape == (0, 0) and model.c.dtype == torch.float32
