"""examples/bert.lisp is Hugging Face transformers' BertModel: its state_dict loads with
strict=True (`encoder.layer.0.attention.self.query.weight` keeps its `self`), and
forward(input_ids, token_type_ids, attention_mask) gives transformers' (last_hidden_state,
pooler_output) bit for bit under both runs, with and without padding.

transformers runs with attn_implementation="sdpa", its default: with padding its
bidirectional mask is booleans [B, 1, T, S] for F.scaled_dot_product_attention, without
padding no mask at all; the example passes the booleans [B, 1, 1, S] either way, which SDPA
broadcasts to the same scores.
"""

from __future__ import annotations

import inspect

import pytest
import torch
from transformers import BertConfig, BertModel
from transformers.models.bert import modeling_bert

from cases import lisp
from conftest import load_module
from sx2torch.compiler import Options, compile_source

SIZES = dict(
    vocab_size=128,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=96,
    max_position_embeddings=40,
)
DTYPES = {"exact": torch.float32, "train": torch.bfloat16}


def bert(run: str):
    path = lisp("bert")
    return load_module(
        compile_source(path.read_text(), path.name, Options(run=run))
    ).Bert


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """transformers' model with random weights in f32, and as from_pretrained(...,
    dtype=torch.bfloat16) loads it."""
    torch.manual_seed(0)
    f32 = BertModel(BertConfig(**SIZES, attn_implementation="sdpa")).eval()
    folder = tmp_path_factory.mktemp("bert")
    f32.save_pretrained(folder)
    bf16 = BertModel.from_pretrained(folder, dtype=torch.bfloat16).eval()
    assert bf16.encoder.layer[0].attention.self.query.weight.dtype == torch.bfloat16
    return {"exact": f32, "train": bf16}


def inputs(length: int, padded: bool) -> dict:
    generator = torch.Generator().manual_seed(length)
    attention_mask = torch.ones(2, length, dtype=torch.long)
    if padded:
        attention_mask[1, length - 4 :] = 0
    return dict(
        input_ids=torch.randint(0, 128, (2, length), generator=generator),
        token_type_ids=torch.randint(0, 2, (2, length), generator=generator),
        attention_mask=attention_mask,
    )


@pytest.mark.parametrize("length, padded", [(16, False), (11, True)])
@pytest.mark.parametrize("run", ["exact", "train"])
def test_the_real_checkpoint_loads_and_gives_the_real_outputs(
    real, run, length, padded
):
    model = bert(run)(**SIZES).eval()
    model.load_state_dict(real[run].state_dict(), strict=True)
    given = inputs(length, padded)
    with torch.no_grad():
        hidden, pooled = model(**given)
        want = real[run](**given)
    assert hidden.dtype == pooled.dtype == DTYPES[run]
    assert hidden.shape == (2, length, 64) and pooled.shape == (2, 64)
    assert torch.equal(hidden, want.last_hidden_state)
    assert torch.equal(pooled, want.pooler_output)


def test_padding_hides_the_padded_tokens(real):
    """The padded row's kept tokens are what the row alone, without its padding, gives."""
    model = bert("exact")(**SIZES).eval()
    model.load_state_dict(real["exact"].state_dict(), strict=True)
    given = inputs(11, True)
    alone = {k: v[1:, :7] for k, v in given.items()}
    with torch.no_grad():
        padded, _ = model(**given)
        short, _ = model(**alone)
    torch.testing.assert_close(padded[1:, :7], short, rtol=0, atol=1e-5)


def test_dropout_in_training_mode_draws_as_transformers_does():
    """In training mode both draw the hidden dropout from torch's generator in the same order
    (embeddings, then each layer's attention output and output); the attention probabilities'
    dropout, which the example does not write, is off in this config."""
    options = dict(SIZES, hidden_dropout_prob=0.25)
    config = BertConfig(
        **options, attention_probs_dropout_prob=0.0, attn_implementation="sdpa"
    )
    torch.manual_seed(4)
    real = BertModel(config).train()
    model = bert("exact")(**options).train()
    model.load_state_dict(real.state_dict(), strict=True)
    given = inputs(11, True)
    torch.manual_seed(5)
    hidden, pooled = model(**given)
    torch.manual_seed(5)
    want = real(**given)
    assert torch.equal(hidden, want.last_hidden_state)
    assert torch.equal(pooled, want.pooler_output)
    model.eval()
    assert not torch.equal(model(**given)[0], hidden)


def test_the_constructor_takes_bert_configs_names():
    """layer_norm_eps, type_vocab_size and intermediate_size reach the layers as they reach
    transformers'."""
    options = dict(SIZES, layer_norm_eps=1e-5, type_vocab_size=3, intermediate_size=48)
    torch.manual_seed(3)
    real = BertModel(BertConfig(**options, attn_implementation="sdpa")).eval()
    model = bert("exact")(**options).eval()
    model.load_state_dict(real.state_dict(), strict=True)
    assert model.encoder.layer[1].output.LayerNorm.eps == 1e-5
    given = inputs(9, True)
    given["token_type_ids"] = given["token_type_ids"] * 2  # types 0 and 2
    with torch.no_grad():
        assert torch.equal(model(**given)[0], real(**given).last_hidden_state)


def test_it_compiles_as_one_graph(real):
    model = bert("train")(**SIZES).eval()
    model.load_state_dict(real["train"].state_dict(), strict=True)
    given = inputs(11, True)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        for got, want in zip(compiled(**given), model(**given)):
            assert torch.equal(got, want)
    torch._dynamo.reset()


def code_lines(text: str, comment: str) -> int:
    return sum(
        1
        for line in text.splitlines()
        if line.strip() and not line.lstrip().startswith(comment)
    )


def test_the_source_is_at_most_a_third_of_transformers_model_classes():
    """Against modeling_bert's classes BertModel is made of (the cross-attention class left
    out), docstrings and cache branches counted as they stand: 393 lines in transformers 5.
    """
    classes = (
        "BertEmbeddings eager_attention_forward BertSelfAttention BertSelfOutput "
        "BertAttention BertIntermediate BertOutput BertLayer BertEncoder BertPooler BertModel"
    )
    theirs = sum(
        code_lines(inspect.getsource(getattr(modeling_bert, name)), "#")
        for name in classes.split()
    )
    ours = code_lines(lisp("bert").read_text(), ";")
    assert ours * 3 <= theirs, (ours, theirs)
