"""The ports' generate runs decode with a KV cache as transformers' generate does: the same
tokens and bit-identical logits at every one of 32 greedy steps, the f32 run against the f32
model and the bf16 run against from_pretrained(dtype=torch.bfloat16), on tiny random-weight
models built from configs (issue 36)."""

from __future__ import annotations

import pytest
import torch

from cases import GEMMA2, GENERATE_RUNS, GPT2, LLAMA, MIXTRAL, lisp
from conftest import assert_generated, greedy, load_module
from sx2torch.compiler import Options, compile_source
from sx2torch.runtime import generate

PORTS = {
    "llama": ("LlamaForCausalLM", "LlamaConfig", LLAMA),
    # room for the prompt and the 32 new tokens in the learned positions
    "gpt2": ("GPT2LMHeadModel", "GPT2Config", dict(GPT2, n_positions=64)),
    "mixtral": ("MixtralForCausalLM", "MixtralConfig", MIXTRAL),
    # soft-capped scores and a sliding window on every other layer (6 positions, less than
    # the prompt and the tokens after it)
    "gemma2": ("Gemma2ForCausalLM", "Gemma2Config", GEMMA2),
}
# sdpa, whose call the ports' attention makes (Gemma 2's eager attention, which it is meant
# to run with: soft-capped scores have no SDPA form); for Mixtral's experts the loop its
# modeling file writes, which sx.sparse_experts follows (its default, grouped_mm, sums
# otherwise)
SETTINGS = dict(attn_implementation="sdpa", experts_implementation="eager")
ATTENTION = {"gemma2": "eager"}
RUNS = {"generate-exact": torch.float32, "generate": torch.bfloat16}


def compiled(name: str, run: str):
    path = lisp(name)
    source = path.read_text() + GENERATE_RUNS
    module = load_module(compile_source(source, path.name, Options(run=run)))
    return next(
        v
        for k, v in vars(module).items()
        if k.lower() == name.replace("-", "") and isinstance(v, type)
    )


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """{(port, run): transformers' model}: random weights (away from their initial ones and
    zeros, so every parameter counts) in f32, and as from_pretrained(..., dtype=bf16)
    loads them."""
    import transformers

    models = {}
    for name, (cls, config, sizes) in PORTS.items():
        torch.manual_seed(0)
        settings = dict(SETTINGS, attn_implementation=ATTENTION.get(name, "sdpa"))
        config = getattr(transformers, config)(**sizes, **settings)
        f32 = getattr(transformers, cls)(config).eval()
        with torch.no_grad():
            for p in f32.parameters():
                p.add_(0.05 * torch.randn_like(p))
        folder = tmp_path_factory.mktemp(name)
        f32.save_pretrained(folder)
        models[name, "generate-exact"] = f32
        models[name, "generate"] = (
            getattr(transformers, cls)
            .from_pretrained(folder, dtype=torch.bfloat16, **settings)
            .eval()
        )
    return models


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
@pytest.mark.parametrize("run", RUNS)
@pytest.mark.parametrize("name", PORTS)
def test_greedy_generate_gives_transformers_tokens_and_logits_bit_for_bit(
    real, name, run, static, monkeypatch
):
    """The dynamic cache against transformers' DynamicCache; the static one, eager (the
    compiled step is tests/runtime's), against cache_implementation="static", whose bits
    differ from the dynamic one's in bf16."""
    torch.set_num_threads(1)
    reference = real[name, run]
    model = compiled(name, run)(**PORTS[name][2])
    model.load_state_dict(reference.state_dict(), strict=True)
    prompt = torch.randint(0, 256, (2, 7), generator=torch.Generator().manual_seed(1))
    want = greedy(reference, prompt, cache_implementation="static" if static else None)
    monkeypatch.setattr(torch, "compile", lambda module, **options: module)
    tokens, logits = generate(
        model, prompt, 32, return_logits=True, static_cache=static
    )
    assert len(logits) == 32 and logits[0].shape == (2, 256)
    assert_generated(tokens, logits, want)
    # without a generation running, the same module gives every position's logits
    with torch.no_grad():
        full = model(prompt)
    assert full.dtype == RUNS[run] and full.shape == (2, 7, 256)
    assert torch.equal(full, reference(prompt).logits)


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
@pytest.mark.parametrize("run", RUNS)
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_left_padded_prompts_give_each_rows_own_tokens_and_transformers_logits(
    real, name, run, static, monkeypatch
):
    """Prompts of 7 and 4 tokens, the second padded on the left: each row's tokens are those
    it generates alone, and the batch's are transformers' generate with the attention mask,
    logits bit for bit (positions from the mask, pads seen by no query): GPT-2's learned
    positions and Llama's rotary table, both per row; the static cache (eager) against
    transformers' StaticCache."""
    from transformers import StaticCache

    monkeypatch.setattr(torch, "compile", lambda module, **options: module)
    torch.set_num_threads(1)
    reference = real[name, run]
    model = compiled(name, run)(**PORTS[name][2])
    model.load_state_dict(reference.state_dict(), strict=True)
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(0, 256, (1, n), generator=g) for n in (7, 4)]
    pad = torch.zeros(1, 3, dtype=torch.long)
    ids = torch.cat([prompts[0], torch.cat([pad, prompts[1]], dim=1)])
    mask = torch.tensor([[1] * 7, [0] * 3 + [1] * 4])
    tokens, logits = generate(
        model, ids, 16, attention_mask=mask, return_logits=True, static_cache=static
    )
    for row, prompt in enumerate(prompts):
        alone = generate(model, prompt, 16, static_cache=static)
        assert torch.equal(tokens[row, 7:], alone[0, prompt.shape[1] :])
    want = reference.generate(
        ids,
        attention_mask=mask,
        do_sample=False,
        max_new_tokens=16,
        output_logits=True,
        return_dict_in_generate=True,
        pad_token_id=0,
        # its own: transformers reuses a larger static cache a test before left it
        cache=(
            StaticCache(reference.config, max_cache_len=7 + 16 - 1) if static else None
        ),
    )
    assert torch.equal(tokens, want.sequences)
    for step, (got, expected) in enumerate(zip(logits, want.logits)):
        assert torch.equal(got, expected), f"step {step}"


def test_left_padding_needs_positions_per_row():
    """Mixtral's rotary table is built from positions shared by the rows, those of the
    [batch, length, dim] embeddings ([length, dim]): a padded batch is refused when it runs,
    not given wrong positions."""
    model = compiled("mixtral", "generate-exact")(**PORTS["mixtral"][2])
    ids = torch.zeros(2, 4, dtype=torch.long)
    mask = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])
    with pytest.raises(
        ValueError, match="left-padded prompts need each row's positions"
    ):
        generate(model, ids, 2, attention_mask=mask)
