"""examples/gpt2.lisp is Hugging Face transformers' GPT2LMHeadModel: its state_dict (both
lm_head.weight and the transformer.wte.weight it is tied to) loads with strict=True, and the
logits are transformers' own under both runs, at two sequence lengths.

transformers runs with attn_implementation="sdpa", its default: with no padding mask it calls
F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=head_dim ** -0.5), the call the
example's `(attention ... :causal true)` makes.
"""

from __future__ import annotations

import inspect

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel
from transformers.models.gpt2 import modeling_gpt2

from cases import GPT2, lisp
from conftest import adamw_losses, load_module
from sx2torch.compiler import Options, compile_source

SIZES = GPT2
DTYPES = {"exact": torch.float32, "train": torch.bfloat16}


def gpt2(run: str):
    path = lisp("gpt2")
    code = compile_source(path.read_text(), path.name, Options(run=run))
    return load_module(code).Gpt2


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """transformers' model with random weights in f32, and as from_pretrained(...,
    dtype=torch.bfloat16) loads it."""
    torch.manual_seed(0)
    config = GPT2Config(**SIZES, attn_implementation="sdpa")
    f32 = GPT2LMHeadModel(config).eval()
    with torch.no_grad():  # LayerNorms and biases away from their ones and zeros
        for name, p in f32.named_parameters():
            if "ln_" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    folder = tmp_path_factory.mktemp("gpt2")
    f32.save_pretrained(folder)
    bf16 = GPT2LMHeadModel.from_pretrained(folder, dtype=torch.bfloat16).eval()
    assert bf16.transformer.h[0].mlp.c_fc.weight.dtype == torch.bfloat16
    assert bf16.lm_head.weight is bf16.transformer.wte.weight
    return {"exact": f32, "train": bf16}


def test_the_checkpoint_has_both_tied_keys(real):
    state = real["exact"].state_dict()
    assert "lm_head.weight" in state and "transformer.wte.weight" in state
    model = gpt2("exact")(**SIZES)
    assert list(model.state_dict()) == list(state)


@pytest.mark.parametrize("length", [32, 11])
@pytest.mark.parametrize("run", ["exact", "train"])
def test_the_real_checkpoint_loads_and_gives_the_real_logits(real, run, length):
    model = gpt2(run)(**SIZES)
    model.load_state_dict(real[run].state_dict(), strict=True)
    assert model.lm_head.weight is model.transformer.wte.weight
    ids = torch.randint(
        0, 256, (2, length), generator=torch.Generator().manual_seed(length)
    )
    with torch.no_grad():
        got, want = model(ids), real[run](ids).logits
    assert got.dtype == want.dtype == DTYPES[run]
    assert got.shape == (2, length, 256)
    if run == "exact":
        assert (got - want).abs().max() <= 1e-4
    assert torch.equal(got, want)


def test_the_constructor_takes_gpt2_configs_names():
    """n_inner and layer_norm_epsilon reach the layers as they reach transformers'."""
    options = dict(SIZES, n_inner=96, layer_norm_epsilon=1e-3)
    torch.manual_seed(3)
    real = GPT2LMHeadModel(GPT2Config(**options, attn_implementation="sdpa")).eval()
    model = gpt2("exact")(**options)
    model.load_state_dict(real.state_dict(), strict=True)
    assert model.transformer.h[1].mlp.c_fc.weight.shape == (64, 96)
    assert model.transformer.h[0].ln_1.eps == 1e-3
    ids = torch.randint(0, 256, (2, 9))
    with torch.no_grad():
        assert (model(ids) - real(ids).logits).abs().max() <= 1e-4


def test_a_longer_input_than_n_positions_fails_as_transformers_does(real):
    model = gpt2("exact")(**SIZES)
    with pytest.raises(IndexError):
        model(torch.zeros(1, 33, dtype=torch.long))


def test_it_trains_with_the_tied_weight_as_one():
    torch.manual_seed(1)
    model = gpt2("train")(**SIZES)
    ids = torch.randint(0, 256, (4, 32))
    targets = torch.roll(ids, -1, dims=1)
    losses = adamw_losses(model, ids, targets, steps=8)
    assert losses[-1] < 0.8 * losses[0]
    state = model.state_dict()
    assert torch.equal(state["lm_head.weight"], state["transformer.wte.weight"])


def test_it_compiles_as_one_graph():
    torch.manual_seed(2)
    model = gpt2("train")(**SIZES)
    ids = torch.randint(0, 256, (2, 16))
    # fullgraph: a graph break is an error, so this is the one graph
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(ids), model(ids))


def code_lines(text: str) -> int:
    return sum(
        1
        for line in text.splitlines()
        if line.strip() and not line.lstrip().startswith(("#", ";"))
    )


MODEL_CLASSES = [
    "GPT2Attention",
    "GPT2MLP",
    "GPT2Block",
    "GPT2Model",
    "GPT2LMHeadModel",
]


def test_the_source_is_at_most_a_third_of_transformers_lines():
    """Counted as code lines (neither blank nor comments), the model classes of
    modeling_gpt2.py and the attention function they call, docstrings included."""
    theirs = sum(
        code_lines(inspect.getsource(getattr(modeling_gpt2, name)))
        for name in MODEL_CLASSES + ["eager_attention_forward"]
    )
    ours = code_lines(lisp("gpt2").read_text())
    assert ours <= theirs / 3, (ours, theirs)
