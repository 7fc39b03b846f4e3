"""Everyday model code, each construct against plain PyTorch: state_dict keys kept exactly,
integer positions, masks, tied and deep reads, several return values, arithmetic, and the
small ops a port needs."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from cases import lisp
from sx2torch.compiler import Options, compile_source
from sx2torch.errors import SourceError


def error(source: str) -> tuple:
    """(line, col, message) of the diagnostic compiling `source` gives."""
    with pytest.raises(SourceError) as raised:
        compile_source(source, "model.lisp", Options())
    return raised.value.span.line, raised.value.span.col, raised.value.message


def test_state_dict_keys_are_the_source_names_even_keywords(build):
    module, code = build(lisp("exact-keys").read_text(), "exact-keys.lisp")

    class Self(nn.Module):
        def __init__(self):
            super().__init__()
            self.input = nn.Parameter(torch.randn(4, 4))
            self._buffers["type"] = torch.randn(4)

    plain = nn.Module()
    plain.register_parameter("class", nn.Parameter(torch.randn(4, 4)))
    plain.add_module("lambda", Self())
    plain._modules["type"] = nn.ModuleList(
        [Self(), Self()]
    )  # nn.Module.type is a method
    plain.self = nn.Parameter(torch.randn(4))
    model = module.ExactKeys()
    assert sorted(model.state_dict()) == sorted(plain.state_dict())
    model.load_state_dict(plain.state_dict(), strict=True)
    x = torch.randn(3, 4)
    h = x @ getattr(plain, "class")
    for sub in (getattr(plain, "lambda"), *plain._modules["type"]):
        h = h @ sub.input + sub._buffers["type"]
    assert torch.equal(model(x), plain.self * h)


def test_two_parameters_with_one_key_are_a_diagnostic():
    source = (
        "(defparam a-b (zeros [3]))\n(defparam a_b (ones [3]))\n(defun forward (x) x)"
    )
    assert error(source) == (
        2,
        11,
        "'a_b' and 'a-b' (line 1) would both have the state_dict key 'a_b': rename one",
    )


def test_a_top_level_defun_is_seen_by_every_model(build):
    module, _ = build(lisp("shared-defuns").read_text(), "shared-defuns.lisp")
    torch.manual_seed(0)
    model = module.SharedDefuns()
    x = torch.randn(3, 4)

    def gelu_new(v):  # transformers' NewGELUActivation
        return 0.5 * v * (1.0 + torch.tanh(0.7978845608 * (v + 0.044715 * v * v * v)))

    h = x
    for block in model.blocks:
        h = gelu_new(gelu_new(h @ block.w))
    assert torch.equal(model(x), gelu_new(h))


SHARED = """(defconst scale 2.0)
(defparam w (ones [4]))
(defun helper (x) (* x {}))
(defmodel block (&key (d 4)) (defun forward (x) (helper x)))
(defparam b (block))
(defun forward (x) (b x))
"""


@pytest.mark.parametrize("read", ["scale", "w"])
def test_a_top_level_defun_reading_the_top_model_is_out_of_reach_in_a_sub_model(read):
    assert error(SHARED.format(read)) == (
        3,
        24,
        f"'{read}' is out of reach in 'helper': a top-level defun called from model "
        "'block' sees only its arguments, its let locals and other top-level defuns; "
        "pass it as an argument",
    )


def test_a_defun_of_another_model_is_named_as_out_of_reach():
    source = """(defmodel a (&key (d 4)) (defun f (x) x) (defun forward (x) (f x)))
