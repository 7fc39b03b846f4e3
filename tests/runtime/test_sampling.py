"""The next-token choice against transformers' own: the processor list its generate builds
(from a tiny random Llama, so that the list, its order and its min_tokens_to_keep are
transformers' choice, not this file's) and the draw of its `_sample`."""

import pytest
import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

from sx2torch.runtime.sampling import next_tokens, sampling_scores

VOCAB = 300
SEEDS = (0, 1, 2)


@pytest.fixture(scope="module")
def tiny_llama():
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=8,
        intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    return LlamaForCausalLM(config)


def transformers_scores(model, logits, **sampling):
    """What transformers' generate does to the step's f32 logits before its draw."""
    config = GenerationConfig(do_sample=True, **sampling)
    processors = model._get_logits_processor(
        generation_config=config, device=logits.device
    )
    return processors(torch.zeros(logits.shape[0], 1, dtype=torch.long), logits)


def step_logits(seed: int, from_bf16: bool) -> torch.Tensor:
    """f32 `[batch, vocab]` logits with the spread of a model's, or the f32 copy of bf16
    ones (their many ties are where a sort or a threshold could differ)."""
    draw = torch.Generator().manual_seed(1000 + seed)
    logits = 4 * torch.randn(3, VOCAB, generator=draw)
    return logits.bfloat16().float() if from_bf16 else logits


SAMPLINGS = [
    dict(temperature=0.8, top_k=50, top_p=0.9),  # the issue's
    dict(temperature=1.3, top_k=None, top_p=None),
    dict(temperature=1.0, top_k=7, top_p=None),
    dict(temperature=1.0, top_k=0, top_p=0.5),
    dict(temperature=0.5, top_k=VOCAB + 5, top_p=1.0),  # k past the vocabulary
    dict(temperature=2.0, top_k=1, top_p=0.01),
]


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=str)
@pytest.mark.parametrize("from_bf16", [False, True], ids=["f32", "bf16"])
@pytest.mark.parametrize("seed", SEEDS)
def test_scores_and_draws_are_transformers(tiny_llama, sampling, from_bf16, seed):
    logits = step_logits(seed, from_bf16)
    expected = transformers_scores(tiny_llama, logits, **sampling)
    ours = sampling_scores(logits, **sampling)
    assert torch.equal(ours, expected)

    # transformers' _sample: softmax, then multinomial from the global generator, a
    # step after another
    torch.manual_seed(seed)
    wanted = [
        torch.multinomial(torch.softmax(expected, dim=-1), num_samples=1).squeeze(1)
        for _ in range(4)
    ]
    generator = torch.Generator().manual_seed(seed)
    drawn = [
        next_tokens(logits, do_sample=True, generator=generator, **sampling)
        for _ in range(4)
    ]
    for want, got in zip(wanted, drawn):
        assert got.dtype == torch.int64 and got.shape == (3,)
        assert torch.equal(got, want)
    # each draw is from the tokens the filters kept
    for got in drawn:
        assert torch.isfinite(expected.gather(1, got[:, None])).all()


def test_a_cumulative_probability_at_the_threshold_is_removed(tiny_llama):
    # four equal scores: probabilities 1/4, cumulative 0.25 0.5 0.75 1.0 exactly, so the
    # second sits on 1 - top_p and transformers removes it with the first
    logits = torch.zeros(2, 4)
    ours = sampling_scores(logits, temperature=1.0, top_k=None, top_p=0.5)
    assert torch.equal(ours, transformers_scores(tiny_llama, logits, top_p=0.5))
    assert torch.isfinite(ours).sum(dim=-1).tolist() == [2, 2]


@pytest.mark.parametrize("seed", SEEDS)
def test_without_a_generator_the_draw_is_from_the_global_one(seed):
    logits = step_logits(seed, from_bf16=False)
    sampling = dict(temperature=0.8, top_k=50, top_p=0.9)
    torch.manual_seed(seed)
    first = next_tokens(logits, do_sample=True, generator=None, **sampling)
    seeded = torch.Generator().manual_seed(seed)
    assert torch.equal(
        first, next_tokens(logits, do_sample=True, generator=seeded, **sampling)
    )


def test_greedy_is_the_first_largest_and_ignores_the_sampling_settings():
    logits = torch.tensor([[0.0, 2.0, 2.0, -1.0], [5.0, 1.0, 5.0, 5.0]])
    chosen = next_tokens(
        logits, do_sample=False, temperature=0.1, top_k=1, top_p=0.1, generator=None
    )
    assert chosen.tolist() == [1, 0]  # transformers' argmax: the first of equal maxima


def test_top_k_none_filters_nothing():
    # transformers' generate fills an unset top_k with 50; the driver's None is no filter
    logits = step_logits(0, from_bf16=False)
    ours = sampling_scores(logits, temperature=1.0, top_k=None, top_p=None)
    assert torch.equal(ours, logits)


@pytest.mark.parametrize(
    "sampling, message",
    [
        (dict(temperature=0.0), "temperature must be greater than 0"),
        (dict(temperature=-1.0), "temperature must be greater than 0"),
        (dict(temperature="hot"), "temperature must be a number"),
        (dict(top_k=-1), "top_k must be an integer >= 0"),
        (dict(top_k=2.5), "top_k must be an integer >= 0"),
        (dict(top_p=1.5), "top_p must be between 0 and 1"),
        (dict(top_p=float("nan")), "top_p must be between 0 and 1"),
    ],
)
def test_settings_transformers_refuses_are_refused(sampling, message):
    settings = dict(temperature=1.0, top_k=None, top_p=None) | sampling
    with pytest.raises((ValueError, TypeError), match=message):
        next_tokens(torch.zeros(1, 4), do_sample=True, generator=None, **settings)
