"""Attention written out as matmuls generates with a KV cache (issue 36): GPT-2's port with
its attention as transformers' `eager_attention_forward` writes it gives transformers' eager
generate bit for bit, and tiny-gpt's `causal-attention` (the library's written-out attention)
the tokens of re-running the prefix."""

from __future__ import annotations

import pytest
import torch

from cases import GENERATE_RUNS, GPT2, f32_and_bf16, lisp
from conftest import assert_generated, compiled_once, greedy, load_module
from sx2torch.compiler import Options, compile_source
from sx2torch.runtime import generate

# GPT2Attention through eager_attention_forward: the scores scaled by head_dim ** -0.5, the
# causal mask, the softmax in the scores' dtype, its product with V
SDPA = "(attn-output (attention query key value :causal true))"
WRITTEN = (
    "(scores (* (matmul query (swap-axes key -1 -2)) (** (// embed-dim num-heads) -0.5)))\n"
    "(attn-output (matmul (softmax (causal-mask scores) :axis -1 :dtype :input) value))"
)
SIZES = dict(GPT2, n_positions=64)  # the prompt and 32 tokens in the learned positions
RUNS = {"generate-exact": torch.float32, "generate": torch.bfloat16}


def written_gpt2(run: str) -> str:
    source = lisp("gpt2").read_text()
    assert SDPA in source
    return compile_source(
        source.replace(SDPA, WRITTEN) + GENERATE_RUNS, "gpt2.lisp", Options(run=run)
    )


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """transformers' GPT-2 with eager attention: {run: the f32 model, or the bf16 one}."""
    import transformers

    torch.manual_seed(0)
    settings = dict(attn_implementation="eager")
    config = transformers.GPT2Config(**SIZES, **settings)
    f32, bf16 = f32_and_bf16(
        transformers.GPT2LMHeadModel(config).eval(),
        tmp_path_factory.mktemp("gpt2"),
        **settings,
    )
    return {"generate-exact": f32, "generate": bf16}


def test_the_products_keep_their_keys_and_the_mask_is_the_caches():
    code = "".join(written_gpt2("generate").split())  # as black lays it out or not
    for call in (
        "sx.cached_matmul(query,key.transpose(-1,-2),keys=-1,dtype=torch.bfloat16)",
        "sx.cached_matmul(torch.softmax(sx.cached_causal_mask(scores),dim=-1),value,"
        "keys=-2,dtype=torch.bfloat16,)",
        "sx.last_position(",
    ):
        assert call in code


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
@pytest.mark.parametrize("run", RUNS)
def test_written_out_attention_generates_transformers_eager_tokens_and_logits(
    real, run, static, monkeypatch
):
    torch.set_num_threads(1)
    reference = real[run]
    model = load_module(written_gpt2(run)).Gpt2(**SIZES)
    model.load_state_dict(reference.state_dict(), strict=True)
    prompt = torch.randint(0, 256, (2, 7), generator=torch.Generator().manual_seed(1))
    want = greedy(reference, prompt, cache_implementation="static" if static else None)
    monkeypatch.setattr(torch, "compile", lambda module, **options: module)
    tokens, logits = generate(
        model, prompt, 32, return_logits=True, static_cache=static
    )
    assert len(logits) == 32
    assert_generated(tokens, logits, want)
    with torch.no_grad():  # without a generation, every position, as before
        full = model(prompt)
    assert full.dtype == RUNS[run]
    assert torch.equal(full, reference(prompt, use_cache=False).logits)


def test_left_padded_prompts_are_refused_by_attention_without_a_pad_mask():
    model = load_module(written_gpt2("generate-exact")).Gpt2(**SIZES)
    prompt = torch.ones(2, 4, dtype=torch.long)
    mask = torch.tensor([[1, 1, 1, 1], [0, 1, 1, 1]])
    with pytest.raises(ValueError, match="give prompts of one length"):
        generate(model, prompt, 2, attention_mask=mask)


def test_tiny_gpts_causal_attention_generates_the_tokens_of_re_running_the_prefix():
    """The library's causal-attention, cached and written out in the method: each step's
    logits are the whole prefix's forward's last (within f32 rounding: a one-row product
    sums as the whole block's does not), and so are the tokens."""
    source = lisp("tiny-gpt").read_text() + GENERATE_RUNS
    code = compile_source(source, "tiny-gpt.lisp", Options(run="generate-exact"))
    assert "def causal_attention(" not in code and "sx.cached_causal_mask(" in code
    torch.manual_seed(0)
    model = load_module(code).TinyGpt(vocab=64, d=32, n_head=2, n_layer=2).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    prompt = torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(1))
    tokens, logits = generate(model, prompt, 12, return_logits=True)
    prefix = prompt
    with torch.no_grad():
        for step in range(12):
            last = model(prefix)[:, -1]
            torch.testing.assert_close(logits[step], last, rtol=0, atol=1e-5)
            prefix = torch.cat([prefix, last.argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(tokens, prefix)


def test_the_static_decode_of_attention_written_out_compiles_once(monkeypatch):
    """Its keys and values written in place at the step's position, its mask from the
    position tensor: one graph serves every step (error_on_recompile), counted by a backend
    that runs it as torch does, fullgraph (no break); tokens and logits the uncompiled
    static cache's, bit for bit."""
    torch.set_num_threads(1)
    model = load_module(written_gpt2("generate-exact")).Gpt2(**SIZES).eval()
    prompt = torch.randint(0, 256, (2, 5), generator=torch.Generator().manual_seed(2))
    eager, (tokens, logits), graphs = compiled_once(
        monkeypatch,
        lambda: generate(model, prompt, 12, static_cache=True, return_logits=True),
    )
    assert len(graphs) == 1
    assert torch.equal(tokens, eager[0])
    assert all(torch.equal(a, b) for a, b in zip(logits, eager[1], strict=True))
