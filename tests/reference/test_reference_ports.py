"""The hand-written ports of modded-nanogpt's GPTs: their state_dicts are the real models'
(keys, shapes, dtypes, written down below from the real code), they run on the CPU at any
length, and their weights survive a strict save and load."""

from __future__ import annotations

import io

import pytest
import torch

from reference import modded_nanogpt_medium as medium
from reference import modded_nanogpt_simple as simple

BF16, F32 = torch.bfloat16, torch.float32
SMALL_SIMPLE = dict(
    vocab_size=320, num_layers=2, model_dim=256
)  # head_dim is fixed: 128
# the real forward needs 16 layers; the attention gates read the first 16 channels
SMALL_MEDIUM = dict(
    vocab_size=300,
    num_layers=16,
    num_heads=2,
    head_dim=32,
    model_dim=64,
    max_seq_len=96,
)
VOCAB_MEDIUM = (
    384  # 300 padded to a multiple of 128, as the real GPT pads 50257 to 50304
)


def real_simple_state_dict(vocab=50304, layers=12, dim=768) -> dict:
    """train_gpt_simple.py's GPT(vocab_size=50304, num_layers=12, model_dim=768)."""
    expected = {"embed.weight": ((vocab, dim), BF16)}
    for i in range(layers):
        block = f"blocks.{i}."
        for name in ("q", "k", "v", "proj"):
            expected[f"{block}attn.{name}.weight"] = ((dim, dim), F32)
            expected[f"{block}attn.{name}.bias"] = ((dim,), F32)
        expected[f"{block}attn.rotary.angular_freq"] = ((128 // 2,), F32)
        expected[f"{block}mlp.fc.weight"] = ((4 * dim, dim), F32)
        expected[f"{block}mlp.fc.bias"] = ((4 * dim,), F32)
        expected[f"{block}mlp.proj.weight"] = ((dim, 4 * dim), F32)
        expected[f"{block}mlp.proj.bias"] = ((dim,), F32)
        expected[f"{block}norm1.gains"] = ((dim,), F32)
        expected[f"{block}norm2.gains"] = ((dim,), F32)
    expected["proj.weight"] = ((vocab, dim), F32)
    expected["proj.bias"] = ((vocab,), F32)
    expected["norm1.gains"] = ((dim,), F32)
    expected["norm2.gains"] = ((dim,), F32)
    return expected


def real_medium_state_dict(vocab=50304, layers=16, heads=8, dim=1024) -> dict:
    """train_gpt_medium.py's GPT(50257, 16, 8, 128, 1024, ...) after the script's cast of
    every nn.Embedding and nn.Linear weight to bf16, on 8 GPUs."""
    expected = {"smear_gate.weight": ((1, 16), BF16)}
    for i in range(3):
        expected[f"skip_gates.{i}.weight"] = ((1, 16), BF16)
    for i in range(5):
        expected[f"value_embeds.{i}.weight"] = ((vocab, dim), BF16)
    for i in range(layers):
        expected[f"blocks.{i}.attn.qkvo_w"] = ((4 * dim, dim), F32)
        expected[f"blocks.{i}.attn.attn_gate.weight"] = ((heads, 16), BF16)
        if i in (0, 1, 2, 3, 4, 11, 12, 13, 14, 15):
            expected[f"blocks.{i}.attn.value_embed_gate.weight"] = ((heads, 16), BF16)
        expected[f"blocks.{i}.mlp.c_fc"] = ((4 * dim, dim), F32)
        expected[f"blocks.{i}.mlp.c_proj"] = ((4 * dim, dim), F32)
    expected["lm_head.weight"] = ((vocab, dim), BF16)
    expected["embed.weight"] = ((vocab, dim), BF16)
    expected["embed2.weight"] = ((vocab, dim), BF16)
    expected["x0_lambdas"] = ((2 * layers,), F32)
    # 16 resid + 32 SA + smear + backout + 3 skip = 53, padded to a multiple of 8
    expected["scalars"] = ((56,), F32)
    return expected


def described(model) -> dict:
    return {k: (tuple(v.shape), v.dtype) for k, v in model.state_dict().items()}


def test_simple_state_dict_is_the_real_one():
    with torch.device("meta"):
        model = simple.build_reference()
    assert described(model) == real_simple_state_dict()


def test_medium_state_dict_is_the_real_one():
    with torch.device("meta"):
        model = medium.build_reference()
    assert described(model) == real_medium_state_dict()


def test_value_embed_gates_are_on_the_layers_that_read_a_value_embedding():
    # the forward's list: ve[0..4], None for the middle layers, ve[0..4] again
    layers = 16
    reading = list(range(5)) + list(range(layers - 5, layers))
    assert medium.VALUE_EMBED_LAYERS == reading


def test_scalars_mix_their_initial_values_and_pad_to_the_world_size():
    model = medium.build_reference(**SMALL_MEDIUM)
    expected = (
        [1.05] * 16 + [0.5, 1.0] * 16 + [0.0, 0.5] + [-1.5] * 3 + [1.0] * 3
    )  # resid, SA, smear, backout, skip, padding for 8 GPUs
    assert torch.equal(model.scalars.detach(), torch.tensor(expected))
    assert medium.build_reference(**SMALL_MEDIUM, world_size=1).scalars.numel() == 53
    assert medium.build_reference(**SMALL_MEDIUM, world_size=2).scalars.numel() == 54


def randomized(model, seed: int):
    """Every trained weight non-zero (the real inits zero many of them), in its own dtype."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            noise = torch.randn(p.shape, generator=generator)
            if p.ndim == 1:  # gains, biases, lambdas: near their initial values
                p.copy_(p.float() + 0.1 * noise)
            else:
                p.copy_(noise * p.shape[-1] ** -0.5)
    return model


def tokens(batch: int, length: int, vocab: int, seed: int) -> torch.Tensor:
    return torch.randint(
        0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed)
    )


PORTS = {
    "simple": (simple.build_reference, SMALL_SIMPLE, F32, 320),
    "medium": (medium.build_reference, SMALL_MEDIUM, BF16, VOCAB_MEDIUM),
}


@pytest.mark.parametrize("length", [64, 40])
@pytest.mark.parametrize("port", sorted(PORTS))
def test_logits_have_the_real_shape_and_dtype_and_are_deterministic(port, length):
    build, sizes, dtype, vocab = PORTS[port]
    model = randomized(build(**sizes), seed=0)
    ids = tokens(2, length, sizes["vocab_size"], seed=1)
    logits = model(ids)
    assert logits.shape == (2, length, vocab) and logits.dtype == dtype
    assert torch.isfinite(logits).all()
    assert logits.float().std() > 0.1  # the random weights reach the logits
    assert torch.equal(model(ids), logits)


@pytest.mark.parametrize("port", sorted(PORTS))
def test_loss_is_the_summed_cross_entropy_of_the_logits(port):
    build, sizes, dtype, _ = PORTS[port]
    model = randomized(build(**sizes), seed=2)
    ids, targets = (tokens(2, 40, sizes["vocab_size"], seed=s) for s in (3, 4))
    loss = model.loss(ids, targets)
    assert loss.shape == () and loss.dtype == dtype
    logits = model(ids).double()
    exact = -logits.log_softmax(-1).gather(-1, targets[..., None]).sum()
    relative = 1e-6 if dtype == F32 else 2.0**-8  # a bf16 result rounds once at least
    assert abs(loss.double() - exact) <= relative * abs(exact) + 1e-3


def test_medium_rows_are_separate_documents():
    model = randomized(medium.build_reference(**SMALL_MEDIUM), seed=5)
    ids = tokens(3, 40, 300, seed=6)
    batch = model(ids)
    for row in range(3):
        alone = model(ids[row : row + 1])
        torch.testing.assert_close(batch[row : row + 1], alone, rtol=0.0, atol=0.0)


@pytest.mark.parametrize("port", sorted(PORTS))
def test_strict_save_and_load_round_trip(port):
    build, sizes, _, _ = PORTS[port]
    trained = randomized(build(**sizes), seed=7)
    buffer = io.BytesIO()
    torch.save(trained.state_dict(), buffer)
    buffer.seek(0)
    fresh = build(**sizes)
    fresh.load_state_dict(torch.load(buffer, weights_only=True), strict=True)
    assert described(fresh) == described(trained)
    ids = tokens(2, 40, sizes["vocab_size"], seed=8)
    assert torch.equal(fresh(ids), trained(ids))


@pytest.mark.parametrize("window", [0, 1, 3, 100])
def test_sliding_window_mask_is_flash_attn_window_left_right_zero(window):
    size = 9
    mask = medium.sliding_window_mask(size, window)
    for i in range(size):
        for j in range(size):
            assert mask[i, j] == (i - window <= j <= i), (i, j)


def test_windowed_attention_in_the_medium_port_sees_only_its_window():
    """With blocks of one token, short windows of 1 and long ones of 2, a change to the
    first token reaches no further than the smear (1), the 12 short layers (1 each) and
    the 4 long ones (2 each, and 1 more for their key offset) carry it."""
    sizes = dict(SMALL_MEDIUM, block_size=1, ws_short=1, ws_long=2)
    model = randomized(medium.build_reference(**sizes), seed=9)
    ids = tokens(1, 64, 300, seed=10)
    changed = ids.clone()
    changed[0, 0] = (ids[0, 0] + 1) % 300
    differs = (model(ids) != model(changed)).any(-1)[0]
    reach = 1 + 12 * 1 + 4 * (2 + 1)
    assert differs[: reach + 1].any() and not differs[reach + 1 :].any()
    # the same change without windows reaches every later position
    wide = randomized(medium.build_reference(**SMALL_MEDIUM), seed=9)
    assert (wide(ids) != wide(changed)).any(-1)[0, reach + 1 :].all()
