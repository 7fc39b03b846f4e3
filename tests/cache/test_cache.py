"""The cache pass (sx2torch/cache.py): a `:generate true` run's causal attention, positions and
last tokenwise value become the cache's ops; what mixes positions otherwise is a located
diagnostic naming the form; a run without the key is left as it is."""

from __future__ import annotations

import pytest

from cases import GENERATE_RUNS, lisp
from sx2torch.api import compile_string
from sx2torch.compiler import Options, compile_source
from sx2torch.errors import SourceError

GENERATE = "\n(defrun chat :precision :bf16 :generate true)\n"


def refused(text: str, filename: str = "m.lisp") -> SourceError:
    with pytest.raises(SourceError) as caught:
        compile_string(text, filename, run="chat")
    return caught.value


@pytest.mark.parametrize(
    "name, line, form",
    [
        # the encoders asked to generate: bidirectional attention
        ("bert", 49, "(attention (...) (...) (...) mask)"),
        ("vit", 56, "(attention query key value)"),
        # a scan carries its value along the sequence: its state is not cached yet
        ("scan", 12, "(linear-scan a b :axis 1)"),
    ],
)
def test_what_mixes_positions_is_a_located_diagnostic_naming_the_form(name, line, form):
    path = lisp(name)
    error = refused(path.read_text() + GENERATE, path.name)
    assert (error.line, error.filename) == (line, path.name)
    assert f"a :generate run cannot cache {form}: it " in str(error)
    assert str(error).startswith(f"{path.name}:{line}:")


@pytest.mark.parametrize(
    "body, why",
    [
        ("(mean (attention x x x :causal true) :axes [1])", "combines values along"),
        ("(* (attention x x x :causal true) (size x :axis 1))", "sequence's size"),
        ("(attention x x x (> x 0.0) :causal true)", "has a mask"),
        # attention written out: the product of queries and keys
        ("(matmul (softmax (matmul x (swap-axes x -1 -2))) x)", "multiplies two values"),
    ],
)
def test_a_reduction_a_size_or_a_mask_over_the_sequence_is_refused(body, why):
    error = refused(f"(defun forward (x) {body})" + GENERATE)
    assert why in error.message and error.line == 1


def test_a_forward_without_causal_attention_has_nothing_to_cache():
    error = refused("(defun forward (x) (* x 2.0))" + GENERATE)
    assert error.line == 2 and "forward calls no causal attention" in error.message


def test_generate_is_true_or_false():
    with pytest.raises(SourceError, match=":generate must be true or false"):
        compile_string("(defun forward (x) x)\n(defrun chat :generate 1)")


def test_a_run_without_generate_keeps_the_plain_ops():
    path = lisp("gpt2")
    source = path.read_text() + GENERATE_RUNS
    plain = compile_source(source, path.name, Options(run="exact"))
    cached = compile_source(source, path.name, Options(run="generate-exact"))
    assert "sx.cached_attention" not in plain and "sx.last_position" not in plain
    assert "sx.cached_attention(query, key, value, dtype=torch.float32)" in cached
    assert "self.wpe(sx.cache_positions(input_ids, 1))" in cached
    assert "self.lm_head(sx.last_position(self.transformer(input_ids), 1))" in cached


def test_a_soft_capped_attention_is_cached_with_its_cap():
    """Gemma 2's attention, `(attention ... :softcap C)`: its sliding and full layers each
    keep their keys, the cap and the window passed to the cache's eager attention."""
    path = lisp("gemma2")
    cached = compile_source(
        path.read_text() + GENERATE_RUNS, path.name, Options(run="generate")
    )
    assert cached.count("sx.cached_attention(") == 2
    assert "window=self.window - 1,\n                softcap=self.softcap," in cached
    assert "sx.eager_attention" not in cached


def test_dump_after_cache_shows_the_cached_ops():
    path = lisp("llama")
    dumped = compile_source(
        path.read_text() + GENERATE_RUNS,
        path.name,
        Options(run="generate", dump_after="cache"),
    )
    for op in ("cached-attention", "cached-arange-of", "last-position"):
        assert op in dumped
