"""softmax's :dtype: :f32 (the default) is torch's softmax(x, dtype=torch.float32), an f32
island, as transformers' eager attention computes it; :input is torch's kernel on X in the
dtype it computes in (a bf16 model's F.softmax(x) on bf16 scores, GPT-2's eager attention),
which on a bf16 tensor is another kernel: along an axis but the last, torch's CPU kernel
on bf16 gives other bits than the f32 one rounded."""

from __future__ import annotations

import pytest
import torch

from sx2torch import interpret

SOURCE = """
(defparam w (normal [8 8]))
(defun forward (x)
  (let ((scores (matmul x w)))
    [(softmax scores :axis 0 :dtype :input) (softmax scores :axis -1 :dtype :input)
     (softmax scores :axis 0) (softmax scores :axis 0 :dtype :f32)]))
(defrun train :precision :%s)
"""


def _values(state):
    torch.manual_seed(0)
    x = torch.randn(16, 8) * 2
    return x, state["w"]


@pytest.mark.parametrize("precision", ["bf16", "f32"])
def test_input_is_torchs_kernel_on_the_value_and_f32_the_island(build, precision):
    module, code = build(SOURCE % precision)
    model = module.Model()
    state = {k: v.detach() for k, v in model.state_dict().items()}
    x, w = _values(state)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    scores = x.to(dtype) @ w.to(dtype)
    want = [
        torch.softmax(scores, 0),
        torch.softmax(scores, -1),
        torch.softmax(scores, 0, dtype=torch.float32),
        torch.softmax(scores, 0, dtype=torch.float32),
    ]
    got = model(x)
    theirs = interpret.load(SOURCE % precision, state=state).evaluate("forward", [x])
    for value, interpreted, expected in zip(got, theirs, want):
        assert value.dtype == interpreted.dtype == expected.dtype
        assert torch.equal(value, expected) and torch.equal(interpreted, expected)
    if precision == "bf16":  # the two kernels differ here: the test tells them apart
        assert not torch.equal(want[0].float(), want[2].bfloat16().float())


def test_an_unknown_dtype_is_a_diagnostic():
    from sx2torch.compiler import Options, compile_source
    from sx2torch.errors import SourceError

    with pytest.raises(SourceError) as caught:
        compile_source(
            "(defun forward (x) (softmax x :dtype :bf16))", "m.lisp", Options()
        )
    assert caught.value.message == ":dtype must be :f32 or :input, got :bf16"
