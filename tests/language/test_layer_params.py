"""Layers that differ (golden/layer-params), 0-d lambdas (golden/zero-d-lambdas) and
row-wise initializers (golden/init-rows), against the same computations written in plain
PyTorch."""

from __future__ import annotations

import pytest
import torch

from cases import lisp
from conftest import load_module
from sx2torch.compiler import compile_source
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
