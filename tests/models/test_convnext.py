"""examples/convnext.lisp is Hugging Face transformers' ConvNextModel: its state_dict loads
with strict=True, no key renamed (the stages' downsampling_layer.0./.1. included), and
forward(pixel_values) gives the tuple (last_hidden_state, pooler_output), transformers' own,
bit for bit under :f32 and under :bf16 against transformers run in bf16 (as
from_pretrained(..., dtype=torch.bfloat16) loads it), at two image sizes.

The bits are equal by construction: each generated op is the torch call transformers
makes on the same bf16 tensors (F.conv2d, F.layer_norm on the permuted channels, F.linear,
F.gelu, the layer scale's product, the residual sum and torch.mean), so the same kernel
computes each on the same host.
"""

from __future__ import annotations

import pytest
import torch
from transformers import ConvNextConfig, ConvNextModel

from cases import lisp
from conftest import load_module
from sx2torch.compiler import Options, compile_source

torch.set_num_threads(1)

SIZES = dict(
    num_channels=3,
    patch_size=2,
    num_stages=3,
    hidden_sizes=[8, 16, 24],
    depths=[1, 2, 1],
)


def convnext(run: str):
    path = lisp("convnext")
    code = compile_source(path.read_text(), path.name, Options(run=run))
    return load_module(code).Convnext


def randomized(model):
    """Every weight drawn afresh: layer norms and layer scales that are not their near-
    identity defaults, so each block's branch counts in the output."""
    torch.manual_seed(0)
    with torch.no_grad():
        for value in model.parameters():
            value.normal_(0.0, 0.3)
    return model


def pixels(seed: int, size: int, batch: int = 2):
    return torch.randn(
        batch, 3, size, size, generator=torch.Generator().manual_seed(seed)
    )


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """transformers' model with random weights in f32, and as from_pretrained(...,
    dtype=torch.bfloat16) loads it."""
    f32 = randomized(ConvNextModel(ConvNextConfig(**SIZES))).eval()
    folder = tmp_path_factory.mktemp("convnext")
    f32.save_pretrained(folder)
    bf16 = ConvNextModel.from_pretrained(folder, dtype=torch.bfloat16).eval()
    assert bf16.embeddings.patch_embeddings.weight.dtype == torch.bfloat16
    return {"exact": f32, "train": bf16}


def outputs(model, x):
    with torch.no_grad():
        return model(x)


@pytest.mark.parametrize("size", [16, 24])
@pytest.mark.parametrize("run", ["exact", "train"])
def test_the_real_checkpoint_loads_and_gives_the_real_outputs(real, run, size):
    model = convnext(run)(**SIZES)
    theirs = real[run].state_dict()
    assert list(model.state_dict()) == list(theirs)
    assert "encoder.stages.1.downsampling_layer.1.weight" in theirs
    model.load_state_dict(theirs, strict=True)
    x = pixels(size, size)
    got = outputs(model, x)
    dtype = torch.float32 if run == "exact" else torch.bfloat16
    # transformers' conv takes pixels in its weights' dtype; the module casts at entry
    reference = outputs(real[run], x.to(dtype))
    want = (reference.last_hidden_state, reference.pooler_output)
    assert isinstance(got, tuple) and len(got) == 2
    last = size // 2 // 4
    assert [tuple(t.shape) for t in got] == [(2, 24, last, last), (2, 24)]
    for mine, theirs in zip(got, want):
        assert mine.dtype == theirs.dtype == dtype
        assert (mine.float() - theirs.float()).abs().max() <= (
            1e-5 if run == "exact" else 0
        )
        assert torch.equal(mine, theirs)  # the same calls: equal in f32 too


def test_the_constructor_takes_the_configs_lists_and_names():
    """Another depth per stage, widths, patch, eps and no layer scale reach the layers as in
    transformers: the same keys and shapes, and the same outputs."""
    options = dict(
        num_channels=2,
        patch_size=4,
        num_stages=2,
        hidden_sizes=[6, 10],
        depths=[2, 3],
        layer_norm_eps=1e-6,
        layer_scale_init_value=0.0,
    )
    real = randomized(ConvNextModel(ConvNextConfig(**options))).eval()
    model = convnext("exact")(**options)
    assert "encoder.stages.0.layers.0.layer_scale_parameter" not in real.state_dict()
    assert "encoder.stages.0.downsampling_layer.0.weight" not in real.state_dict()
    model.load_state_dict(real.state_dict(), strict=True)
    x = torch.randn(1, 2, 16, 16, generator=torch.Generator().manual_seed(3))
    got, theirs = outputs(model, x), outputs(real, x)
    assert (got[0] - theirs.last_hidden_state).abs().max() <= 1e-5
    assert (got[1] - theirs.pooler_output).abs().max() <= 1e-5
    assert got[1].shape == (1, 10)


def test_the_downsampling_layer_is_an_nn_sequential_called_as_one():
    path = lisp("convnext")
    code = compile_source(path.read_text(), path.name)
    assert "self.downsampling_layer = nn.Sequential(" in code
    assert "self.downsampling_layer(features)" in code
    assert "hidden_sizes=(96, 192, 384, 768)" in code


def test_it_trains():
    """AdamW on the pooled features, through the sequential's items and the stacks."""
    torch.manual_seed(1)
    model = convnext("train")(**SIZES)
    x, target = pixels(4, 16, batch=4), torch.randn(4, 24)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)

    def step() -> float:
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x)[1].float(), target)
        loss.backward()
        optimizer.step()
        return loss.item()

    first = step()
    for _ in range(6):
        step()
    assert step() < 0.8 * first


def test_the_source_is_at_most_75_lines_of_code():
    """transformers' ConvNextModel (ConvNextLayerNorm, ConvNextEmbeddings, ConvNextLayer,
    ConvNextStage, ConvNextEncoder, ConvNextModel; the drop path left out) is 139 lines of
    modeling_convnext.py without comments, docstrings and blank lines, with torch's
    nn.Linear, nn.Conv2d and nn.LayerNorm, which the source writes itself (71 lines)."""
    lines = lisp("convnext").read_text().splitlines()
    code = [
        line for line in lines if line.strip() and not line.lstrip().startswith(";")
    ]
    assert len(code) <= 75
