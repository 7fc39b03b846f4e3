"""The cache pass (sx2torch/cache.py): a `:generate true` run's causal attention, positions and
last tokenwise value become the cache's ops; what mixes positions otherwise is a located
diagnostic naming the form; a run without the key is left as it is."""

from __future__ import annotations

import re

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
        ("bert", 46, "(attention (...) (...) (...) mask)"),
        # its pixels' axis 1, taken for the sequence's, are the channels a conv2d sums
        ("vit", 25, "(conv2d x weight bias :stride kernel-size)"),
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
        (
            "(matmul (softmax (matmul x (swap-axes x -1 -2))) x)",
            "multiplies two values",
        ),
    ],
)
def test_a_reduction_a_size_or_a_mask_over_the_sequence_is_refused(body, why):
    error = refused(f"(defun forward (x) {body})" + GENERATE)
    assert why in error.message and error.line == 1


def test_a_forward_without_causal_attention_has_nothing_to_cache():
    error = refused("(defun forward (x) (* x 2.0))" + GENERATE)
    assert error.line == 2 and "forward calls no causal attention" in error.message


def test_generate_is_true_false_or_an_argument_of_forward():
    with pytest.raises(
        SourceError,
        match=":generate must be true, false, or the argument of forward that grows",
    ):
        compile_string("(defun forward (x) x)\n(defrun chat :generate 1)")
    error = refused("(defun forward (x y) x)\n(defrun chat :generate ids)")
    assert error.line == 2 and error.message == (
        "run 'chat' generates 'ids', which is not an argument of forward (x y)"
    )


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


def test_mamba_caches_its_convolution_and_scan_states_in_their_dtypes():
    """The causal convolution (along the last axis of the swapped activations) and the
    selective scan (along axis 2 of [B, I, L, N]) keep their states: the convolution's in
    the dtype it reads (bf16 here), the scan's in f32, its island's; lm_head reads the
    last position."""
    path = lisp("mamba")
    cached = compile_source(path.read_text(), path.name, Options(run="generate"))
    assert cached.count("sx.cached_conv1d(") == 2
    assert cached.count("dtype=torch.bfloat16,\n            )") == 2
    assert (
        "sx.cached_linear_scan(\n            discrete_A, deltaB_u, dim=2, dtype=torch.float32\n"
        in cached
    )
    assert "self.lm_head(sx.last_position(self.backbone(input_ids), 1))" in cached


TABLES = "(defparam e (normal [16 8]))\n(defparam w (normal [8 1 3]))\n"


@pytest.mark.parametrize(
    "body, why",
    [
        # [B, L, 8] convolved as [N, C, L]: the positions are the channels
        ("(conv1d (take e ids) w :padding 2 :groups 8)", "convolves along an axis"),
        ("(slice (take e ids) :axis 1 :end 3)", "slices the sequence"),
        (
            "(slice (take e ids) :axis 1 :start 1 :end (size ids :axis 1))",
            "slices the sequence",
        ),
        # the sequence's length, read other than as the end of a slice of the positions
        ("(slice (take e ids) :axis 2 :end (size ids :axis 1))", "sequence's size"),
    ],
)
def test_a_convolution_or_slice_across_the_positions_is_refused(body, why):
    error = refused(TABLES + f"(defun forward (ids) {body})" + GENERATE)
    assert why in error.message and error.line == 3


def test_ops_along_other_axes_than_the_sequences_stay_as_they_are():
    """Followed through swap-axes: a scan along the features and a product batched over the
    positions mix none; a convolution along the swapped positions keeps its inputs."""
    body = """(let ((h (take e ids))
         (c (swap-axes (conv1d (swap-axes h 1 2) w :padding 2 :groups 8) 1 2))
         (s (linear-scan h h :axis 2))
         (p (squeeze (matmul (unsqueeze s :axis 2) (unsqueeze h :axis 3)) :axis -1)))
     (attention (+ p (slice c :axis 1 :end (size h :axis 1))) h h :causal true))"""
    cached = compile_string(
        TABLES + f"(defun forward (ids) {body})" + GENERATE, run="chat"
    )
    assert "sx.cached_conv1d(" in cached and "sx.cached_attention(" in cached
    assert "sx.linear_scan(" in cached and "cached_linear_scan" not in cached


