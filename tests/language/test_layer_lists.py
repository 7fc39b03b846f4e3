"""Lists of different models and per-layer choices (golden/layer-lists): `(sequential ...)`
and `(module-list ...)` keep torch's nn.Sequential and nn.ModuleList keys (`downsample.0.`),
`(if C (A ...) (B ...))` puts a dense MLP or a MoE under one key (`layers.N.mlp.`). The
module loads, strictly, the state_dict of the same model built with torch's own containers
and computes what it computes, in f32 and in bf16; the interpreter agrees; bad uses are
located diagnostics."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from cases import lisp
from conftest import load_module
from sx2torch import interpret
from sx2torch.compiler import Options, compile_source
from sx2torch.errors import SourceError

torch.set_num_threads(1)

SOURCE = lisp("layer-lists").read_text() + "\n(defrun exact :precision :f32)\n"


def compiled(run: str):
    return load_module(compile_source(SOURCE, "layer-lists.lisp", Options(run=run)))


class Norm(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(dim))
        self.bias = nn.Parameter(torch.randn(dim))

    def forward(self, x):
        return x * self.weight + self.bias


class Proj(nn.Module):
    def __init__(self, n_in: int, n_out: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_in, n_out) * 0.1)

    def forward(self, x):
        return x @ self.weight


class Cross(Proj):
    def __init__(self):
        super().__init__(8, 8)

    def forward(self, x, memory):
        return x + memory @ self.weight


class Dense(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = Proj(8, 16)
        self.down = Proj(16, 8)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


class Moe(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate = Proj(8, 2)
        self.experts = nn.ModuleList([Dense(), Dense()])

    def forward(self, x):
        p = torch.softmax(self.gate(x).float(), dim=-1).to(x.dtype)
        return p[..., :1] * self.experts[0](x) + p[..., 1:] * self.experts[1](x)


class Block(nn.Module):
    def __init__(self, dense: bool):
        super().__init__()
        self.layer = nn.ModuleList([Norm(8), Cross(), Norm(8)])
        self.mlp = Dense() if dense else Moe()

    def forward(self, x, memory):
        h = self.layer[1](self.layer[0](x), memory)
        return h + self.mlp(self.layer[2](h))


class Reference(nn.Module):
    """The golden model written with torch's nn.Sequential and nn.ModuleList."""

    def __init__(self, first_k_dense_replace=1, n_layer=3):
        super().__init__()
        self.downsample = nn.Sequential(Norm(4), Proj(4, 8))
        self.layers = nn.ModuleList(
            [Block(i < first_k_dense_replace) for i in range(n_layer)]
        )

    def forward(self, x, memory):
        h = self.downsample(x)
        for layer in self.layers:
            h = layer(h, memory)
        return h


def inputs():
    g = torch.Generator().manual_seed(1)
    return torch.randn(2, 5, 4, generator=g), torch.randn(2, 5, 8, generator=g)


@pytest.mark.parametrize("first", [1, 2, 0])
@pytest.mark.parametrize("run", ["exact", "train"])
def test_the_keys_are_torchs_and_the_module_computes_what_torchs_classes_compute(
    first, run
):
    torch.manual_seed(0)
    reference = Reference(first_k_dense_replace=first)
    model = compiled(run).LayerLists(first_k_dense_replace=first)
    assert list(model.state_dict()) == list(reference.state_dict())
    assert [type(m).__name__ for m in model.layers[0].layer] == [
        "Norm",
        "Cross",
        "Norm",
    ]
    assert isinstance(model.downsample, nn.Sequential)
    kinds = [type(layer.mlp).__name__ for layer in model.layers]
    assert kinds == ["DenseMlp" if i < first else "Moe" for i in range(3)]
    model.load_state_dict(reference.state_dict(), strict=True)
    x, memory = inputs()
    if run == "train":  # transformers' bf16 model: weights and inputs in bf16
        reference = reference.to(torch.bfloat16)
        x, memory = x.bfloat16(), memory.bfloat16()
    with torch.no_grad():
        got, want = model(x, memory), reference(x, memory)
    assert got.dtype == want.dtype
    assert torch.equal(got, want)


