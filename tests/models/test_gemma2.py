"""examples/gemma2.lisp is Hugging Face transformers' Gemma2ForCausalLM: its state_dict (both
lm_head.weight and the model.embed_tokens.weight it is tied to) loads with strict=True, and
the logits are transformers' own under both runs, at two sequence lengths, one longer than
the sliding window.

transformers runs with attn_implementation="eager", the one Gemma 2 is meant to run with:
its attention logits are soft-capped, which F.scaled_dot_product_attention cannot do, so the
example writes the eager attention out as transformers does.
"""

from __future__ import annotations

import inspect

import pytest
import torch
from transformers import Gemma2Config, Gemma2ForCausalLM
from transformers.models.gemma2 import modeling_gemma2

from cases import GEMMA2, lisp
from conftest import adamw_losses, load_module
from sx2torch.compiler import Options, compile_source
from models.test_gpt2 import code_lines

SIZES = GEMMA2
DTYPES = {"exact": torch.float32, "train": torch.bfloat16}


def gemma2(run: str):
    path = lisp("gemma2")
    code = compile_source(path.read_text(), path.name, Options(run=run))
    return load_module(code).Gemma2


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """transformers' model with random weights in f32 (the norms' weights away from their
    zeros), and as from_pretrained(..., dtype=torch.bfloat16) loads it."""
    torch.manual_seed(0)
    config = Gemma2Config(**SIZES, attn_implementation="eager")
    f32 = Gemma2ForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in f32.named_parameters():
            if "norm" in name:
                p.normal_(0.0, 0.3)
    folder = tmp_path_factory.mktemp("gemma2")
    f32.save_pretrained(folder)
    bf16 = Gemma2ForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).eval()
    assert bf16.model.layers[0].mlp.up_proj.weight.dtype == torch.bfloat16
    assert bf16.lm_head.weight is bf16.model.embed_tokens.weight
    assert config.layer_types == ["sliding_attention", "full_attention"] * 1 + [
        "sliding_attention"
    ]
    return {"exact": f32, "train": bf16}


def test_the_layers_alternate_as_gemma2configs_layer_types():
    model = gemma2("exact")(**SIZES)
    assert [layer.self_attn.window for layer in model.model.layers] == [6, 0, 6]


@pytest.mark.parametrize("length", [16, 5])
@pytest.mark.parametrize("run", ["exact", "train"])
def test_the_real_checkpoint_loads_and_gives_the_real_logits(real, run, length):
    model = gemma2(run)(**SIZES)
    model.load_state_dict(real[run].state_dict(), strict=True)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    ids = torch.randint(
        0, 256, (2, length), generator=torch.Generator().manual_seed(length)
    )
    with torch.no_grad():
        got, want = model(ids), real[run](ids).logits
    assert got.dtype == want.dtype == DTYPES[run]
    assert got.shape == (2, length, 256)
    if run == "exact":  # the GEMMs' order of summation may differ at some shapes
        assert (got - want).abs().max() <= 1e-4
    else:
        assert torch.equal(got, want)


def test_it_trains_with_the_tied_weight_as_one():
    torch.manual_seed(1)
    model = gemma2("train")(**SIZES)
    ids = torch.randint(0, 256, (4, 16))
    targets = torch.roll(ids, -1, dims=1)
    losses = adamw_losses(model, ids, targets, steps=8)
    assert losses[-1] < 0.8 * losses[0]


def test_it_compiles_as_one_graph():
    torch.manual_seed(2)
    model = gemma2("train")(**SIZES)
    ids = torch.randint(0, 256, (2, 16))
    explained = torch._dynamo.explain(model)(ids)
    assert explained.graph_break_count == 0 and explained.graph_count == 1


MODEL_CLASSES = [
    "Gemma2RMSNorm",
    "Gemma2MLP",
    "Gemma2RotaryEmbedding",
    "Gemma2Attention",
    "Gemma2DecoderLayer",
    "Gemma2TextScaledWordEmbedding",
    "Gemma2Model",
    "Gemma2ForCausalLM",
]
FUNCTIONS = [
    "rotate_half",
    "apply_rotary_pos_emb",
    "repeat_kv",
    "eager_attention_forward",
]


def test_the_source_is_at_most_a_third_of_transformers_lines():
    """Counted as code lines (neither blank nor comments), the model classes of
    modeling_gemma2.py and the functions they call, docstrings included."""
    theirs = sum(
        code_lines(inspect.getsource(getattr(modeling_gemma2, name)))
        for name in MODEL_CLASSES + FUNCTIONS
    )
    ours = code_lines(lisp("gemma2").read_text())
    assert ours <= theirs / 3, (ours, theirs)
