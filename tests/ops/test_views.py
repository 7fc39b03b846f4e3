"""The views (unsqueeze, squeeze, flatten, repeat-interleave, roll, slice's :step): torch's
calls, rounding nowhere under :bf16, their gradients the interpreter's bit for bit, and bad
input a diagnostic at the form."""

from __future__ import annotations

import pytest
import torch

from sx2torch import interpret
from sx2torch.compiler import Options, compile_source
from sx2torch.errors import SourceError

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


BAD = [
    ("(unsqueeze x)", "unsqueeze needs :axis"),
    (
        "(unsqueeze (reshape x [2 3]) :axis 3)",
        "unsqueeze :axis 3 is out of range for a value of rank 2 (axes -3 to 2)",
    ),
    (
        "(squeeze (reshape x [2 3]) :axis 1)",
        "squeeze :axis 1 of [2 3]: that axis has size 3, not 1 (torch would keep it)",
    ),
    (
        "(flatten (reshape x [2 3 4]) :start 2 :end 1)",
        "flatten of [2 3 4]: :start 2 comes after :end 1",
    ),
    (
        "(flatten (reshape x [2 3]) :end -3)",
        "flatten :end -3 is out of range for a value of rank 2 (axes -2 to 1)",
    ),
    (
        "(repeat-interleave x :repeats 1.5 :axis 0)",
        ":repeats must be an integer, got 1.5",
    ),
    ("(repeat-interleave x :axis 0)", "repeat-interleave needs :repeats"),
    ("(repeat-interleave x :repeats -1)", "repeat-interleave :repeats -1 is negative"),
    (
        "(roll (reshape x [2 3]) :shifts 1 :axis 2)",
        "roll :axis 2 is out of range for a value of rank 2 (axes -2 to 1)",
    ),
    ("(slice x :step 0)", "slice :step 0: torch's step is positive"),
    ("(unsqueeze x :axis d)", ":axis must be written as numbers"),
]


@pytest.mark.parametrize("form, message", BAD, ids=[m for _, m in BAD])
def test_bad_input_is_a_diagnostic_at_the_form(form, message):
    source = f"(defconst d 1)\n(defun forward (x)\n  (+ d {form}))\n"
    with pytest.raises(SourceError) as caught:
        compile_source(source, "bad.lisp", Options())
    assert message in caught.value.message
    assert caught.value.span.line == 3
