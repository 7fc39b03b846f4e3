"""examples/modded-nanogpt-simple.lisp is modded-nanogpt's simple-track GPT: the real
state_dict loads with strict=True and the logits and loss are the real code's, bit for bit
(against the hand-written port of the real module in tests/reference)."""

from __future__ import annotations

import pytest
import torch

from cases import lisp
from conftest import load_module
from reference.modded_nanogpt_simple import build_reference
from sx2torch.compiler import compile_source

SIZES = dict(vocab_size=64, num_layers=2, model_dim=128)


@pytest.fixture(scope="module")
def simple():
    path = lisp("modded-nanogpt-simple")
    return load_module(compile_source(path.read_text(), path.name)).ModdedNanogptSimple


@pytest.mark.parametrize("length", [64, 40])
def test_the_real_checkpoint_loads_and_gives_the_real_numbers(simple, length):
    torch.manual_seed(0)
    real = build_reference(**SIZES)
    model = simple(**SIZES)
    model.load_state_dict(real.state_dict(), strict=True)
    ids = torch.randint(0, 64, (2, length))
    targets = torch.randint(0, 64, (2, length))
    logits = model(ids)
    assert logits.dtype == torch.float32 and logits.shape == (2, length, 64)
    assert torch.equal(logits, real(ids))
    assert torch.equal(model.loss(ids, targets), real.loss(ids, targets))
    assert model.embed.weight.dtype == torch.bfloat16


def test_it_trains(simple):
    torch.manual_seed(1)
    model = simple(**SIZES)
    ids = torch.randint(0, 64, (4, 32))
    targets = torch.roll(ids, -1, dims=1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(8):
        optimizer.zero_grad()
        loss = model.loss(ids, targets)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0]


def test_it_compiles_as_one_graph(simple):
    torch.manual_seed(2)
    model = simple(**SIZES)
    ids = torch.randint(0, 64, (2, 16))
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(ids), model(ids))


def test_the_rotary_table_is_built_as_the_real_one(simple):
    """(concat [(pow (/ 1 1024) (linspace (// dim 4))) (zeros [(// dim 4)])])."""
    built = simple(**SIZES).blocks[0].attn.rotary.angular_freq
    real = build_reference(**SIZES).blocks[0].attn.rotary.angular_freq
    assert built.dtype == torch.float32 and torch.equal(built, real)
