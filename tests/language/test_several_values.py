"""Several return values: a defun whose body ends in a vector returns a tuple, bound by let
destructuring, each value in its own dtype; checked against plain PyTorch."""

from __future__ import annotations

import pytest
import torch

from cases import lisp
from sx2torch import interpret
from sx2torch.compiler import Options, compile_source
from sx2torch.errors import SourceError

BF16 = torch.bfloat16
SOURCE = lisp("several-values").read_text()


def reference(x, w_in, dense):
    """golden/several-values.lisp under :bf16, written out in plain PyTorch."""
    h = x.to(BF16) @ w_in.to(BF16)
    norms = torch.sum(h.float() * h.float(), dim=-1)
    pooled = torch.tanh(torch.mean(h.float(), dim=1).to(BF16) @ dense.to(BF16))
    return h, pooled, norms


def test_each_value_keeps_its_dtype_and_matches_plain_pytorch(build):
    module, _ = build(SOURCE, "several-values.lisp")
    torch.manual_seed(0)
    model = module.SeveralValues()
    x = torch.randn(2, 3, 8)
    got = model(x)
    assert isinstance(got, tuple) and len(got) == 3
    expected = reference(x, model.w_in, model.pool.dense)
    assert [g.dtype for g in got] == [BF16, BF16, torch.float32]
    for g, e in zip(got, expected):
        assert torch.equal(g, e)
    # a sub-model's public forward gives both; the program calls it only with bf16, so its
    # one method casts f32 from outside down at entry, as every target does
    states, pooled = model.pool(x)
    assert states.dtype == BF16 and torch.equal(states, x.to(BF16))
    assert pooled.dtype == BF16 and pooled.shape == (2, 8)
    assert torch.equal(model.pooled(x), expected[1])  # [_ p]: the first not kept


def test_under_f32_and_through_backward(build):
    source = SOURCE + "\n(defrun plain :precision :f32)\n"
    module, _ = build(source, "several-values.lisp", run="plain")
    torch.manual_seed(0)
    model = module.SeveralValues()
    x = torch.randn(2, 3, 8, requires_grad=True)
    h = x @ model.w_in
    pooled = torch.tanh(torch.mean(h, dim=1) @ model.pool.dense)
    expected = (h, pooled, torch.sum(h * h, dim=-1))
    got = model(x)
    assert [g.dtype for g in got] == [torch.float32] * 3
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=0, atol=0)
    (got[1].sum() + got[2].sum()).backward()
    grad = torch.autograd.grad(expected[1].sum() + expected[2].sum(), x)[0]
    torch.testing.assert_close(x.grad, grad)


def test_the_interpreter_gives_the_same_tuple(build):
    module, _ = build(SOURCE, "several-values.lisp")
    torch.manual_seed(4)
    model = module.SeveralValues()
    oracle = interpret.load(SOURCE, "several-values.lisp", state=model.state_dict())
    x = torch.randn(2, 3, 8)
    for method in ("forward", "encode"):
        theirs, ours = oracle(method, x), getattr(model, method)(x)
        assert isinstance(theirs, tuple) and len(theirs) == len(ours)
        for a, b in zip(theirs, ours):
            assert a.dtype == b.dtype and torch.equal(a, b)


GRADIENT = """
(defparam w (normal [4 4]))
(defun split (x) (let ((h (matmul x w))) [(tanh h) (* h h)]))
(defun forward (x)
  (gradient (let (([a b] (split x))) (sum (* a b))) x))
"""


def test_a_gradient_goes_through_the_values_of_a_call(build):
    module, code = build(GRADIENT)
    assert "autograd" not in code
    torch.manual_seed(1)
    model = module.Model()
    x = torch.randn(3, 4, requires_grad=True)
    h = x @ model.w
    expected = torch.autograd.grad(torch.sum(torch.tanh(h) * h * h), x)[0]
    torch.testing.assert_close(model(x), expected)


