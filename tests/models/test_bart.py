"""examples/bart.lisp is Hugging Face transformers' BartForConditionalGeneration: the shared
embedding (scaled by sqrt(d_model) where scale_embedding is true), learned positions from
row 2 on, layernorm_embedding, post-LN encoder and decoder layers whose q, k, v and out
projections have biases, the eager attention (scores times head_dim**-0.5), the gelu
feed-forward, and the lm_head tied to model.shared plus the final_logits_bias buffer. Its
state_dict loads with strict=True and the logits are transformers' own: within 1e-5 (equal
where they are) under :f32 and bit for bit under :bf16, against from_pretrained(...,
dtype=torch.bfloat16), at two pairs of encoder and decoder lengths, with and without
scale_embedding. transformers runs its eager attention, the code of modeling_bart.py.

Equal means transformers' forward with use_cache=False. Its default fills a DynamicCache,
which keeps contiguous copies of the keys and values, and a product reads another layout
there: at the shorter lengths its f32 logits differ from its own uncached ones by up to
1.1e-6 (the bf16 ones are the same)."""

from __future__ import annotations

import pytest
import torch
from transformers import BartConfig, BartForConditionalGeneration

from cases import BART, lisp
from conftest import load_module
from sx2torch.compiler import Options, compile_source

torch.set_num_threads(1)

EAGER = dict(attn_implementation="eager")
# (encoder length, decoder length)
LENGTHS = [(7, 5), (19, 23)]


def bart(run: str):
    path = lisp("bart")
    code = compile_source(path.read_text(), path.name, Options(run=run))
    return load_module(code).Bart


def inputs(lengths: tuple) -> tuple:
    generator = torch.Generator().manual_seed(lengths[0])
    return tuple(torch.randint(3, 64, (2, n), generator=generator) for n in lengths)


def real(folder, **settings) -> dict:
    """transformers' model with random weights (biases, norms and final_logits_bias too)
    in f32, and as from_pretrained loads it in bf16. A tiny random model's greedy tokens
    mostly repeat one token: these weights (seed 4, small biases) make test_generate_bart's
    rows of 10 and 3 different tokens (11 and 3 in bf16)."""
    torch.manual_seed(4)
    f32 = BartForConditionalGeneration(BartConfig(**BART, **settings, **EAGER)).eval()
    with torch.no_grad():
        for name, value in f32.named_parameters():
            if name.endswith("bias"):
                value.normal_(0.0, 0.05)
            else:
                value.normal_(1.0 if "norm.weight" in name else 0.0, 0.2)
        f32.final_logits_bias.normal_(0.0, 0.1)
    f32.save_pretrained(folder)
    bf16 = BartForConditionalGeneration.from_pretrained(
        folder, dtype=torch.bfloat16, **EAGER
    ).eval()
    assert bf16.final_logits_bias.dtype == torch.bfloat16
    return {"exact": f32, "train": bf16}


@pytest.fixture(scope="module")
def reals(tmp_path_factory):
    return {
        scale: real(tmp_path_factory.mktemp(f"bart-{scale}"), scale_embedding=scale)
        for scale in (False, True)
    }


@pytest.mark.parametrize("lengths", LENGTHS)
@pytest.mark.parametrize("scale", [False, True])
@pytest.mark.parametrize("run", ["exact", "train"])
def test_the_real_checkpoint_loads_and_gives_the_real_logits(
    reals, run, scale, lengths
):
    model = bart(run)(**BART, scale_embedding=scale)
    theirs = reals[scale][run].state_dict()
    assert set(model.state_dict()) == set(theirs)
    for key in (
        "final_logits_bias",
        "model.encoder.embed_positions.weight",
        "model.decoder.layers.2.encoder_attn.k_proj.bias",
        "model.decoder.layernorm_embedding.bias",
    ):
        assert key in theirs
    model.load_state_dict(theirs, strict=True)
    input_ids, decoder_input_ids = inputs(lengths)
    reference = reals[scale][run]
    with torch.no_grad():
        got = model(input_ids, decoder_input_ids)
        want = reference(
            input_ids=input_ids, decoder_input_ids=decoder_input_ids, use_cache=False
        ).logits
        # its default fills a DynamicCache, whose keys are contiguous copies
        cached = reference(input_ids=input_ids, decoder_input_ids=decoder_input_ids)
    dtype = torch.float32 if run == "exact" else torch.bfloat16
    assert got.dtype == want.dtype == dtype
    assert got.shape == (2, lengths[1], 64)
    assert torch.equal(got, want)
    difference = (got.float() - cached.logits.float()).abs().max()
    assert difference <= (1e-5 if run == "exact" else 0)


def test_the_embeddings_and_lm_head_are_one_tensor_and_the_bias_a_buffer():
    model = bart("train")(**BART)
    shared = model.model.shared.weight
    assert model.lm_head.weight is shared
    assert model.model.encoder.embed_tokens.weight is shared
    assert model.model.decoder.embed_tokens.weight is shared
    assert "final_logits_bias" in dict(model.named_buffers())
    assert (
        model.final_logits_bias.dtype == torch.bfloat16
    )  # as its bf16 reader reads it
    # two rows more than the positions: transformers' offset of 2
    assert model.model.decoder.embed_positions.weight.shape == (50, 24)


def test_the_source_is_shorter_than_transformers():
    """transformers' BartForConditionalGeneration (BartLearnedPositionalEmbedding,
    BartScaledWordEmbedding, eager_attention_forward, BartAttention, BartEncoderLayer,
    BartDecoderLayer, BartEncoder, BartDecoder, BartModel and BartForConditionalGeneration)
    is 564 lines of modeling_bart.py without comments, docstrings and blank lines; the
    source's include torch's nn.Linear and nn.Embedding, written as models of its own.
    """
    lines = lisp("bart").read_text().splitlines()
    code = [
        line for line in lines if line.strip() and not line.lstrip().startswith(";")
    ]
    assert len(code) <= 125


def test_a_fine_tuning_steps_embedding_gradient_is_transformers(reals):
    """BartScaledWordEmbedding's padding_idx (pad_token_id, 1): the pad token's rows send
    the shared embedding no gradient, so a fine-tuning step's gradient of the tied table
    (embeddings and lm_head) is transformers' own, bit for bit, padded rows and all."""
    reference = reals[False]["exact"]
    model = bart("exact")(**BART)
    model.load_state_dict(reference.state_dict(), strict=True)
    generator = torch.Generator().manual_seed(7)
    input_ids = torch.randint(3, 64, (2, 7), generator=generator)
    decoder_input_ids = torch.randint(3, 64, (2, 5), generator=generator)
    labels = torch.randint(3, 64, (2, 5), generator=generator)
    input_ids[1, -3:] = decoder_input_ids[1, -2:] = 1  # padded
    logits = model(input_ids, decoder_input_ids)
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten()).backward()
    try:
        theirs = reference(
            input_ids=input_ids, decoder_input_ids=decoder_input_ids, use_cache=False
        ).logits
        loss = torch.nn.functional.cross_entropy(theirs.flatten(0, 1), labels.flatten())
        loss.backward()
        got, want = model.model.shared.weight.grad, reference.model.shared.weight.grad
        assert got.dtype == want.dtype == torch.float32
        assert torch.equal(got, want)
    finally:
        reference.zero_grad(set_to_none=True)
