"""Integer and boolean tensors: `(cast X :i64)`, `:i32` and `:bool` are torch's `.long()`,
`.int()` and `.bool()` of X as it is computed (the policy never rounds an integer, nor the
value it is made from), and a cast of one to a float is written, as torch needs it."""

from __future__ import annotations

import pytest
import torch

from sx2torch import interpret

CASTS = """
(defun forward (x)
  (let ((h (* 4.0 x)))
    [(cast h :i64) (cast h :i32) (cast (relu h) :bool)]))
(defrun train :precision :bf16)
"""
# 255.6 is 256 in bf16: an integer made from the f32 value is 255 (torch's .long() of it)
X = torch.tensor([[-2.6, -0.1, 0.3, 63.9], [1.25, 2.0, -63.9, 0.0]])


@pytest.mark.parametrize("target", ["cuda", "cpu"])
def test_integer_casts_are_torchs_of_the_value_as_computed(build, target):
    module, code = build(CASTS, target=target)
    h = 4.0 * X
    got = module.Model()(X)
    want = (h.long(), h.int(), torch.relu(h).bool())
    for value, expected in zip(got, want):
        assert value.dtype == expected.dtype and torch.equal(value, expected)
    assert got[0][0, 3] == 255  # not 256, the bf16 rounding of 255.6
    interpreted = interpret.load(CASTS).evaluate("forward", [X])
    for value, expected in zip(interpreted, want):
        assert value.dtype == expected.dtype and torch.equal(value, expected)


@pytest.mark.parametrize("target", ["cuda", "cpu"])
@pytest.mark.parametrize("precision", ["f32", "bf16"])
def test_a_boolean_or_integer_cast_to_a_float_is_written(build, target, precision):
    """`(mean (cast (> x 0) :f32))` was `torch.mean(x > 0)`, which torch refuses (mean of
    a bool tensor); the cast is now `.float()`, and to bf16 torch's conversion."""
    source = (
        "(defun forward (x) (+ (mean (cast (> x 0) :f32))"
        " (* x (cast (int (* 3.0 x)) :bf16))))\n"
        f"(defrun train :precision :{precision})\n"
    )
    module, code = build(source, target=target)
    assert "(x > 0).float()" in code
    got = module.Model()(X)
    if precision == "f32":  # integers of 3x are bf16 numbers: the cast is exact
        want = torch.mean((X > 0).float()) + X * (3.0 * X).long().float()
        assert torch.equal(got, want)
    interpreted = interpret.load(source).evaluate("forward", [X])
    assert torch.equal(got.float(), interpreted.float())


def test_a_numbers_integer_cast_is_pythons_int(build):
    module, code = build("(defun forward (x &key (k 2.7)) (* x (cast k :i64)))\n")
    assert "int(k)" in code
    assert torch.equal(module.Model()(X, k=-3.5), X * -3)


SUMS = """
(defparam w (normal [4 4]))
(defun forward (x)
  (let ((ids (cast (* 40.0 x) :i64))
        (keep (> x 0)))
    [(sum ids :axes [1]) (cumsum ids :axis -1) (sum keep) (cumsum (cast keep :i32) :axis 0)
     (expand-as (sum ids :axes [1] :keepdims true) ids)
     (* (sum keep :axes [0]) (matmul x w))]))
(defrun train :precision %s)
"""


@pytest.mark.parametrize("target", ["cuda", "metal", "cpu"])
@pytest.mark.parametrize("precision", [":f32", ":bf16"])
def test_integer_sums_are_torchs_int64_never_rounded(build, target, precision):
    """sum and cumsum of integer and boolean tensors give int64, as torch's do (a bool's
    sum is a count, an i32's cumsum int64), and expand-as moves integers as they are: an
    integer sum past 256 is not rounded to bf16 under :bf16 (1356 stays 1356)."""
    module, code = build(SUMS % precision, target=target)
    model = module.Model()
    x = torch.tensor([[31.2, -0.1, 0.3, 2.5], [1.25, 2.0, -63.9, 0.4]])
    ids, keep = (40.0 * x).long(), x > 0
    w = model.state_dict()["w"]
    bf16 = precision == ":bf16"  # the held targets hold bf16 in f32
    dtype = torch.bfloat16 if bf16 and target == "cuda" else torch.float32
    want = [
        ids.sum(1),
        ids.cumsum(-1),
        keep.sum(),
        keep.int().cumsum(0),
        ids.sum(1, keepdim=True).expand_as(ids),
    ]
    got = model(x)
    for value, expected in zip(got, want):
        assert value.dtype == torch.int64 and torch.equal(value, expected)
    assert got[0][0] == 1356  # no bf16 number: its rounding is 1360
    product = got[5]
    assert product.dtype == dtype
    state = {k: v.detach() for k, v in model.state_dict().items()}
    theirs = interpret.load(SUMS % precision, state=state).evaluate("forward", [x])
    for value, expected in zip(theirs[:5], want):
        assert value.dtype == torch.int64 and torch.equal(value, expected)
    assert theirs[5].dtype == (torch.bfloat16 if bf16 else torch.float32)
    if target == "cuda":  # the count times a float, as torch's promotion gives it
        assert torch.equal(product, theirs[5])
    if not bf16:
        assert torch.equal(product, keep.sum(0) * (x @ w))


@pytest.mark.parametrize("target", ["cuda", "metal"])
@pytest.mark.parametrize("precision", ["f32", "bf16"])
def test_an_if_of_integer_tensors_keeps_them_integers(build, target, precision):
    """T5's bucket arithmetic: an `if` between two integer tensors, or an integer tensor
    and a number, is an integer tensor, stored as it is (it was cast to bf16, which a
    `take` then refused as an index), and reads as transformers' _relative_position_bucket
    writes it."""
    source = f"""
(defparam table (normal [16 2]))
(defun bucket (relative &key (bidirectional true))
  (let ((base (if bidirectional (* (cast (> relative 0) :i64) 8) 0))
        (distance (if bidirectional (abs relative) (- (minimum relative 0)))))
    (+ base (minimum distance 7))))
(defun forward (x &key (bidirectional true))
  (let ((context (unsqueeze (positions x :axis 1) :axis 1))
        (memory (unsqueeze (positions x :axis 1) :axis 0)))
    (take table (bucket (- memory context) :bidirectional bidirectional))))
(defrun train :precision :{precision})
"""
    module, code = build(source, target=target)
    assert (
        "        if bidirectional:\n"
        "            distance = torch.abs(relative)\n"
        "        else:\n"
        "            distance = -torch.clamp(relative, max=0)\n"
    ) in code
    model = module.Model()
    x = torch.zeros(2, 12)
    relative = torch.arange(12)[None, :] - torch.arange(12)[:, None]
    for bidirectional in (True, False):
        if bidirectional:
            want = (relative > 0).long() * 8 + torch.abs(relative).clamp(max=7)
        else:
            want = (-torch.clamp(relative, max=0)).clamp(max=7)
        got = model.bucket(relative, bidirectional=bidirectional)
        assert got.dtype == torch.int64 and torch.equal(got, want)
        rows = model.table[want].detach()
        if precision == "bf16":  # the rows rounded, as bf16 tensors or f32 ones
            rows = rows.to(torch.bfloat16).float()
        assert torch.equal(model(x, bidirectional=bidirectional).float(), rows)
