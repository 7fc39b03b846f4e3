"""examples/modded-nanogpt-simple.lisp is modded-nanogpt's simple-track GPT: the real
state_dict loads with strict=True and the logits and loss are the real code's, bit for bit
(against the hand-written port of the real module in tests/reference)."""

from __future__ import annotations

import pytest
import torch

from cases import lisp
from conftest import adamw_losses, load_module
from reference.modded_nanogpt_simple import CausalSelfAttention, build_reference
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


def test_head_dim_reaches_the_blocks(simple):
    """ModdedNanogptSimple(head_dim=32) builds 32-wide heads: the real module with each
    block's CausalSelfAttention(dim, head_dim=32), bit for bit."""
    torch.manual_seed(0)
    real = build_reference(**SIZES)
    for block in real.blocks:
        block.attn = CausalSelfAttention(SIZES["model_dim"], head_dim=32)
    model = simple(**SIZES, head_dim=32)
    model.load_state_dict(real.state_dict(), strict=True)
    assert model.blocks[1].attn.rotary.angular_freq.shape == (16,)
    ids = torch.randint(0, 64, (2, 24))
    assert torch.equal(model(ids), real(ids))


def test_it_trains(simple):
    torch.manual_seed(1)
    model = simple(**SIZES)
    ids = torch.randint(0, 64, (4, 32))
    targets = torch.roll(ids, -1, dims=1)
    losses = adamw_losses(model, ids, targets, steps=8)
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


MEDIUM = dict(
    vocab_size=300,
    num_layers=16,
    num_heads=2,
    head_dim=32,
    model_dim=64,
    max_seq_len=96,
)  # windows of 11 and 23 blocks of 4 tokens: the short one is shorter than T = 64
WINDOWS = dict(ws_short=44, ws_long=92)


@pytest.fixture(scope="module")
def medium():
    path = lisp("modded-nanogpt-medium")
    return load_module(compile_source(path.read_text(), path.name)).ModdedNanogptMedium


def medium_pair(medium, seed=0):
    from reference.modded_nanogpt_medium import build_reference as build_medium
    from reference.test_reference_ports import randomized

    real = randomized(build_medium(**MEDIUM, block_size=4), seed=seed)
    model = medium(**MEDIUM, **WINDOWS)
    model.load_state_dict(real.state_dict(), strict=True)
    return real, model


@pytest.mark.parametrize("length", [64, 40])
def test_the_medium_checkpoint_loads_and_gives_the_real_logits(medium, length):
    real, model = medium_pair(medium)
    ids = torch.randint(0, 300, (2, length), generator=torch.Generator().manual_seed(1))
    logits = model(ids)
    assert logits.dtype == torch.bfloat16 and logits.shape == (2, length, 384)
    assert torch.equal(logits, real(ids))


@pytest.mark.parametrize("length", [64, 40])
def test_the_medium_split_embed_gives_a_trained_checkpoints_logits(medium, length):
    """After the real run's split step (and in its final checkpoint) the input embedding is
    `embed`: ModdedNanogptMedium(split_embed=True), or the flag set on a built module, gives
    the real logits with split_embed on, bit for bit."""
    real, tied = medium_pair(medium, seed=6)
    real.split_embed = True
    split = medium(**MEDIUM, **WINDOWS, split_embed=True)
    split.load_state_dict(real.state_dict(), strict=True)
    ids = torch.randint(0, 300, (2, length), generator=torch.Generator().manual_seed(2))
    expected = real(ids)
    assert torch.equal(split(ids), expected)
    untied = tied(ids)
    assert not torch.equal(
        untied, expected
    )  # embed and lm_head differ in this checkpoint
    tied.split_embed = True  # flipped on the built module: the next forward reads it
    assert torch.equal(tied(ids), expected)
    tied.split_embed = False
    assert torch.equal(tied(ids), untied)


def test_the_medium_value_embed_gates_exist_only_where_the_real_ones_do(medium):
    model = medium(**MEDIUM, **WINDOWS)
    gated = [
        i
        for i, block in enumerate(model.blocks)
        if hasattr(block.attn, "value_embed_gate")
    ]
    assert gated == [0, 1, 2, 3, 4, 11, 12, 13, 14, 15]
    assert model.scalars.numel() == 56 and model.lm_head.weight.dtype == torch.bfloat16


def test_the_medium_scalars_start_as_the_real_ones(medium):
    from reference.modded_nanogpt_medium import build_reference as build_medium

    assert torch.equal(medium(**MEDIUM).scalars, build_medium(**MEDIUM).scalars)


def test_the_medium_model_trains(medium):
    torch.manual_seed(1)
    _, model = medium_pair(medium, seed=3)
    ids = torch.randint(0, 300, (2, 32))
    targets = torch.roll(ids, -1, dims=1)
    losses = adamw_losses(model, ids, targets, steps=6)
    assert losses[-1] < 0.9 * losses[0]


def test_the_medium_model_compiles_as_one_graph(medium):
    _, model = medium_pair(medium, seed=4)
    ids = torch.randint(0, 300, (1, 16), generator=torch.Generator().manual_seed(5))
    # fullgraph: a graph break is an error (no second trace by torch._dynamo.explain)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(ids), model(ids))
