"""examples/t5.lisp is Hugging Face transformers' T5ForConditionalGeneration with
feed_forward_proj="gated-gelu" (T5 v1.1's wi_0, wi_1, wo and gelu_new): an encoder and a
decoder whose first block computes the bucketed relative position bias (integer math, a
log, a cast to int64, min and where) that every later block reads, T5's unscaled scores
plus that bias, the causal mask on the decoder's self-attention, and the tied lm_head
scaled by d_model**-0.5 where tie_word_embeddings is true (T5Config's default). Its
state_dict loads with strict=True and the logits are transformers' own: equal under :f32
and bit for bit under :bf16, at two pairs of encoder and decoder lengths (the longer
beyond max_distance, so the log-spaced buckets and their clamp are read).

The bf16 reference is from_pretrained(..., dtype=torch.bfloat16), what a user loads. T5's
_keep_in_fp32_modules = ["wo"] keeps wo in f32 only for float16 in the installed
transformers (bf16 goes to _keep_in_fp32_modules_strict, which T5 leaves empty), so wo is
bf16 there and T5DenseGatedActDense's cast to wo's dtype changes nothing: the test asserts
it. transformers runs the eager attention, the code of modeling_t5.py (its default, sdpa,
passes the bias as SDPA's mask and computes the scores in another order).
"""

from __future__ import annotations

import pytest
import torch
from transformers import T5Config, T5ForConditionalGeneration

from cases import T5, lisp
from conftest import load_module
from sx2torch.compiler import Options, compile_source

torch.set_num_threads(1)

SIZES = T5
EAGER = dict(attn_implementation="eager")
# (encoder length, decoder length): the second past max_distance
LENGTHS = [(7, 5), (20, 13)]


def t5(run: str):
    path = lisp("t5")
    code = compile_source(path.read_text(), path.name, Options(run=run))
    return load_module(code).T5


def inputs(lengths: tuple) -> tuple:
    generator = torch.Generator().manual_seed(lengths[0])
    return tuple(torch.randint(0, 64, (2, n), generator=generator) for n in lengths)


def real(folder, tie: bool) -> dict:
    """transformers' model with random weights (the norms too) in f32, and as
    from_pretrained loads it in bf16."""
    torch.manual_seed(0)
    config = T5Config(
        feed_forward_proj="gated-gelu",
        **({} if tie else dict(tie_word_embeddings=False)),
        **SIZES,
        **EAGER,
    )
    f32 = T5ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, value in f32.named_parameters():
            value.normal_(0.0, 1.0 if "norm" in name else 0.3)
    f32.save_pretrained(folder)
    bf16 = T5ForConditionalGeneration.from_pretrained(
        folder, dtype=torch.bfloat16, **EAGER
    ).eval()
    assert bf16.encoder.block[0].layer[1].DenseReluDense.wo.weight.dtype == (
        torch.bfloat16
    )
    return {"exact": f32, "train": bf16}


@pytest.fixture(scope="module")
def reals(tmp_path_factory):
    return {
        tie: real(tmp_path_factory.mktemp(f"t5-{tie}"), tie) for tie in (True, False)
    }


@pytest.mark.parametrize("lengths", LENGTHS)
@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize("run", ["exact", "train"])
def test_the_real_checkpoint_loads_and_gives_the_real_logits(reals, run, tie, lengths):
    model = t5(run)(**SIZES, tie_word_embeddings=tie)
    theirs = reals[tie][run].state_dict()
    assert set(model.state_dict()) == set(theirs)
    assert "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight" in (
        theirs
    )
    assert "decoder.block.1.layer.1.EncDecAttention.q.weight" in theirs
    assert "decoder.block.2.layer.2.DenseReluDense.wi_1.weight" in theirs
    model.load_state_dict(theirs, strict=True)
    input_ids, decoder_input_ids = inputs(lengths)
    with torch.no_grad():
        got = model(input_ids, decoder_input_ids)
        want = reals[tie][run](
            input_ids=input_ids, decoder_input_ids=decoder_input_ids
        ).logits
    dtype = torch.float32 if run == "exact" else torch.bfloat16
    assert got.dtype == want.dtype == dtype
    assert got.shape == (2, lengths[1], 64)
    assert (got.float() - want.float()).abs().max() <= (1e-5 if run == "exact" else 0)
    assert torch.equal(got, want)


def test_only_the_first_block_has_the_relative_attention_bias_and_the_weights_are_tied():
    model = t5("exact")(**SIZES)
    has = [
        hasattr(block.layer[0].SelfAttention, "relative_attention_bias")
        for stack in (model.encoder, model.decoder)
        for block in stack.block
    ]
    assert has == [True, False, True, False, False]
    assert model.lm_head.weight is model.shared.weight
    assert model.encoder.embed_tokens.weight is model.shared.weight
    assert model.decoder.embed_tokens.weight is model.shared.weight


def test_the_buckets_are_transformers_for_both_directions():
    """The bucket function alone, on relative positions from -40 to 40: transformers'
    _relative_position_bucket, bidirectional (the encoder) and not (the decoder)."""
    from transformers.models.t5.modeling_t5 import T5Attention

    attention = t5("train")(**SIZES).encoder.block[0].layer[0].SelfAttention
    relative = torch.arange(-40, 41)[None, :] - torch.zeros(3, 1, dtype=torch.long)
    for bidirectional in (True, False):
        got = attention.relative_position_bucket(relative, bidirectional=bidirectional)
        want = T5Attention._relative_position_bucket(
            relative, bidirectional=bidirectional, num_buckets=8, max_distance=12
        )
        assert got.dtype == torch.int64 and torch.equal(got, want)


def test_the_source_is_shorter_than_transformers():
    """transformers' T5ForConditionalGeneration (T5LayerNorm, T5DenseGatedActDense,
    T5LayerFF, eager_attention_forward, T5Attention, T5LayerSelfAttention,
    T5LayerCrossAttention, T5Block, T5Stack and T5ForConditionalGeneration; caches,
    masks, dropout, fp16 clamps, initialisation and the loss left out) is 244 lines of
    modeling_t5.py without comments, docstrings and blank lines; the source's include
    torch's nn.Linear and nn.Embedding, written as models of its own."""
    lines = lisp("t5").read_text().splitlines()
    code = [
        line for line in lines if line.strip() and not line.lstrip().startswith(";")
    ]
    assert len(code) <= 200


def test_each_stack_starts_the_bias_as_none_and_block_0_computes_it():
    """transformers' `position_bias = None` before the loop: the first block's attention
    computes the bias (it does not read the None), the others read it; a method a loop
    may pass None casts it at entry only where it is a tensor."""
    path = lisp("t5")
    code = compile_source(path.read_text(), path.name)
    assert code.count("        position_bias = None\n") == 2
    assert (
        "        if position_bias is not None:\n"
        "            position_bias = position_bias.to(torch.bfloat16)\n"
    ) in code
    torch.manual_seed(0)
    model = load_module(code).T5(**SIZES)
    layer = model.encoder.block[0].layer[0]
    h = torch.randn(2, 5, 16)
    first, bias = layer(h, None)
    assert bias.shape == (1, 4, 5, 5) and bias.dtype == torch.bfloat16
    again, same = model.encoder.block[1].layer[0](first, bias.float())
    assert torch.equal(same, bias)
