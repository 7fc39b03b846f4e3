"""examples/vit.lisp is Hugging Face transformers' ViTModel: its state_dict loads with
strict=True, and forward(pixel_values) gives the tuple (last_hidden_state, pooler_output),
transformers' own, under both runs.

transformers runs with attn_implementation="sdpa", its default: without a mask it calls
F.scaled_dot_product_attention(q, k, v, attn_mask=None, scale=head_dim ** -0.5,
is_causal=False), the call the example's `(attention q k v)` makes (the kernel's default
scale is the same f32 number; tests/models/test_llama.py checks that for every head size).
"""

from __future__ import annotations

import pytest
import torch
from transformers import ViTConfig, ViTModel

from cases import lisp
from conftest import load_module
from sx2torch.compiler import Options, compile_source

SIZES = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=128,
    image_size=32,
    patch_size=8,
    num_channels=3,
)


def vit(run: str):
    path = lisp("vit")
    code = compile_source(path.read_text(), path.name, Options(run=run))
    return load_module(code).Vit


def pixels(seed: int, batch: int = 2, size: int = 32):
    return torch.randn(
        batch, 3, size, size, generator=torch.Generator().manual_seed(seed)
    )


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """transformers' model with random weights in f32, and as from_pretrained(...,
    dtype=torch.bfloat16) loads it."""
    torch.manual_seed(0)
    f32 = ViTModel(ViTConfig(**SIZES, attn_implementation="sdpa")).eval()
    folder = tmp_path_factory.mktemp("vit")
    f32.save_pretrained(folder)
    bf16 = ViTModel.from_pretrained(folder, dtype=torch.bfloat16).eval()
    assert bf16.embeddings.patch_embeddings.projection.weight.dtype == torch.bfloat16
    return {"exact": f32, "train": bf16}


def outputs(model, x):
    with torch.no_grad():
        return model(x)


@pytest.mark.parametrize("run", ["exact", "train"])
def test_the_real_checkpoint_loads_and_gives_the_real_outputs(real, run):
    model = vit(run)(**SIZES)
    model.load_state_dict(real[run].state_dict(), strict=True)
    x = pixels(1)
    got = outputs(model, x)
    theirs = outputs(real[run], x)
    want = (theirs.last_hidden_state, theirs.pooler_output)
    dtype = torch.float32 if run == "exact" else torch.bfloat16
    assert isinstance(got, tuple) and len(got) == 2
    assert [t.shape for t in got] == [(2, 17, 64), (2, 64)]
    for mine, reference in zip(got, want):
        assert mine.dtype == reference.dtype == dtype
        if run == "exact":
            assert (mine - reference).abs().max() <= 1e-4
        assert torch.equal(mine, reference)


def test_the_constructor_takes_vit_configs_names():
    """No qkv bias, another patch size and pooler width reach the layers as in transformers."""
    options = dict(
        SIZES, qkv_bias=False, patch_size=4, pooler_output_size=48, layer_norm_eps=1e-6
    )
    torch.manual_seed(3)
    real = ViTModel(ViTConfig(**options, attn_implementation="sdpa")).eval()
    model = vit("exact")(**options)
    model.load_state_dict(real.state_dict(), strict=True)
    assert "layers.0.attention.q_proj.bias" not in model.state_dict()
    assert model.embeddings.position_embeddings.shape == (1, 65, 64)
    x = pixels(2)
    got, theirs = outputs(model, x), outputs(real, x)
    assert torch.equal(got[0], theirs.last_hidden_state)
    assert torch.equal(got[1], theirs.pooler_output)
    assert got[1].shape == (2, 48)


def test_it_trains():
    torch.manual_seed(1)
    model = vit("train")(**SIZES)
    x, target = pixels(4, batch=4), torch.randn(4, 64)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(8):
        optimizer.zero_grad()
        loss = ((model(x)[1].float() - target) ** 2).mean()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0]


def test_it_compiles_as_one_graph():
    torch.manual_seed(2)
    model = vit("train")(**SIZES)
    x = pixels(5)
    # fullgraph: a graph break is an error, so this is the one graph
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    for mine, eager in zip(compiled(x), model(x)):
        assert torch.equal(mine, eager)


def test_the_source_is_at_most_75_lines_of_code():
    """transformers' ViTModel is 247 lines of modeling_vit.py without comments and docstrings
    (its embeddings' bicubic interpolation, mask token, eager attention and init included).
    """
    lines = lisp("vit").read_text().splitlines()
    code = [
        line for line in lines if line.strip() and not line.lstrip().startswith(";")
    ]
    assert len(code) <= 75
