"""examples/whisper.lisp is Hugging Face transformers' WhisperForConditionalGeneration: the
encoder (two gelu convolutions, the second of stride 2, the frozen sinusoidal positions,
pre-LN layers, a final layer_norm), the decoder (token and learned position embeddings,
pre-LN self-attention with the causal mask, cross-attention to the encoder's states,
fc1/gelu/fc2, a final layer_norm), WhisperAttention's biases (k_proj has none), its
queries scaled before the product and its contiguous heads, and proj_out tied to the
token embedding. Its state_dict loads with strict=True and the logits are transformers'
own: equal under :f32 and bit for bit under :bf16 (against from_pretrained(...,
dtype=torch.bfloat16), what a user loads), at two decoder lengths. transformers runs the
eager attention, the code of modeling_whisper.py's eager_attention_forward.
"""

from __future__ import annotations

import ast
import functools
import inspect

import pytest
import torch
from transformers.models.whisper import modeling_whisper

from cases import WHISPER, lisp, whisper_f32_and_bf16
from conftest import load_module
from sx2torch.compiler import Options, compile_source

torch.set_num_threads(1)

SIZES = WHISPER
DECODER_LENGTHS = [5, 13]


@functools.cache
def whisper(run: str):
    path = lisp("whisper")
    code = compile_source(path.read_text(), path.name, Options(run=run))
    return load_module(code).Whisper


@pytest.fixture(scope="module")
def reals(tmp_path_factory):
    f32, bf16 = whisper_f32_and_bf16(tmp_path_factory.mktemp("whisper"))
    return {"exact": f32, "train": bf16}


def features(batch: int = 2) -> torch.Tensor:
    """Log-mel frames [batch, mel bins, 2 * max_source_positions], bf16 values (so that
    the bf16 model reads the same numbers)."""
    generator = torch.Generator().manual_seed(3)
    frames = 2 * SIZES["max_source_positions"]
    shape = (batch, SIZES["num_mel_bins"], frames)
    return torch.randn(shape, generator=generator).bfloat16().float()


@pytest.mark.parametrize("length", DECODER_LENGTHS)
@pytest.mark.parametrize("run", ["exact", "train"])
def test_the_real_checkpoint_loads_and_gives_the_real_logits(reals, run, length):
    model = whisper(run)(**SIZES)
    reference = reals[run]
    theirs = reference.state_dict()
    assert set(model.state_dict()) == set(theirs)
    assert "model.encoder.embed_positions.weight" in theirs
    assert "model.decoder.layers.1.encoder_attn.v_proj.bias" in theirs
    assert "model.decoder.layers.1.encoder_attn.k_proj.bias" not in theirs
    assert "proj_out.weight" in theirs
    model.load_state_dict(theirs, strict=True)
    input_features = features()
    ids = torch.randint(
        0, 64, (2, length), generator=torch.Generator().manual_seed(length)
    )
    with torch.no_grad():
        got = model(input_features, ids)
        want = reference(
            input_features=input_features.to(reference.dtype), decoder_input_ids=ids
        ).logits
    dtype = torch.float32 if run == "exact" else torch.bfloat16
    assert got.dtype == want.dtype == dtype
    assert got.shape == (2, length, 64)
    assert (got.float() - want.float()).abs().max() <= (1e-5 if run == "exact" else 0)
    assert torch.equal(got, want)


def test_a_fresh_model_has_transformers_sinusoids_frozen_and_proj_out_tied():
    """The encoder's positions are transformers' sinusoids() bit for bit, not trained (a
    buffer, where transformers' is a parameter with requires_grad False; either is in the
    state_dict); proj_out is the token embedding."""
    model = whisper("exact")(**SIZES)
    positions = model.model.encoder.embed_positions.weight
    want = modeling_whisper.sinusoids(SIZES["max_source_positions"], SIZES["d_model"])
    assert torch.equal(positions, want)
    assert not positions.requires_grad
    names = {name for name, _ in model.named_parameters()}
    assert "model.encoder.embed_positions.weight" not in names
    assert model.proj_out.weight is model.model.decoder.embed_tokens.weight


def code_lines(text: str) -> int:
    """Lines of Python without comments, docstrings and blank lines."""
    tree = ast.parse(text)
    docstrings = {
        line
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef))
        and ast.get_docstring(node, clean=False) is not None
        for line in range(node.body[0].lineno, node.body[0].end_lineno + 1)
    }
    return sum(
        1
        for number, line in enumerate(text.splitlines(), 1)
        if line.strip()
        and not line.lstrip().startswith("#")
        and number not in docstrings
    )


# transformers' code for the classes the port writes, each at its place in
# modeling_whisper.py
PORTED = (
    "sinusoids",
    "WhisperPositionalEmbedding",
    "eager_attention_forward",
    "WhisperAttention",
    "WhisperEncoderLayer",
    "WhisperDecoderLayer",
    "WhisperEncoder",
    "WhisperDecoder",
    "WhisperModel",
    "WhisperForConditionalGeneration",
)


def test_the_source_is_shorter_than_transformers():
    """transformers' code for the same classes (PORTED, with everything they hold: caches,
    masks, dropout, SpecAugment, labels and the loss) is 576 lines of modeling_whisper.py
    without comments, docstrings and blank lines; the source, which takes torch's
    nn.Linear, nn.Conv1d, nn.LayerNorm and nn.Embedding from the layer library, is 118.
    """
    theirs = sum(
        code_lines(inspect.getsource(getattr(modeling_whisper, name)))
        for name in PORTED
    )
    lines = lisp("whisper").read_text().splitlines()
    ours = [
        line for line in lines if line.strip() and not line.lstrip().startswith(";")
    ]
    assert theirs == 576 and len(ours) == 120


def test_a_fine_tuning_steps_embedding_gradient_is_transformers(reals):
    """The decoder's nn.Embedding has transformers' padding_idx (pad_token_id, 0 here):
    the pad token's rows send embed_tokens no gradient, so a fine-tuning step's gradient
    of the tied table (embed_tokens and proj_out) is transformers' own, bit for bit."""
    reference = reals["exact"]
    model = whisper("exact")(**SIZES)
    model.load_state_dict(reference.state_dict(), strict=True)
    generator = torch.Generator().manual_seed(7)
    ids = torch.randint(1, 64, (2, 6), generator=generator)
    labels = torch.randint(1, 64, (2, 6), generator=generator)
    ids[1, -3:] = SIZES["pad_token_id"]  # padded
    logits = model(features(), ids)
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten()).backward()
    try:
        theirs = reference(
            input_features=features(), decoder_input_ids=ids, use_cache=False
        ).logits
        loss = torch.nn.functional.cross_entropy(theirs.flatten(0, 1), labels.flatten())
        loss.backward()
        got = model.model.decoder.embed_tokens.weight.grad
        want = reference.model.decoder.embed_tokens.weight.grad
        assert got.dtype == want.dtype == torch.float32
        assert torch.equal(got, want)
    finally:
        reference.zero_grad(set_to_none=True)
