"""Layers that differ (golden/layer-params), a value the first layer computes for the
others (golden/carried-none), 0-d lambdas (golden/zero-d-lambdas) and
row-wise initializers (golden/init-rows), against the same computations written in plain
PyTorch."""

from __future__ import annotations

import re

import pytest
import torch

from cases import lisp
from conftest import load_module
from sx2torch import interpret
from sx2torch.compiler import Options, compile_source
from sx2torch.errors import SourceError


def compiled(name: str):
    path = lisp(name)
    return load_module(compile_source(path.read_text(), path.name))


def test_a_when_parameter_exists_only_on_the_layers_that_meet_its_condition():
    model = compiled("layer-params").LayerParams(n_layer=5)
    keys = [k for k in model.state_dict() if k.endswith(".gate")]
    assert keys == ["layers.0.gate", "layers.3.gate"]
    assert [layer.index for layer in model.layers] == [0, 1, 2, 3, 4]


def test_per_layer_inputs_are_chosen_by_the_layer_index():
    torch.manual_seed(0)
    model = compiled("layer-params").LayerParams()
    with torch.no_grad():
        for layer in model.layers:
            if hasattr(layer, "gate"):
                layer.gate.normal_()
    x, ids = torch.randn(3, 8), torch.tensor([1, 4, 9])
    h = x
    for i, layer in enumerate(model.layers):
        h = h @ layer.w
        if i in (0, 3):
            h = h + layer.gate * model.extras[0 if i == 0 else 1].weight[ids]
    assert torch.equal(model(x, ids), h)


def test_a_0d_lambda_is_read_as_it_is_and_its_product_is_bf16():
    torch.manual_seed(1)
    model = compiled("zero-d-lambdas").ZeroDLambdas()
    with torch.no_grad():  # 1 + 2^-8 + 2^-10 is not a bf16 number: bf16 rounds it up
        model.lambdas.copy_(torch.tensor([0.0, 1 + 2**-8 + 2**-10, 0.5, 1.0, 0.5, 1.0]))
    ids = torch.arange(10)[None]
    lambdas, weight = model.lambdas, model.head.weight
    x = weight[ids]
    x = (lambdas[0] + lambdas[1]) * x + torch.sigmoid(lambdas[2]) * x
    expected = torch.nn.functional.linear(x, weight)
    got = model(ids)
    assert got.dtype == torch.bfloat16 and torch.equal(got, expected)
    # the lambdas are read as they are: torch decides how a 0-d f32 tensor meets bf16
    path = lisp("zero-d-lambdas")
    code = compile_source(path.read_text(), path.name)
    assert "(self.lambdas[0] + self.lambdas[1]) * x" in code
    assert "torch.sigmoid(self.lambdas[2]) * x" in code


def test_row_wise_initializers():
    torch.manual_seed(2)
    model = compiled("init-rows").InitRows(d=8)
    qkvo = model.qkvo.detach()
    assert qkvo.shape == (32, 8) and torch.equal(qkvo[24:], torch.zeros(8, 8))
    bound = 3**0.5 * 8**-0.5
    assert qkvo[:24].abs().max() <= bound and qkvo[:24].abs().min() > 0
    assert torch.equal(model.pairs.detach(), torch.tensor([0.5, 1.0] * 16))


@pytest.mark.parametrize(
    "source, message",
    [
        (
            "(defparam w (ones [2]) :when 3)\n(defun forward (x) (* x w))",
            ":when takes a condition",
        ),
        (
            "(defparam w (ones [2]))\n(defun forward (x) (nth w 0 x))",
            "'w' is not a stack",
        ),
        (
            "(defconst c true)\n(defun forward (x) (if c none none))",
            "a none branch chooses a tensor",
        ),
        (
            "(defparam w (concat [(ones [2 3]) (ones [2 2])]))\n(defun forward (x) (* x w))",
            "concat's parts must agree in all sizes but the first",
        ),
    ],
)
def test_diagnostics(source, message):
    with pytest.raises(SourceError, match=message):
        compile_source(source, "model.lisp")


@pytest.mark.parametrize("target", ["cuda", "metal"])
def test_a_carried_value_may_start_as_none(target):
    """golden/carried-none: the first layer computes the shared value from its table and
    the loop carries it to the others, starting as None, as T5's position bias; the
    layer's one method casts it at entry where it is a tensor."""
    path = lisp("carried-none")
    code = compile_source(path.read_text(), path.name, Options(target=target))
    assert "shared = None\n" in code
    torch.manual_seed(0)
    model = load_module(code).CarriedNone()
    x = torch.randn(2, 4)
    with torch.no_grad():
        h, shared = x.to(torch.bfloat16), None
        for i, layer in enumerate(model.layers):
            if i == 0:
                shared = layer.table.to(torch.bfloat16) * 2.0
            h = h + (h @ layer.w.to(torch.bfloat16)) * shared
        got = model(x)
    assert torch.equal(got.float(), h.float())
    interpreted = interpret.load(path.read_text(), state=model.state_dict())
    assert torch.equal(interpreted.evaluate("forward", [x]), h)


@pytest.mark.parametrize(
    "carried, message",
    [
        ("((shared none))", "a loop carries a tensor: not only none"),
        (
            "((h x) (shared none))",
            "a gradient through a loop whose carried value starts as none",
        ),
    ],
)
def test_a_none_start_is_refused_where_nothing_can_use_it(carried, message):
    source = lisp("carried-none").read_text().replace("((h x) (shared none))", carried)
    source = source.replace(
        "(defrun", "(defun grad (x) (gradient (sum (forward x)) x))\n(defrun"
    )
    with pytest.raises(SourceError, match=re.escape(message)) as raised:
        compile_source(source, "m.lisp")
    assert raised.value.span.line == 16


NONE_BIAS = (
    "(defconst has-bias true)\n"
    "(defparam w (normal [4 4]))\n"
    "(defparam bias (normal [4]) :when has-bias)\n"
    "(defun forward (x) (linear x w (if has-bias bias none)))\n"
    "(defrun train :precision :bf16)\n"
)


@pytest.mark.parametrize("target", ["cuda", "cpu"])
@pytest.mark.parametrize("has_bias", [True, False])
def test_a_bf16_read_of_a_parameter_or_none_casts_the_parameter_only(target, has_bias):
    """`(if C param none)` read by a bf16 op: the cast is written inside the branch,
    `self.bias.to(torch.bfloat16) if self.has_bias else None`, so the module runs with C
    false too (it cast None, an AttributeError) and computes F.linear's bf16 value."""
    code = compile_source(NONE_BIAS, "model.lisp", Options(target=target))
    torch.manual_seed(0)
    model = load_module(code).Model(has_bias=has_bias)
    x = torch.randn(3, 4)
    bias = model.bias.bfloat16() if has_bias else None
    want = torch.nn.functional.linear(x.bfloat16(), model.w.bfloat16(), bias)
    with torch.no_grad():
        got = model(x)
    if target == "cpu":  # held: the f32 kernel on the rounded values, rounded once
        bias = bias.float() if has_bias else None
        want = torch.nn.functional.linear(
            x.bfloat16().float(), model.w.bfloat16().float(), bias
        ).bfloat16()
    assert torch.equal(got.bfloat16(), want)
    interpreted = interpret.load(
        NONE_BIAS, run="train", consts={"has-bias": has_bias}, state=model.state_dict()
    )
    with torch.no_grad():
        assert torch.equal(interpreted.evaluate("forward", [x]).bfloat16(), want)
