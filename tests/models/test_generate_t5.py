"""An encoder-decoder generates (issue 36): T5's port, compiled for `(defrun NAME :generate
decoder-input-ids)`, gives transformers' `generate` tokens and bit-identical logits at every
step, f32 against the f32 model and bf16 against from_pretrained(dtype=bf16); the encoder
runs once per prompt, and so do the cross-attentions' key and value projections."""

from __future__ import annotations

import pytest
import torch
from transformers import T5Config, T5ForConditionalGeneration

from cases import T5, lisp
from conftest import (
    assert_generated,
    calls_counted,
    class_code,
    greedy,
    load_module,
)
from sx2torch.compiler import Options, compile_source
from sx2torch.runtime import generate

# test_t5.py's tiny config, as many decoder layers as encoder ones (transformers' generate
# sizes its cache by num_layers)
SIZES = dict(T5, num_layers=3)
EAGER = dict(attn_implementation="eager")
RUNS = (
    "\n(defrun generate :precision :bf16 :generate decoder-input-ids)"
    "\n(defrun generate-exact :precision :f32 :generate decoder-input-ids)\n"
)
DTYPES = {"generate-exact": torch.float32, "generate": torch.bfloat16}


def code(run: str) -> str:
    return compile_source(lisp("t5").read_text() + RUNS, "t5.lisp", Options(run=run))


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """{run: transformers' model}: random weights (the norms too) in f32, and as
    from_pretrained loads them in bf16."""
    torch.manual_seed(0)
    config = T5Config(feed_forward_proj="gated-gelu", **SIZES, **EAGER)
    f32 = T5ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, value in f32.named_parameters():
            value.normal_(0.0, 1.0 if "norm" in name else 0.3)
    folder = tmp_path_factory.mktemp("t5")
    f32.save_pretrained(folder)
    bf16 = T5ForConditionalGeneration.from_pretrained(
        folder, dtype=torch.bfloat16, **EAGER
    ).eval()
    return {"generate-exact": f32, "generate": bf16}


def test_the_encoder_and_the_cross_attentions_keys_are_calls_made_once():
    text = code("generate")
    assert "sx.once(self.encoder, input_ids)" in text
    # the decoder's cross-attention: its own class, the keys of the prompt made once and
    # its products the plain ones; the self-attentions keep their keys and values
    cross = class_code(text, "T5AttentionEncDecAttention(T5Attention)")
    assert "self.split_heads(sx.once(self.k, key_value_states))" in cross
    assert "self.split_heads(sx.once(self.v, key_value_states))" in cross
    assert "cached_matmul" not in cross
    own = class_code(text, "T5Attention(nn.Module)")
    assert own.count("sx.cached_matmul(") == 2
    assert "self.EncDecAttention = T5AttentionEncDecAttention(" in text
    # a subclass that writes only the method it computes otherwise
    assert "class T5AttentionEncDecAttention(T5Attention):" in text
    assert cross.count("    def ") == 1 and "    def forward(" in cross


@pytest.mark.parametrize("run", DTYPES)
def test_t5_generates_transformers_tokens_and_logits_bit_for_bit(
    real, run, monkeypatch
):
    torch.set_num_threads(1)
    reference = real[run]
    model = load_module(code(run)).T5(**SIZES)
    model.load_state_dict(reference.state_dict(), strict=True)
    prompt = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(1))
    want = greedy(reference, prompt, decoder_start_token_id=0)
    calls = calls_counted(
        encoder=model.encoder, k=model.decoder.block[1].layer[1].EncDecAttention.k
    )
    tokens, logits = generate(
        model, prompt, 32, return_logits=True, decoder_start_token_id=0
    )
    assert calls == {"encoder": 1, "k": 1}
    assert tokens.shape == (2, 33) and len(logits) == 32
    assert_generated(tokens, logits, want)
    with torch.no_grad():  # without a generation, every position, as before
        full = model(prompt, tokens)
        expected = reference(
            input_ids=prompt, decoder_input_ids=tokens, use_cache=False
        ).logits
    assert full.dtype == DTYPES[run] and torch.equal(full, expected)


def test_an_encoder_decoder_generates_with_a_dynamic_cache_only():
    model = load_module(code("generate-exact")).T5(**SIZES)
    prompt = torch.ones(1, 4, dtype=torch.long)
    with pytest.raises(
        ValueError, match="give neither static_cache nor attention_mask"
    ):
        generate(model, prompt, 2, decoder_start_token_id=0, static_cache=True)
