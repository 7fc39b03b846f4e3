"""The views (unsqueeze, squeeze, flatten, repeat-interleave, roll, slice's :step): torch's
calls, rounding nowhere under :bf16, their gradients the interpreter's bit for bit,."""

from __future__ import annotations

import pytest
import torch

from sx2torch import interpret

VIEWS = """
(defparam w (normal [4 4]))
(defun forward (x)
  (let ((h (reshape (matmul x w) [2 3 4])))
    (+ (flatten (unsqueeze (squeeze (unsqueeze h :axis 1) :axis 1) :axis 0) :start 0 :end 1)
       (repeat-interleave (slice h :axis -1 :start 1 :step 2) :repeats 2 :axis -1)
       (roll h :shifts 1 :axis 1))))
(defun grad (x)
  (let ((h (reshape (matmul x w) [2 3 4])))
    (gradient (sum (* (+ (flatten (unsqueeze h :axis 0) :start 0 :end 1)
                         (repeat-interleave (slice h :axis -1 :step 2) :repeats 2 :axis -1)
                         (roll h :shifts -1 :axis 1))
                      h))
              w)))
(defrun train :precision :bf16)
"""


def _reference(x, w):
    h = (x.bfloat16() @ w.bfloat16()).reshape(2, 3, 4)
    return (
        h.unsqueeze(1).squeeze(1).unsqueeze(0).flatten(0, 1)
        + h[..., 1::2].repeat_interleave(2, dim=-1)
        + torch.roll(h, 1, 1)
    )


@pytest.mark.parametrize("target", ["cuda", "cpu"])
def test_views_round_nowhere_and_their_gradients_are_the_interpreters(build, target):
    module, code = build(VIEWS, target=target)
    forward = code.split("def forward")[1].split("def grad")[0]
    for view in ("unsqueeze(", "squeeze(", "flatten(", "repeat_interleave(", "roll("):
        # no rounding is written around a view on a held target
        assert f"store_bf16(h.{view}" not in forward and view in forward
    model = module.Model()
    torch.manual_seed(0)
    x = torch.randn(6, 4)
    got = model(x)
    assert torch.equal(got.float(), _reference(x, model.w.detach()).float())
    interpreted = interpret.load(VIEWS, state={"w": model.w.detach()})
    want = interpreted.evaluate("grad", [x], rounded_once=True)
    assert want.dtype == torch.bfloat16
    assert torch.equal(model.grad(x).float(), want.float())
