"""Formula initializers (golden/formula-inits): a fresh model's tables computed as
transformers computes them (Mamba's A_log, Whisper's sinusoidal positions), bit for bit;
the interpreter draws the same; bad formulas are located diagnostics."""

from __future__ import annotations

import math

import pytest
import torch

from cases import lisp
from conftest import load_module
from sx2torch import interpret
from sx2torch.compiler import compile_source
from sx2torch.errors import SourceError

torch.set_num_threads(1)
SOURCE = lisp("formula-inits").read_text()


def mamba_a_log(d_inner, d_state):
    """transformers' MambaMixer.__init__."""
    a = torch.arange(1, d_state + 1, dtype=torch.float32)[None, :]
    return torch.log(a.expand(d_inner, -1).contiguous())


def whisper_sinusoids(length, channels, max_timescale=10000):
    """transformers' models/whisper/modeling_whisper.py sinusoids()."""
    log_timescale_increment = math.log(max_timescale) / (channels // 2 - 1)
    inv_timescales = torch.exp(-log_timescale_increment * torch.arange(channels // 2))
    scaled_time = torch.arange(length).view(-1, 1) * inv_timescales.view(1, -1)
    return torch.cat([scaled_time.sin(), scaled_time.cos()], dim=1)


@pytest.mark.parametrize("config", [{}, {"d_inner": 3, "d_state": 7, "length": 9}])
def test_a_fresh_model_has_transformers_tables_bit_for_bit(config):
    module = load_module(compile_source(SOURCE, "formula-inits.lisp"))
    model = module.FormulaInits(**config)
    d_inner, d_state = config.get("d_inner", 6), config.get("d_state", 4)
    length, channels = config.get("length", 5), 8
    assert torch.equal(model.a_log.detach(), mamba_a_log(d_inner, d_state))
    assert torch.equal(model.positions, whisper_sinusoids(length, channels))
    assert torch.equal(model.decay.detach(), 1.0 - torch.arange(0, d_state) / d_state)
    consts = {k.replace("_", "-"): v for k, v in config.items()}
    interpreted = interpret.load(SOURCE, "formula-inits.lisp", consts=consts)
    x = torch.randn(d_inner, d_state)
    assert torch.equal(interpreted.evaluate("forward", [x]), model(x))


@pytest.mark.parametrize(
    "source, message, where",
    [
        (
            "(defparam w (* (arange 0 3) (ones [4])))",
            "*'s initializers must have one shape, got [3] and [4]",
            (1, 13),
        ),
        ("(defparam w (* 2 3))", "* of numbers alone is a number", (1, 13)),
        (
            "(defparam w (arange 5 2))",
            "arange's END must not be below its START",
            (1, 13),
        ),
        (
            "(defparam w (outer (ones [2 2]) (ones [2])))",
            "outer takes 1-D initializers",
            (1, 20),
        ),
        (
            "(defparam w (concat [(ones [2 3]) (ones [3 3])] :axis 1))",
            "concat's parts must agree in all sizes but axis 1's",
            (1, 35),
        ),
        ("(defparam w (log (ones [2]) 3))", "wrong number of arguments", (1, 13)),
    ],
)
def test_a_bad_formula_is_a_located_diagnostic(source, message, where):
    with pytest.raises(SourceError) as caught:
        compile_source(source + "\n(defun forward (x) (* x w))", "model.lisp")
    assert message in caught.value.message
    assert (caught.value.span.line, caught.value.span.col) == where


def test_a_function_of_numbers_in_a_formula_is_a_number():
    """`(log 10000)` among a formula's operands holds no initializer: a number, as Python's
    math computes it (Whisper's sinusoids() without a const of its increment)."""
    source = (
        "(defconst channels 8)\n"
        "(defparam w (* (arange 0 (// channels 2))"
        " (- 0.0 (/ (log 10000) (- (// channels 2) 1)))))\n"
        "(defun forward (x) (* x w))\n"
    )
    model = load_module(compile_source(source, "model.lisp")).Model(channels=10)
    increment = math.log(10000) / (10 // 2 - 1)
    assert torch.equal(model.w.detach(), -increment * torch.arange(10 // 2))