def test_a_defun_called_with_the_sequence_on_two_axes_is_refused():
    source = (
        TABLES
        + """(defun scanned (v) (linear-scan v v :axis 1))
(defun forward (ids)
  (let ((h (take e ids)))
    (attention (scanned h) (swap-axes (scanned (swap-axes h 1 2)) 1 2) h :causal true)))"""
    )
    error = refused(source + GENERATE)
    assert "called with the sequence on different axes" in error.message
    assert error.line == 3


def test_a_defun_reached_along_many_paths_is_followed_once_per_shapes():
    """30 defuns each calling the next twice: 2^30 paths to the attention, followed once."""
    lines = ["(defun f0 (x) (attention x x x :causal true))"]
    lines += [f"(defun f{i} (x) (+ (f{i - 1} x) (f{i - 1} x)))" for i in range(1, 30)]
    source = "\n".join(lines) + "\n(defun forward (x) (f29 x))" + GENERATE
    assert "sx.cached_attention(" in compile_string(source, run="chat")


def test_a_size_made_from_the_sequences_length_is_not_a_known_one():
    """The positions flattened with the features, the axis's size is a multiple of the
    sequence's, which the pass does not take for a known size: its size as a value is
    refused as before."""
    body = "(* (attention x x x :causal true) (size (flatten x :start 1) :axis 1))"
    error = refused(f"(defun forward (x) {body})" + GENERATE)
    assert "sequence's size" in error.message and error.line == 1


@pytest.mark.parametrize(
    "body, why",
    [
        # a prefix before the positions: a cached step would put it before each chunk
        ("(concat [(take e ids) (take e ids)] :axis 1)", "concatenates along the"),
        ("(concat [(take e ids) (take e ids)] :axis -2)", "concatenates along the"),
        # [B, L, 8] padded by one before the first position, as a shift right
        ("(pad (take e ids) [0 0 1 0])", "pads along the"),
        ("(roll (take e ids) :shifts 1 :axis 1)", "rolls along the"),
        # of the flattened elements: positions come round to others
        ("(roll (take e ids) :shifts 1)", "rolls along the"),
        # the axis a const decides, which the constructor can make the sequence's
        ("(concat [(take e ids) (take e ids)] :axis k)", "along an axis that may be"),
        # an amount a const decides: the constructor can make it any
        ("(pad (take e ids) [0 0 k 0])", "pads along the sequence"),
    ],
)
def test_a_concat_pad_or_roll_along_the_sequence_is_refused(body, why):
    """Each moves the chunk's values to other positions than the cache's: refused at the
    form, named, on its line."""
    const = "(defconst k 2)\n" if re.search(r"\bk\b", body) else ""
    source = (
        TABLES
        + const
        + (
            f"(defun forward (ids)\n  (let ((h {body})) (attention h h h :causal true)))"
        )
    )
    error = refused(source + GENERATE)
    assert why in error.message and error.line == source.count("\n") + 1
    assert error.message.startswith(
        f"a :generate run cannot cache ({body.split()[0][1:]} "
    )


def test_a_concat_pad_or_roll_along_other_axes_stays_as_it_is():
    """Along the features, or of a value not made from the input, they mix no positions."""
    body = """(let ((h (take e ids))
         (f (concat [(slice h :axis 2 :end 4) (roll (slice h :axis 2 :start 4) :shifts 1 :axis 2)] :axis -1))
         (g (pad f [1 -1])))
     (attention (+ g (concat [(slice (at e 0) :end 4) (slice (at e 1) :start 4)] :axis 0)) h h :causal true))"""
    cached = compile_string(
        TABLES + f"(defun forward (ids) {body})" + GENERATE, run="chat"
    )
    assert "sx.cached_attention(" in cached
    assert "torch.cat(" in cached and "torch.roll(" in cached and "F.pad(" in cached


POSITIONED = """(defparam e (normal [16 8]))
(defparam table (normal [3 8]))
(defun forward (ids)
  (let ((q (swap-axes (reshape (take e ids) [0 0 2 4]) 1 2))
        ;; over the heads, axis 1 of [B, heads, L, 4]: not the sequence's
        (q (+ q (unsqueeze (unsqueeze (cast (positions q :axis 1) :f32) :axis -1) :axis -1)))
        ;; over the positions, axis 2 here
        (q (+ q (unsqueeze (arange-of q :axis 2) :axis -1)))
        (y (reshape (swap-axes (attention q q q :causal true) 1 2) [0 0 8])))
    ;; over axis 1 of a parameter: its columns, whatever the cache holds
    (linear (+ y (arange-of table :axis 1)) e)))
(defrun chat :precision :f32 :generate true)
"""