def test_the_interpreter_builds_the_lists_and_the_choice_and_agrees():
    torch.manual_seed(2)
    model = compiled("train").LayerLists(first_k_dense_replace=2)
    x, memory = inputs()
    interpreted = interpret.load(
        SOURCE,
        "layer-lists.lisp",
        run="train",
        consts={"first-k-dense-replace": 2},
        state=model.state_dict(),
    )
    with torch.no_grad():
        assert torch.equal(
            interpreted.evaluate("forward", [x, memory]), model(x, memory)
        )


def test_a_sequential_is_called_as_one_and_a_choice_once():
    code = compile_source(SOURCE, "layer-lists.lisp")
    assert "self.downsample = nn.Sequential(Norm(dim=4), Proj(in_=4, out=dim))" in code
    assert "nn.ModuleList([Norm(dim=dim), Cross(dim=dim), Norm(dim=dim)])" in code
    assert "h = self.downsample(x)" in code
    assert "h = self.layer[1](self.layer[0](x), memory)" in code
    assert (
        "if layer_idx < first_dense:\n            self.mlp = DenseMlp(dim=dim)" in code
    )
    assert "return h + self.mlp(layer)" in code


HEAD = """
(defmodel a (&key (d 4))
  (defparam w (ones [d]))
  (defun forward (x) (* x w)))
(defmodel b (&key (d 4))
  (defparam w (ones [d]))
  (defun forward (x y) (* x y)))
"""


@pytest.mark.parametrize(
    "body, where, message",
    [
        (
            "(defparam l (module-list (a) (b)))\n(defun forward (x) (nth l 2 x))",
            (9, 27),
            "index 2 is out of range for 'l', of 2 items",
        ),
        (
            "(defparam l (module-list (a) (b)))\n(defun forward (x &key (i 0)) (nth l i x))",
            (9, 38),
            "nth takes an index written as an integer here",
        ),
        (
            "(defparam l (module-list (a) (b)))\n(defun forward (x) (l x))",
            (9, 21),
            "'l' is a module-list: call one of its items, as (nth l 0 x)",
        ),
        (
            "(defparam l (sequential (a) (b)))\n(defun forward (x) (l x))",
            (9, 21),
            "item 1 of the sequential 'l' takes 2 arguments",
        ),
        (
            "(defparam l (sequential (a) (a)))\n(defun forward (x) (chain l x))",
            (9, 27),
            "'l' is a sequential of different models, not a stack: call (l x), or one item",
        ),
        (
            "(defparam l (sequential (a) (zeros [3])))\n(defun forward (x) (l x))",
            (8, 29),
            "sequential takes sub-model instances",
        ),
        (
            "(defconst k 1)\n(defparam l (if k (a) (b)))\n(defun forward (x) (l x))",
            (9, 17),
            "a choice of sub-models takes a condition on the consts",
        ),
        (
            "(defparam l (sequential (a) (a)))\n"
            "(defun forward (x) (gradient (sum (l x)) x))",
            (9, 36),
            "gradient through an item of 'l', a list or choice of sub-models",
        ),
        (
            "(defparam l (module-list (a) (c)))\n(defun forward (x) (nth l 0 x))",
            (8, 30),
            "unknown initializer or model 'c'",
        ),
    ],
)
def test_bad_lists_and_choices_are_located_diagnostics(body, where, message):
    with pytest.raises(SourceError) as raised:
        compile_source(HEAD + body, "bad.lisp")
    error = raised.value
    assert message in str(error)
    assert (error.span.line, error.span.col) == where


def test_a_choice_of_models_that_give_different_dtypes_is_a_diagnostic():
    source = HEAD + """
(defmodel c (&key (d 4))
  (defparam w (ones [d]))
  (defun forward (x) (with-numerics (:sensitivity :high) (* x w))))
(defmodel blk (&key (i 0))
  (defparam m (if (< i 1) (a) (c)))
  (defun forward (x) (m x)))
(defparam blocks (stack (i 2) (blk :i i)))
(defun forward (x) (chain blocks x))
(defrun train :precision :bf16)
"""
    with pytest.raises(SourceError) as raised:
        compile_source(source, "bad.lisp")
    assert "the models of the choice 'm' give values of different dtypes here" in str(
        raised.value
    )
    assert (raised.value.span.line, raised.value.span.col) == (14, 22)
