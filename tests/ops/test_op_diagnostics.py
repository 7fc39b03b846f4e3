"""Bad input to the views, the norms and the integer casts: a diagnostic at the form, with
torch's reason."""

from __future__ import annotations

import pytest

from sx2torch import interpret
from sx2torch.compiler import Options, compile_source
from sx2torch.errors import SourceError

BAD = [
    # the views (sx2torch/ops/shape.py)
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
    (
        "(stack [(reshape x [2 3]) (reshape x [3 2])])",
        "stack of [3 2] beside [2 3]: torch stacks tensors of one shape",
    ),
    (
        "(stack [(reshape x [6]) (reshape x [1 6])])",
        "torch stacks tensors of one shape",
    ),
    (
        "(stack [(reshape x [6]) (reshape x [6])] :axis 3)",
        "stack :axis 3 is out of range for a value of rank 1 (axes -2 to 1)",
    ),
    ("(pad x [1 2 3])", "pad of 3 numbers: torch's padding is a (left, right) pair"),
    ("(pad (reshape x [2 3]) [1 1 1 1 1 1])", "pad of 3 axes of a value of rank 2"),
    ("(pad (reshape x [2 3]) [-2 -2])", "pad of [2 3] trims axis 1 below nothing"),
    # the integer casts (sx2torch/trace/forms.py) and float-only ops fed integers
    ("(cast x :i16)", "expected :f32 or :bf16 or :i64 or :i32 or :bool, got :i16"),
    ("(cast 2 :bool)", "cast to :bool takes a tensor, got a number"),
    ("(exp (cast x :i64))", "'exp' needs a float tensor, got an integer tensor"),
    ("(tanh (cast x :bool))", "'tanh' needs a float tensor, got a boolean tensor"),
    # group-norm (sx2torch/ops/nn.py)
    (
        "(group-norm (reshape x [2 6 3]) 4)",
        "group-norm of [2 6 3]: its 6 channels are not divisible into 4 groups",
    ),
    (
        "(group-norm (reshape x [2 4 3]) 2 (sum (reshape x [3 5]) :axes [0]))",
        "group-norm of [2 4 3]: its WEIGHT is [5], not [4], one per channel",
    ),
    (
        "(group-norm (sum (reshape x [2 4]) :axes [0]) 2)",
        "X is [N, C, ...], batched with channels",
    ),
    ("(group-norm x 0)", "group-norm of 0 groups: there must be at least one"),
    ("(group-norm x 1.5)", "must be an integer, got 1.5"),
    # the fused norms (sx2torch/ops/fused.py) read X's last axis: the module wrote
    # F.rms_norm(5.0, ((5.0).size(-1),)) and failed when it ran (found by tools/hostile)
    ("(fused-rms-norm 5.0 (sum (reshape x [2 4]) :axes [0]))", "a norm of a 0-d value"),
    ("(fused-layer-norm (sum x))", "a norm of a 0-d value"),
    # einsum's equation (sx2torch/ops/einsum.py)
    ('(einsum "ij,jk" x x)', 'einsum\'s equation needs its output written after "->"'),
    (
        '(einsum "i2,jk->ik" x x)',
        'einsum\'s subscripts are letters and at most one "..."',
    ),
    ('(einsum "ij,jk->iz" x x)', "einsum's output \"iz\" names each of its inputs'"),
    ('(einsum "ij->ij" x x)', 'einsum\'s equation "ij->ij" names 1 operands, got 2'),
    (
        '(einsum "ijk->k" (reshape x [2 2]))',
        'einsum\'s operand 1 "ijk" has 3 axes, got',
    ),
    ("(einsum ij x)", 'einsum\'s equation must be a string, such as "ij,jk->ik"'),
    (
        '(gradient (sum (einsum "ii->i" x)) x)',
        "einsum's derivative by an operand that repeats a letter",
    ),
]

# A number where torch's kernel takes a tensor (its weight or bias): torch refuses it when
# the module runs (`layer_norm(): argument 'bias' (position 4) must be Tensor, not float`),
# and the interpreter stopped with that TypeError (found by tools.hostile, seed 35).
ROW, W, IMAGE = (
    "(reshape x [2 4])",
    "(sum (reshape x [2 4]) :axes [0])",
    "(reshape x [1 2 2 2])",
)
NUMBERS = [
    f"(fused-layer-norm {ROW} {W} 0.5)",
    f"(fused-layer-norm {ROW} 2.0)",
    f"(fused-rms-norm {ROW} 2.0)",
    f"(linear {ROW} (reshape x [4 4]) 0.5)",
    f"(conv2d {IMAGE} (reshape x [2 2 1 1]) 0.5)",
    f"(conv1d (reshape x [1 2 4]) (reshape x [2 2 1]) 1.0)",
]


@pytest.mark.parametrize("form", NUMBERS)
def test_a_number_where_torch_takes_a_tensor_is_a_diagnostic(form):
    source = f"(defun forward (x)\n  {form})\n"
    for front_end in (
        lambda: compile_source(source, "bad.lisp", Options()),
        lambda: interpret.check(source, "bad.lisp"),
    ):
        with pytest.raises(SourceError) as caught:
            front_end()
        assert "needs a float tensor, got a number" in caught.value.message
        assert caught.value.span.line == 2


@pytest.mark.parametrize("form, message", BAD, ids=[m for _, m in BAD])
def test_bad_input_is_a_diagnostic_at_the_form(form, message):
    source = f"(defconst d 1)\n(defun forward (x)\n  (+ d {form}))\n"
    with pytest.raises(SourceError) as caught:
        compile_source(source, "bad.lisp", Options())
    assert message in caught.value.message
    assert caught.value.span.line == 3