def test_positions_start_where_the_cache_ends_exactly_on_the_sequences_axis():
    """Positions over the axis that holds the sequence (axis 2 of the heads' layout) are
    offset by the cache's length; over another axis 1 (the heads, a parameter's columns)
    they are the plain op's. Before, every axis 1 was offset and no other: each cached
    step's logits against the whole prefix run again without a cache, step by step."""
    import torch

    from conftest import load_module
    from sx2torch.runtime import generate

    torch.set_num_threads(1)
    torch.manual_seed(0)
    module = load_module(compile_string(POSITIONED, run="chat")).Model()
    tokens = torch.randint(0, 16, (2, 3), generator=torch.Generator().manual_seed(1))
    got, logits = generate(module, tokens, 6, return_logits=True)
    with torch.no_grad():
        for step, chosen in enumerate(logits):
            prefix = got[:, : 3 + step]
            want = module(prefix)[:, -1]
            torch.testing.assert_close(chosen, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "body, why",
    [
        # the positions swapped last, [B, 8, L], as the 1-d ops take them
        (
            "(swap-axes (avg-pool1d (swap-axes (take e ids) 1 2) 2) 1 2)",
            "pools along the",
        ),
        (
            "(swap-axes (max-pool1d (swap-axes (take e ids) 1 2) 2) 1 2)",
            "pools along the",
        ),
        (
            "(swap-axes (interpolate (swap-axes (take e ids) 1 2) :scale-factor 2) 1 2)",
            "interpolates along the",
        ),
        (
            "(swap-axes (conv-transpose1d (swap-axes (take e ids) 1 2) w :groups 8) 1 2)",
            "convolves along the",
        ),
        # [B, L, 8, 1] as [N, C, H, W]: the channels a conv2d sums are the positions
        (
            "(squeeze (conv2d (unsqueeze (take e ids) :axis -1) v) :axis -1)",
            "convolves",
        ),
        ("(repeat-interleave (take e ids) :repeats 2 :axis 1)", "repeats along the"),
        # a table of 16 positions added whole: a one-token chunk would get all 16
        ("(+ (take e ids) e)", "broadcasts the sequence against a fixed size, 16"),
    ],
)
def test_what_pools_resamples_repeats_or_broadcasts_the_positions_is_refused(body, why):
    """Each computed a cached step's chunk from itself alone where the plain op reads the
    positions before it (or, broadcast against a fixed table, gave every position all its
    rows): refused at the form, named, on its line."""
    source = (
        TABLES
        + "(defparam v (normal [8 16 1 1]))\n"
        + (
            f"(defun forward (ids)\n  (let ((h {body})) (attention h h h :causal true)))"
        )
    )
    error = refused(source + GENERATE)
    assert why in error.message and error.line == 5
    assert error.message.startswith("a :generate run cannot cache (")


HEADS = (
    "(defparam e (normal [16 8]))\n"
    "(defun heads (x) (transpose (reshape x [0 0 2 4]) [0 2 1 3]))\n"
)
SCORES = "(h (heads (take e ids))) (s (matmul h (swap-axes h -1 -2)))"


@pytest.mark.parametrize(
    "bindings, result, why",
    [
        # the softmax would see every key in the whole sequence's forward
        ("", "(matmul (softmax s :axis -1) h)", "combines keys no causal mask covers"),
        (
            "",
            "(matmul (causal-mask (softmax s :axis -1)) h)",
            "combines keys no causal mask covers",
        ),
        # a bias [length, length] from the chunk's positions against [length, keys]
        (
            "(p (positions h :axis 2))"
            " (b (cast (- (unsqueeze p :axis 0) (unsqueeze p :axis 1)) :f32))",
            "(matmul (softmax (causal-mask (+ s b)) :axis -1) h)",
            "combines the chunk's positions with the cached keys'",
        ),
    ],
)
def test_attention_written_out_without_a_causal_mask_or_with_the_chunks_bias_is_refused(
    bindings, result, why
):
    error = refused(
        HEADS + f"(defun forward (ids) (let ({SCORES} {bindings}) {result}))" + GENERATE
    )
    assert why in error.message and error.line == 3


