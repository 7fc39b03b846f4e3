"""BART generates (issue 36, item 5): examples/bart.lisp's `(defrun generate :precision :bf16
:generate decoder-input-ids)`, and the same under :f32, give transformers' greedy `generate`
tokens and bit-identical logits at every step, f32 against the f32 model and bf16 against
from_pretrained(dtype=bf16); the encoder runs once per prompt, and so do the
cross-attentions' key and value projections; the decoder's positions start where the cache
ends."""

from __future__ import annotations

import pytest
import torch

from cases import BART, lisp
from conftest import (
    assert_generated,
    calls_counted,
    class_code,
    greedy,
    load_module,
)
from sx2torch.compiler import Options, compile_source
from sx2torch.runtime import generate
from sx2torch.runtime.cache import Cache, generating
from sx2torch.tools import explain
from models.test_bart import real

# BartConfig's own start token; no forced or early end, so that both make 32 tokens
START = 2
NO_END = dict(eos_token_id=None, forced_eos_token_id=None)
DTYPES = {"generate-exact": torch.float32, "generate": torch.bfloat16}


def source() -> str:
    """examples/bart.lisp with its :generate run under :f32 too."""
    text = lisp("bart").read_text()
    return (
        text + "\n(defrun generate-exact :precision :f32 :generate decoder-input-ids)\n"
    )


def code(run: str, text: str | None = None) -> str:
    return compile_source(text or source(), "bart.lisp", Options(run=run))


def tiny(text: str) -> str:
    """The source with its consts at BART's sizes (explain reports the module its defaults
    build)."""
    for name, value in BART.items():
        const = f"(defconst {name.replace('_', '-')} "
        (line,) = [line for line in text.splitlines() if line.startswith(const)]
        text = text.replace(line, f"{const}{value})")
    return text


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """{run: transformers' model}, f32 and as from_pretrained loads it in bf16."""
    models = real(tmp_path_factory.mktemp("bart"), scale_embedding=True, **NO_END)
    return {"generate-exact": models["exact"], "generate": models["train"]}


def test_the_encoder_and_the_cross_attentions_keys_are_calls_made_once():
    text = code("generate")
    assert "sx.once(self.encoder, input_ids)" in text
    cross = class_code(text, "BartAttentionEncoderAttn(BartAttention)")
    assert "self.split_heads(sx.once(self.k_proj, key_value_states))" in cross
    assert "self.split_heads(sx.once(self.v_proj, key_value_states))" in cross
    assert "cached_matmul" not in cross
    own = class_code(text, "BartAttention(nn.Module)")
    assert own.count("sx.cached_matmul(") == 2


@pytest.mark.parametrize("run", DTYPES)
def test_bart_generates_transformers_tokens_and_logits_bit_for_bit(references, run):
    torch.set_num_threads(1)
    reference = references[run]
    model = load_module(code(run)).Bart(**BART, scale_embedding=True)
    model.load_state_dict(reference.state_dict(), strict=True)
    prompt = torch.randint(3, 64, (2, 9), generator=torch.Generator().manual_seed(1))
    want = greedy(reference, prompt, decoder_start_token_id=START)
    calls = calls_counted(
        encoder=model.model.encoder,
        k_proj=model.model.decoder.layers[1].encoder_attn.k_proj,
    )
    tokens, logits = generate(
        model, prompt, 32, return_logits=True, decoder_start_token_id=START
    )
    assert calls == {"encoder": 1, "k_proj": 1}
    assert tokens.shape == (2, 33) and len(logits) == 32
    first, second = (len(set(row.tolist())) for row in tokens)
    assert first >= 8 and second >= 3, "the tokens vary"
    assert_generated(tokens, logits, want)
    with torch.no_grad():  # without a generation, every position, as before
        full = model(prompt, tokens)
        expected = reference(
            input_ids=prompt, decoder_input_ids=tokens, use_cache=False
        ).logits
    assert full.dtype == DTYPES[run] and torch.equal(full, expected)


@pytest.mark.parametrize("run", DTYPES)
def test_explains_bytes_per_token_are_those_the_cache_holds(run):
    """explain's figure against the runtime cache that one forward of the prompt fills: the
    decoder's self-attentions' keys and values, in the run's dtype; the encoder's output
    and the cross-attentions' projections are the prompt's, made once, nothing per token.
    """
    text = tiny(source())
    report = explain.run(text, "bart.lisp", Options(run=run))
    model = load_module(code(run, text)).Bart()
    cache = Cache()
    with torch.no_grad(), generating(cache):
        cache.begin(0)
        model(torch.zeros(1, 5, dtype=torch.long), torch.zeros(1, 3, dtype=torch.long))
    each = DTYPES[run].itemsize
    # 3 decoder layers' K and V, d_model 24 features each
    assert report["cache"]["bytes_per_token"] == cache.bytes_per_token()
    assert cache.bytes_per_token() == 3 * 2 * 24 * each
    assert report["cache"]["attentions"] == 3 and report["cache"]["unknown"] == 0
    assert len(cache.kept) == 3 * 2
    assert (
        len(cache.prompt) == 1 + 3 * 2
    )  # the encoder's output, each k_proj's and v_proj's
    assert "KV cache (generate): {:,} bytes per token".format(
        cache.bytes_per_token()
    ) in explain.render(report)
