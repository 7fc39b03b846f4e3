"""Non-persistent buffers (golden/buffer-persistent): `(defparam inv-freq INIT :trainable
false :persistent false)` is `self.register_buffer("inv_freq", INIT, persistent=False)`, as
transformers holds a rotary model's inv_freq: computed once when the module is built, moved
with it, out of state_dict, so a strict load of a checkpoint without it succeeds."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from cases import lisp
from conftest import load_module
from sx2torch import cli, interpret
from sx2torch.compiler import Options, compile_source
from sx2torch.errors import SourceError

SOURCE = lisp("buffer-persistent").read_text()


def rope_inv_freq(dim: int, base: float = 10000.0) -> torch.Tensor:
    """transformers' _compute_default_rope_parameters."""
    return 1.0 / (
        base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float) / dim)
    )


class Reference(nn.Module):
    """The plain PyTorch the golden case stands for."""

    def __init__(self, dim: int = 8):
        super().__init__()
        self.register_buffer("inv_freq", rope_inv_freq(dim), persistent=False)
        self.register_buffer("scale", torch.ones(dim).to(torch.bfloat16))


@pytest.fixture
def model():
    module = load_module(compile_source(SOURCE, "buffer-persistent.lisp"))
    return module.BufferPersistent()


@pytest.mark.parametrize("dim", [8, 6, 32])
def test_the_buffer_is_transformers_inv_freq_and_out_of_state_dict(dim):
    module = load_module(compile_source(SOURCE, "buffer-persistent.lisp"))
    rope = module.Rotary(dim=dim)
    assert rope.inv_freq.dtype == torch.float32
    assert torch.equal(rope.inv_freq, rope_inv_freq(dim))
    assert list(rope.state_dict()) == ["scale"]
    assert dict(rope.named_buffers()).keys() == {"inv_freq", "scale"}
    assert list(rope.parameters()) == []


def test_a_strict_load_of_a_state_dict_without_it_succeeds(model):
    state = {"rope.scale": torch.full((8,), 2.0)}
    model.load_state_dict(state, strict=True)
    assert torch.equal(model.rope.inv_freq, rope_inv_freq(8))
    with pytest.raises(RuntimeError, match="Unexpected key.*rope.inv_freq"):
        model.load_state_dict({**state, "rope.inv_freq": torch.zeros(4)}, strict=True)


@pytest.mark.parametrize(
    "to", [torch.float64, torch.bfloat16, torch.device("meta")], ids=str
)
def test_to_moves_and_casts_it_as_torch_does(model, to):
    reference = Reference().to(to)
    model.to(to)
    for name in ("inv_freq", "scale"):
        got, want = getattr(model.rope, name), getattr(reference, name)
        assert (got.dtype, got.device) == (want.dtype, want.device)


def test_the_interpreter_computes_it_and_agrees(model):
    model.load_state_dict({"rope.scale": torch.full((8,), 0.5)}, strict=True)
    interpreted = interpret.load(
        SOURCE, "buffer-persistent.lisp", state=model.state_dict()
    )
    assert list(interpreted.state_dict()) == list(model.state_dict())
    x = torch.randn(5, 8)
    assert torch.equal(interpreted("forward", x), model(x))


# keys that are nn.Module's own attributes, which register_buffer refuses: the module puts
# them in its store of buffers itself
ATTRIBUTE_KEYS = """\
(defparam training (arange 0 4) :trainable false :persistent false)
(defparam type (ones [4]) :trainable false)
(defun forward (x) (* (* x training) type))
(defrun train :precision :f32)
"""


def test_a_buffer_keyed_as_a_module_attribute_is_left_out_too():
    module = load_module(compile_source(ATTRIBUTE_KEYS, "m.lisp"))
    made = module.M()
    assert list(made.state_dict()) == ["type"]
    assert dict(made.named_buffers()).keys() == {"training", "type"}
    made.load_state_dict({"type": torch.full((4,), 2.0)}, strict=True)
    x = torch.randn(3, 4)
    assert torch.equal(made(x), x * torch.arange(0.0, 4.0) * 2.0)
    interpreted = interpret.load(ATTRIBUTE_KEYS, "m.lisp", state=made.state_dict())
    assert list(interpreted.state_dict()) == ["type"]
    assert torch.equal(interpreted("forward", x), made(x))


def test_explain_lists_it_as_not_in_state_dict(capsys):
    path = str(lisp("buffer-persistent"))
    assert cli.main(["explain", path, "--json"]) == 0
    rows = {p["name"]: p for p in json.loads(capsys.readouterr().out)["params"]}
    assert (rows["rope.inv_freq"]["persistent"], rows["rope.scale"]["persistent"]) == (
        False,
        True,
    )
    assert rows["rope.inv_freq"]["dtype"] == "f32"
    assert cli.main(["explain", path]) == 0
    assert "f32 (frozen, not in state_dict)" in capsys.readouterr().out


def test_arange_takes_a_step():
    source = "(defparam w (arange 1 8 3) :trainable false)\n(defun forward (x) (* x w))"
    model = load_module(compile_source(source, "model.lisp")).Model()
    assert torch.equal(model.w, torch.arange(1, 8, 3, dtype=torch.float32))
    interpreted = interpret.load(source)
    x = torch.randn(3)
    assert torch.equal(interpreted("forward", x), model(x))


WHERE = (
    "(defmodel lin (&key (n 2)) (defparam weight (ones [n n])) (defun forward (x) x))\n"
)


@pytest.mark.parametrize(
    "source, message, where",
    [
        (
            "(defparam w (arange 0 4) :persistent false)",
            "'w' is trained: :persistent false is for a frozen buffer",
            (1, 38),
        ),
        (
            "(defparam w (* (normal [4]) 2.0) :trainable false :persistent false)",
            "'w' is drawn at random: a buffer out of state_dict",
            (1, 63),
        ),
        (
            "(defparam w (lin :n 2) :persistent false)",
            "a sub-model parameter takes no :numerics, :trainable, :persistent",
            (1, 24),
        ),
        (
            "(defparam w (arange 0 4 0) :trainable false :persistent false)",
            "arange's STEP must be positive, got 0",
            (1, 25),
        ),
        (
            "(defparam w (arange 0 4) :trainable false :persistent false)\n"
            "(defparam v (arange 0 4))\n(tie v w)",
            "'w' cannot be tied: a tie joins trained parameters",
            (3, 8),
        ),
    ],
)
def test_a_misplaced_persistent_is_a_located_diagnostic(source, message, where):
    text = WHERE + source + "\n(defun forward (x) (* x w))"
    with pytest.raises(SourceError) as caught:
        compile_source(text, "model.lisp", Options())
    assert caught.value.message.startswith(message), caught.value.message
    assert (caught.value.span.line - 1, caught.value.span.col) == where