def test_positions_over_the_scores_keys_are_every_key_the_cache_holds():
    """T5's relative position bias, its queries' positions from the chunk's and its keys'
    over the scores' last axis: the plain op's there, every key stored and the chunk's.
    """
    code = compile_string(
        HEADS + f"(defun forward (ids) (let ({SCORES} (p (positions s :axis 2))"
        " (k (positions s :axis 3))"
        " (b (cast (- (unsqueeze k :axis 0) (unsqueeze p :axis 1)) :f32)))"
        " (matmul (softmax (causal-mask (+ s b)) :axis -1) h)))" + GENERATE,
        "m.lisp",
        run="chat",
    )
    assert "p = sx.cache_positions(s, 2)" in code
    assert "k = torch.arange(s.shape[3]" in code
    assert "sx.cached_causal_mask(s + b.to(torch.bfloat16))" in code


PROMPTED = """(defparam e (normal [16 8]))
(defparam w (normal [8 8]))
(defmodel mix () (defun forward (a b) (+ a b)))
(defparam m (mix))
(defparam n (mix))
(defun encode (prompt) (mean (matmul (take e prompt) w) :axes [1] :keepdims true))
(defun forward (prompt ids)
  (let ((h (take e ids))
        (h (m h h))
        (h (n h (encode prompt))))
    (matmul (attention h h h :causal true) (transpose e [1 0]))))
(defrun chat :precision :f32 :generate ids)
"""


def test_a_call_of_the_prompt_alone_is_made_once_and_one_class_serves_both_roles():
    """`(encode prompt)` reads no value of the sequence: made once per prompt (its mean
    over the prompt's positions is no sequence's). `mix` is reached through the sequence
    twice and through the prompt once, rewritten alike: one class. The tokens and each
    step's logits are those of the whole forward run again on the prefix."""
    import torch
    from conftest import load_module
    from sx2torch.runtime import generate

    code = compile_string(PROMPTED, "m.lisp", run="chat")
    assert "h = self.n(h, sx.once(self.encode, prompt))" in code
    assert code.count("class ") == 2  # Mix and the top model's
    model = load_module(code).M()
    calls = []
    encode = model.encode
    model.encode = lambda prompt: calls.append(1) or encode(prompt)
    prompt = torch.randint(0, 16, (2, 6), generator=torch.Generator().manual_seed(0))
    start = torch.randint(0, 16, (2, 3), generator=torch.Generator().manual_seed(1))
    tokens, logits = generate(
        lambda ids: model(prompt, ids), start, 6, return_logits=True
    )
    assert len(calls) == 1
    prefix = start
    with torch.no_grad():
        for step in range(6):
            last = model(prompt, prefix)[:, -1]
            torch.testing.assert_close(logits[step], last, rtol=0, atol=1e-5)
            prefix = torch.cat([prefix, last.argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(tokens, prefix)


FLAGGED = """(defparam e (normal [16 8]))
(defmodel att (&key (causal true))
  (defun forward (h)
    (let ((s (matmul h (swap-axes h -1 -2))))
      (matmul (softmax (if causal (causal-mask s) s) :axis -1) h))))
(defparam a (att))
(defun forward (ids)
  (let ((h (take e ids)))
    (matmul (+ h (a h)) (transpose e [1 0]))))
(defrun chat :precision :f32 :generate true)
"""


def test_a_causal_mask_a_flag_leaves_out_is_refused_when_the_module_generates():
    """Whether the written-out attention is masked is the constructor's to decide, so the
    compiler cannot refuse it: a generation with the mask left out is an error when the
    module runs (its cached step would see fewer keys than the whole forward), one with the
    mask gives the tokens of re-running the prefix."""
    import torch
    from conftest import load_module
    from sx2torch.runtime import generate

    module = load_module(compile_string(FLAGGED, "m.lisp", run="chat"))
    start = torch.randint(0, 16, (2, 3), generator=torch.Generator().manual_seed(1))
    unmasked = module.M()
    unmasked.a = module.Att(causal=False)
    with pytest.raises(ValueError, match="no causal mask covered"):
        generate(unmasked, start, 4)
    model = module.M()
    tokens = generate(model, start, 4)
    prefix = start
    with torch.no_grad():
        for _ in range(4):
            prefix = torch.cat([prefix, model(prefix)[:, -1:].argmax(-1)], dim=1)
    assert torch.equal(tokens, prefix)