def error(source: str) -> tuple:
    with pytest.raises(SourceError) as raised:
        compile_source(source, "model.lisp", Options())
    return raised.value.span.line, raised.value.span.col, raised.value.message


def test_misuses_are_located_diagnostics():
    two = "(defun two (x) [x (relu x)])\n"
    assert error(two + "(defun forward (x) (relu (two x)))") == (
        2,
        26,
        "this call of 'two' gives 2 values: bind them, as (let (([a b] (two ...))) ...)",
    )
    assert error(two + "(defun forward (x) (let (([a b c] (two x))) a))") == (
        2,
        35,
        "expected a for or a call giving 3 values to bind to a vector",
    )
    assert error("(defun forward (x) [x])") == (
        1,
        20,
        "a defun returns a vector of two or more values",
    )
    outside = two + ("(defun forward (x) (let (([a b] (two x))) (gradient (sum a) x)))")
    line, col, message = error(outside)
    assert (line, col) == (2, 33)
    assert message.startswith("this call of 'two' was traced outside the gradient form")


LOOP = """
(defmodel block (&key (d 4))
  (defparam w (normal [d d]))
  (defun forward (x)
    (let ((y (matmul x w)))
      [y (sum (* y y))])))
(defparam blocks (stack 3 (block :d 4)))
(defun run (x)
  (let (([h aux] (for (layer blocks) ((h x) (aux (sum x)))
                   (let (([y a] (layer h)))
                     [(relu y) (+ aux a)]))))
    (+ (sum h) aux)))
(defun forward (x) [(run x) (gradient (run x) x)])
"""


def test_a_loop_binds_its_layers_values_and_differentiates_them(build):
    module, code = build(LOOP)
    assert "y, a = layer(h)" in code
    torch.manual_seed(2)
    model = module.Model()
    x = torch.randn(2, 4, requires_grad=True)
    h, aux = x, x.sum()
    for block in model.blocks:
        y = h @ block.w
        h, aux = torch.relu(y), aux + (y * y).sum()
    expected = h.sum() + aux
    value, grad = model(x)
    torch.testing.assert_close(value, expected)
    torch.testing.assert_close(grad, torch.autograd.grad(expected, x)[0])


ISLAND = lisp("island-values").read_text()


@pytest.mark.parametrize("run", ["bf16", "f32"])
def test_an_island_gives_several_values_each_in_f32(build, run):
    """golden/island-values: a with-numerics that ends in [A B], bound in a let, and a
    defun that ends in one; under :f32 the same sums without the roundings."""
    source = ISLAND if run == "bf16" else ISLAND.replace(":bf16", ":f32")
    module, code = build(source, "island-values.lisp")
    assert "return mu, mean_x" in code
    torch.manual_seed(3)
    model = module.IslandValues()
    x = torch.randn(2, 5, 8)
    low = BF16 if run == "bf16" else torch.float32
    h = x.to(low) @ model.w.detach().to(low)
    hf = h.float()
    mu = hf.mean(-1, keepdim=True)
    var = ((hf - mu) * (hf - mu)).mean(-1, keepdim=True)
    scale, shift = torch.rsqrt(var + 1e-5), -mu
    expected = (h + shift.to(low)) * scale.to(low)
    got = model(x)
    assert got.dtype == low and torch.equal(got, expected)
    mu_got, var_got = model.moments(h)
    assert mu_got.dtype == var_got.dtype == torch.float32
    assert torch.equal(mu_got, mu) and torch.equal(var_got, var)
    interpreted = interpret.load(source, "island-values.lisp", state=model.state_dict())
    assert torch.equal(interpreted.evaluate("forward", [x]), got)


def test_an_island_of_several_values_must_be_bound():
    source = (
        "(defun forward (x)\n"
        "  (+ x (with-numerics (:sensitivity :high) [(exp x) (sin x)])))"
    )
    with pytest.raises(SourceError) as caught:
        compile_source(source, "model.lisp")
    assert "gives 2 values: bind them" in caught.value.message
    assert (caught.value.span.line, caught.value.span.col) == (2, 8)
