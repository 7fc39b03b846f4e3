"""Initializers at the edges of what torch accepts: they build, with the values torch gives."""

from __future__ import annotations

import math

import pytest
import torch

from sx2torch import interpret, resolve
from sx2torch.errors import SourceError
from sx2torch.ops import initializers
from sx2torch.ops.initializers import INITIALIZERS
from sx2torch.syntax import read


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


def test_an_empty_shape_is_a_0_d_tensor(build):
    source = (
        "(defparam z (zeros []))\n(defparam o (ones []))\n(defparam f (full [] 2.5))\n"
        "(defparam n (normal [] :std 0))\n(defparam u (uniform [] :low 3 :high 3))\n"
        "(defun forward (x) (+ x z o f n u))\n"
    )
    module, code = build(source)
    assert "torch.zeros(())" in code and "torch.empty(()).uniform_(3.0, 3.0)" in code
    model = module.Model()
    for name, value in [("z", 0.0), ("o", 1.0), ("f", 2.5), ("n", 0.0), ("u", 3.0)]:
        tensor = getattr(model, name)
        assert tensor.shape == () and tensor.dtype == torch.float32, name
        assert tensor.item() == value, name
    x = torch.arange(3.0)
    assert torch.equal(model(x), x + 6.5)


def test_every_initializer_is_one_entry_whose_sizes_are_the_tensors_it_builds(build):
    """Each kind of initializer, alone and as a part: the sizes its entry gives (which the
    rank check and explain read) are the shape of the tensor its emission builds."""
    forms = {
        "zeros": "(zeros [2 3])",
        "ones": "(ones [4])",
        "full": "(full [2 2] 1.5)",
        "normal": "(normal [3 2] :std 0.5)",
        "uniform": "(uniform [5])",
        "kaiming-uniform": "(kaiming-uniform [3 2 2] :a 0.5)",
        "fan-in-uniform": "(fan-in-uniform [3] :fan-in 5)",
        "eye": "(eye 3)",
        "linspace": "(linspace 4 :end 2)",
        "concat": "(concat [(eye 2) (zeros [1 2])])",
        "repeat": "(repeat 3 (linspace 2))",
        "pow": "(pow 2 (eye 2))",
        "tensor": "(tensor [0.5 1 2])",
        "arange": "(arange 1 4)",
        "outer": "(outer (arange 0 2) (ones [3]))",
        "log": "(log (arange 1 3))",
        "exp": "(exp (zeros [2 1]))",
        "sin": "(sin (eye 2))",
        "cos": "(cos (eye 3))",
        "sqrt": "(sqrt (ones [1 2]))",
        "arithmetic": "(* (arange 0 5) 2.0)",
    }
    assert set(forms) == set(INITIALIZERS)
    source = "".join(f"(defparam {k} {v})\n" for k, v in forms.items())
    source += "(defun forward (x) x)\n"
    module, _ = build(source)
    model = module.Model()
    program = resolve.run(read.run(source), "model")
    for name, param in program.top.params.items():
        expected = tuple(s.value for s in initializers.sizes(param.init))
        assert getattr(model, name.replace("-", "_")).shape == expected, name
    assert torch.equal(model.pow, 2.0 ** torch.eye(2))
    assert torch.equal(model.repeat, torch.tensor([0.0, 1.0] * 3))


def test_kaiming_and_fan_in_uniform_draw_torchs_default_weights_and_bias(build):
    """(kaiming-uniform SHAPE :a (sqrt 5)) is nn.Linear's and nn.Conv2d's default weight,
    torch's own nn.init.kaiming_uniform_, and (fan-in-uniform SHAPE :fan-in N) their
    default bias, bounded by 1 / math.sqrt(N) written as torch writes it: at N = 5579,
    1 / N ** 0.5 (a const's sqrt) is another double (the two round to one float32, which
    an f32 draw reads). The same seed draws the same bits (the interpreter's too)."""
    assert 1 / 5579**0.5 != 1 / math.sqrt(5579)
    source = (
        "(defconst n 5579)\n"
        "(defparam weight (kaiming-uniform [7 n] :a (sqrt 5)))\n"
        "(defparam bias (fan-in-uniform [7] :fan-in n))\n"
        "(defparam kernel (kaiming-uniform [6 4 3 3] :a (sqrt 5)))\n"
        "(defun forward (x) (linear x weight bias))\n"
    )
    module, code = build(source)
    assert "nn.init.kaiming_uniform_(torch.empty(7, n), a=math.sqrt(5))" in code
    assert "nn.init.uniform_(torch.empty(7), -1 / math.sqrt(n), 1 / math.sqrt(n))" in code
    torch.manual_seed(0)
    model = module.Model()
    torch.manual_seed(0)
    interpreted = interpret.load(source).state_dict()
    torch.manual_seed(0)
    linear = torch.nn.Linear(5579, 7)
    conv = torch.nn.Conv2d(4, 6, 3, bias=False)
    for got in (dict(model.named_parameters()), interpreted):
        assert torch.equal(got["weight"], linear.weight)
        assert torch.equal(got["bias"], linear.bias)
        assert torch.equal(got["kernel"], conv.weight)


def test_fan_in_uniform_needs_a_positive_fan_in():
    source = "(defparam b (fan-in-uniform [3] :fan-in 0))\n(defun forward (x) x)\n"
    with pytest.raises(SourceError) as raised:
        resolve.run(read.run(source), "model")
    assert ":fan-in must be positive, got 0" in str(raised.value)
    assert (raised.value.span.line, raised.value.span.col) == (1, 41)