(defmodel b (&key (d 4)) (defun forward (x) (f x)))
(defparam m (b))
(defun forward (x) (m x))"""
    assert error(source) == (
        2,
        46,
        "unknown op or function 'f': it is a defun of model 'a', out of reach in 'b'; "
        "a defun written at the top level is seen by every model",
    )


def test_arithmetic_as_people_write_it(build):
    module, _ = build(lisp("arithmetic").read_text(), "arithmetic.lisp")
    model = module.Arithmetic(n_layer=5)
    assert [layer.window for layer in model.layers] == [16, 2, 16, 6, 16]
    x = torch.randn(3, 4, dtype=torch.float64)
    chained = x * 16 * 2 * 16 * 6 * 16
    odd = x * 2 * 6
    expected = chained - x**2.0 - x**3 - odd * math.log(2.0) - 5**0.5
    assert torch.equal(model(x), expected)


def test_a_function_of_a_const_other_than_the_const_functions_is_a_diagnostic():
    """int, floor, ceil, log, exp and sqrt of a const are computed where the module is
    built (tests/language/test_const_math.py); tanh is not one of them."""
    assert error("(defconst n 4)\n(defun forward (x) (* x (tanh n)))") == (
        2,
        25,
        "'tanh' of a const is not known when the file compiles: "
        "write it with + - * / ** int floor ceil log exp sqrt on the const, or on a tensor",
    )


@pytest.mark.parametrize("run, dtype", [("train", torch.bfloat16), ("exact", None)])
def test_fused_layer_norm_and_tanh_gelu_are_torch_calls_bit_for_bit(build, run, dtype):
    module, _ = build(
        lisp("fused-layer-norm").read_text(), "fused-layer-norm.lisp", run
    )
    model = module.FusedLayerNorm()
    with torch.no_grad():
        model.ln_w.normal_()
        model.ln_b.normal_()
    x = torch.randn(2, 5, 8)
    w, b, h = model.ln_w, model.ln_b, x
    if dtype is not None:  # as the bf16 module does: everything it reads in bf16
        w, b, h = w.to(dtype), b.to(dtype), x.to(dtype)
    expected = F.gelu(F.layer_norm(h, (8,), w, b, eps=1e-5), approximate="tanh")
    got = model(x)
    assert got.dtype == expected.dtype and torch.equal(got, expected)


@pytest.mark.parametrize("length", [3, 8])
def test_learned_positions_for_any_length(build, length):
    module, _ = build(lisp("positions").read_text(), "positions.lisp")
    model = module.Positions()
    ids = torch.randint(0, 10, (2, length))
    wte, wpe = model.wte.to(torch.bfloat16), model.wpe.to(torch.bfloat16)
    expected = (wte[ids] + wpe[torch.arange(length)]) / length
    got = model(ids)
    assert got.dtype == torch.bfloat16 and torch.equal(got, expected)


def test_attention_takes_a_padding_mask_as_one_sdpa_call(build):
    module, code = build(lisp("attention-mask").read_text(), "attention-mask.lisp")
    assert code.count("F.scaled_dot_product_attention(") == 3
    model = module.AttentionMask()
    q, k, v = (torch.randn(2, 3, 5, 4) for _ in range(3))
    attention_mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    keep = attention_mask.reshape(2, 1, 1, 5) > 0.5
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    i, j = torch.arange(5)[:, None], torch.arange(5)[None, :]
    window = (i - j >= 0) & (i - j <= 2)
    sdpa = F.scaled_dot_product_attention
    additive = torch.zeros(2, 1, 1, 5).masked_fill(~keep, float("-inf"))
    expected = {
        "padded": sdpa(q, k, v, attn_mask=keep),
        "causal": sdpa(q, k, v, attn_mask=additive.masked_fill(~causal, -torch.inf)),
        "windowed": sdpa(q, k, v, attn_mask=keep & window),
    }
    for name, value in expected.items():
        got = getattr(model, name)(q, k, v, attention_mask)
        assert got.dtype == torch.float32 and torch.equal(got, value), name
    # the padded keys get no weight: as attention over the first three keys alone
    short = sdpa(q[1:], k[1:, :, :3], v[1:, :, :3], is_causal=False)
    torch.testing.assert_close(model.padded(q, k, v, attention_mask)[1:], short)


def test_infinities_are_literals(build):
    module, code = build("(defun forward (x) (maximum (minimum x inf) -inf))")
    assert "torch.inf" in code
    x = torch.tensor([float("-inf"), 0.0, float("inf")])
    assert torch.equal(module.Model()(x), x)
