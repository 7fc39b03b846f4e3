"""Whisper generates (issue 36): the port, compiled for `(defrun NAME :generate
decoder-input-ids)`, gives transformers' greedy tokens and bit-identical logits at every
step, f32 against the f32 model and bf16 against from_pretrained(dtype=bf16); the encoder
runs once per prompt of mel frames, and so do the cross-attentions' key and value
projections.

The reference is transformers' plain greedy decoding with its cache: `GenerationMixin.
generate(model, input_features, ...)`, the loop every encoder-decoder runs (an
EncoderDecoderCache: the self-attentions' keys grow, the cross-attentions' are made at the
first step and read after). `WhisperForConditionalGeneration.generate` puts Whisper's own
logic around that loop (language and task tokens forced, timestamps, long-form windows),
which is not the model's computation; the config suppresses and forces no token, so the
plain loop's tokens are its greedy argmax."""

from __future__ import annotations

import pytest
import torch
from transformers.generation import GenerationMixin

from cases import WHISPER, lisp, whisper_f32_and_bf16
from conftest import assert_generated, load_module
from sx2torch.compiler import Options, compile_source
from sx2torch.runtime import generate
from sx2torch.runtime.cache import Cache, generating
from sx2torch.tools import explain

# the file's generate run (bf16) and one at f32
RUNS = "\n(defrun generate-exact :precision :f32 :generate decoder-input-ids)\n"
DTYPES = {"generate-exact": torch.float32, "generate": torch.bfloat16}
START = 1  # the config's decoder_start_token_id


def code(run: str, source: str = None) -> str:
    text = (source or lisp("whisper").read_text()) + RUNS
    return compile_source(text, "whisper.lisp", Options(run=run))


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    f32, bf16 = whisper_f32_and_bf16(tmp_path_factory.mktemp("whisper"))
    return {"generate-exact": f32, "generate": bf16}


def features() -> torch.Tensor:
    """Two prompts of mel frames, bf16 values (the bf16 model reads the same numbers)."""
    shape = (2, WHISPER["num_mel_bins"], 2 * WHISPER["max_source_positions"])
    generator = torch.Generator().manual_seed(5)
    return torch.randn(shape, generator=generator).bfloat16().float()


def counted(calls: dict, name: str):
    def hook(module, args):
        calls[name] += 1

    return hook


@pytest.mark.parametrize("run", DTYPES)
def test_whisper_generates_transformers_tokens_and_logits_bit_for_bit(real, run):
    torch.set_num_threads(1)
    reference = real[run]
    settings = reference.generation_config
    assert settings.suppress_tokens is None and settings.begin_suppress_tokens is None
    assert getattr(settings, "forced_decoder_ids", None) is None
    model = load_module(code(run)).Whisper(**WHISPER)
    model.load_state_dict(reference.state_dict(), strict=True)
    input_features = features()
    want = GenerationMixin.generate(
        reference,
        input_features.to(reference.dtype),
        do_sample=False,
        max_new_tokens=32,
        output_logits=True,
        return_dict_in_generate=True,
        decoder_start_token_id=START,
    )
    calls = {"encoder": 0, "k_proj": 0, "v_proj": 0}
    model.model.encoder.register_forward_pre_hook(counted(calls, "encoder"))
    cross = model.model.decoder.layers[1].encoder_attn
    cross.k_proj.register_forward_pre_hook(counted(calls, "k_proj"))
    cross.v_proj.register_forward_pre_hook(counted(calls, "v_proj"))
    tokens, logits = generate(
        model, input_features, 32, return_logits=True, decoder_start_token_id=START
    )
    assert calls == {"encoder": 1, "k_proj": 1, "v_proj": 1}
    assert tokens.shape == (2, 33) and len(logits) == 32
    assert len(set(tokens.flatten().tolist())) > 4  # not one token over and over
    assert_generated(tokens, logits, want)
    with torch.no_grad():  # without a generation, every position, as before
        full = model(input_features, tokens)
        expected = reference(
            input_features=input_features.to(reference.dtype),
            decoder_input_ids=tokens,
            use_cache=False,
        ).logits
    assert full.dtype == DTYPES[run] and torch.equal(full, expected)


# The port's consts at WHISPER's sizes: a module built with its defaults is the tiny one
TINY = [
    ("(defconst vocab-size 51865)", "(defconst vocab-size 64)"),
    ("(defconst num-mel-bins 80)", "(defconst num-mel-bins 8)"),
    ("(defconst encoder-layers 4)", "(defconst encoder-layers 2)"),
    ("(defconst decoder-layers 4)", "(defconst decoder-layers 2)"),
    ("(defconst decoder-attention-heads 6)", "(defconst decoder-attention-heads 3)"),
    ("(defconst d-model 384)", "(defconst d-model 24)"),
    ("(defconst max-source-positions 1500)", "(defconst max-source-positions 10)"),
    ("(defconst pad-token-id 50256)", "(defconst pad-token-id 0)"),
]


@pytest.mark.parametrize("run, each", [("generate", 2), ("generate-exact", 4)])
def test_the_cache_is_the_decoders_self_attentions_as_explain_says(run, each):
    """explain's bytes per token against the cache a generation fills: the decoder's
    self-attentions keep their keys and values (2 layers' K and V of 24 features, bf16 or
    f32); the encoder's output and the cross-attentions' keys and values are made once
    per prompt and cost nothing per token."""
    source = lisp("whisper").read_text()
    for old, new in TINY:
        assert old in source
        source = source.replace(old, new)
    options = Options(run=run)
    report = explain.run(source + RUNS, "whisper.lisp", options)
    model = load_module(code(run, source)).Whisper()
    cache = Cache()
    with torch.no_grad(), generating(cache):
        cache.begin(0)
        model(torch.zeros(1, 8, 20), torch.zeros(1, 3, dtype=torch.long))
    assert (
        report["cache"]["bytes_per_token"]
        == cache.bytes_per_token()
        == 2 * 2 * 24 * each
    )
    assert report["cache"]["attentions"] == 2 and report["cache"]["unknown"] == 0
    # the encoder's output, and each cross-attention's keys and values
    assert len(cache.kept) == 4 and len(cache.prompt) == 1 + 2 * 2
    assert "KV cache (generate): {:,} bytes per token".format(
        cache.bytes_per_token()
    ) in explain.render(report)
