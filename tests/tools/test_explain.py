"""sx2torch explain: each reason at its line, and byte totals equal to the module's state_dict."""

from __future__ import annotations

import json

import pytest

from sx2torch.limits import MAX_LAYERS
from sx2torch.compiler import Options
from sx2torch.tools import explain
from sx2torch.cli import main

import torch

from cases import EXAMPLES, GENERATE_RUNS, GOLDEN, TINY_LLAMA, lisp
from conftest import load_module
from sx2torch.compiler import compile_source
from sx2torch.runtime.cache import Cache, generating

REASONS = """\
(defparam w (normal [8 8]))
(defparam gain (ones [8]) :numerics :high)
(defparam frozen (normal [8 8]) :trainable false)
(defun forward (x)
  (let ((early (exp x))
        (h (matmul early w))
        (s (with-numerics (:sensitivity :high) (tanh h)))
        (g (* h gain))
        (p (softmax g))
        (o (matmul h frozen :out :f32)))
    (+ s p o)))
(defrun train :precision :bf16)
"""


def lines_of(report: dict) -> dict:
    return {entry["line"]: entry for entry in report["lines"]}


def test_each_reason_for_f32_appears_at_its_line():
    lines = lines_of(explain.run(REASONS, "reasons.lisp"))
    assert lines[5]["reasons"] == [
        "no parameter or bf16 value has reached this value yet"
    ]
    assert lines[7]["reasons"] == [
        "sensitive mark: (with-numerics (:sensitivity :high) ...)"
    ]
    assert lines[7]["casts"] == ["h bf16 -> f32"]
    assert lines[8]["reasons"] == [":numerics :high parameter gain"]
    assert lines[9]["reasons"] == ["library mark: (softmax g)"]
    assert lines[10]["reasons"] == [
        ":out :f32 keeps the f32 accumulator of the bf16 GEMM"
    ]
    assert 6 not in lines  # an ordinary bf16 matmul is not where f32 is kept


def test_under_f32_it_lists_the_lines_of_bf16_regions():
    report = explain.run((EXAMPLES / "distill.lisp").read_text(), "distill.lisp")
    assert report["kept"] == "bf16"
    (entry,) = report["lines"]
    assert entry["line"] == 10 and entry["source"] == "(matmul x w)))"
    assert entry["reasons"] == ["bf16 region: (with-numerics (:precision :bf16) ...)"]


@pytest.mark.parametrize(
    "name",
    ["rms-mlp", "distill", "frozen-params", "submodels", "tiny-gpt", "bf16-params"],
)
def test_byte_totals_equal_the_state_dict(name, build):
    path = lisp(name)
    text = path.read_text()
    report = explain.run(text, path.name)
    module, _ = build(text, path.name)
    state = module.__dict__[module.__all__[0]]().state_dict()
    assert [p["name"] for p in report["params"]] == list(state)
    for row in report["params"]:
        tensor = state[row["name"]]
        assert list(tensor.shape) == row["shape"] and row["bytes"] == tensor.nbytes
    assert report["totals"]["all"] == sum(t.nbytes for t in state.values())
    assert (
        report["totals"]["all"]
        == report["totals"]["trainable"] + report["totals"]["frozen"]
    )


def test_text_and_json_from_the_command_line(capsys):
    assert main(["explain", str(GOLDEN / "frozen-params.lisp")]) == 0
    text = capsys.readouterr().out
    assert "Where the policy keeps f32:" in text
    assert "embed  [8, 8]  bf16 (frozen)" in text
    assert main(["explain", str(GOLDEN / "frozen-params.lisp"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report) == {
        "schema",
        "file",
        "run",
        "precision",
        "kept",
        "lines",
        "contagion",
        "reach",
        "warnings",
        "params",
        "totals",
        "casts",
        "tp",
        "cache",
    }
    assert report["totals"]["frozen"] == 8 * 8 * 2 + 8 * 4


def test_the_bytes_a_forward_casts_count_table_rows_per_id():
    """tiny-gpt casts its blocks' four matrices and the head whole, and of its embedding
    only the rows it gathers: 128 f32 elements per id, not the 512 x 128 table."""
    report = explain.run((EXAMPLES / "tiny-gpt.lisp").read_text(), "t.lisp")
    d, vocab = 128, 512
    block = d * 3 * d + d * d + d * 4 * d + 4 * d * d
    assert report["casts"] == {
        "whole": 4 * (2 * block + d * vocab),
        "per_id": 4 * d,
        "tables": 4 * vocab * d,
    }
    assert "512 bytes per id (the tables whole would be 262,144 bytes)" in (
        explain.render(report)
    )


STACKED = """\
(defmodel inner (&key (d 4))
  (defparam w (normal [d d]))
  (defparam f (zeros [d]) :trainable false)
  (defun forward (x) (matmul x w)))
(defmodel block (&key (d 4))
  (defparam w (normal [d d]))
  (defparam s (stack 3 (inner :d d)))
  (defun forward (x) (chain s (matmul x w))))
(defparam blocks (stack N (block :d 2)))
(defparam head (normal [2 3]))
(defun forward (x) (matmul (chain blocks x) head))
"""


def test_a_long_stack_is_counted_not_enumerated(build):
    """Past explain.MAX_LISTED instances, a stack's tensors are one row each, counted; the
    totals still equal the state_dict's."""
    text = STACKED.replace("N", "1100")
    report = explain.run(text, "model.lisp")
    state = build(text)[0].Model().state_dict()
    assert sum(row["count"] for row in report["params"]) == len(state)
    assert report["totals"]["all"] == sum(t.nbytes for t in state.values())
    assert report["totals"]["frozen"] == sum(
        t.nbytes for k, t in state.items() if k.endswith(".f")
    )
    assert [(p["name"], p["count"]) for p in report["params"]][:3] == [
        ("head", 1),
        ("blocks.{0..1099}.w", 1100),
        ("blocks.{0..1099}.s.0.w", 1100),
    ]


def test_explain_of_the_most_layers_a_stack_takes_reports_the_totals():
    n = MAX_LAYERS
    report = explain.run(STACKED.replace("N", str(n)), "model.lisp")
    assert len(report["params"]) == 8
    assert report["totals"] == {
        "trainable": 24 + n * (16 + 3 * 16),
        "frozen": n * 3 * 8,
        "all": 24 + n * (16 + 3 * 16 + 3 * 8),
    }


WARNED = """\
(defparam w-enc (normal [8 4]))
(defparam w-dec (normal [4 8]))
(defun forward (x) (matmul (matmul x w-enc) w-dec))
(defun loss (x)
  (let ((recon (forward x)))
    (mean (square (- x recon)))))
(defun energy (x) (with-numerics (:sensitivity :high) (sum (exp (matmul x w-enc)))))
(defun logit (x) (log (sigmoid (matmul x w-enc))))
(defrun train :precision :bf16)
"""


def test_warnings_name_their_line_the_harm_and_the_fix():
    report = explain.run(WARNED, "vae.lisp")
    found = {
        (w["line"], w["message"].split(",")[0].split(" ")[0])
        for w in report["warnings"]
    }
    assert found == {(6, "(mean"), (6, "loss"), (8, "(log")}
    for warning in report["warnings"]:
        assert "(with-numerics (:sensitivity :high) ...)" in warning["message"]
    assert "Warnings:" in explain.render(report)


def test_the_same_model_under_f32_or_in_islands_has_no_warnings():
    assert explain.run(WARNED.replace(":bf16)", ":f32)"), "vae.lisp")["warnings"] == []
    assert explain.run(lisp("tiny-gpt").read_text(), "tiny-gpt.lisp")["warnings"] == []


def test_it_shows_where_values_become_bf16_and_names_casts_by_their_form():
    report = explain.run(REASONS, "model.lisp")
    assert [(c["line"], c["cause"]) for c in report["contagion"]] == [
        (6, "(matmul early w) reads the parameter w")
    ]
    casts = [cast for line in report["lines"] for cast in line["casts"]]
    assert all(not cast.startswith(("call ", "op ")) for cast in casts)
    assert "Where values become bf16:" in explain.render(report)
    assert explain.run(REASONS.replace(":bf16)", ":f32)"), "m.lisp")["contagion"] == []


ISLAND_CALLS = """\
(defmodel expert (&key (d 8))
  (defparam w (normal [d d]))
  (defun act (h) (silu h))
  (defun forward (x) (act (matmul x w))))
(defparam router (normal [8 4]))
(defparam e (expert :d 8))
(defparam layers (stack 2 (expert :d 8)))
(defun scale (x) (* x 2.0))
(defun forward (x)
  (let ((gate (with-numerics (:sensitivity :high)
                (* (softmax (matmul x router)) (scale (e x)))))
        (deep (with-numerics (:sensitivity :high) (chain layers x)))
        (low (with-numerics (:precision :bf16) (e x))))
    (+ (e x) (sum gate :axes [-1] :keepdims true) deep low)))
(defrun train :precision :bf16)
(defrun exact :precision :f32)
"""


def test_it_names_the_defuns_an_island_reaches_into():
    """The mark stamps every node made while the body is evaluated: the sub-model called
    in the router's island computes in f32, and so does what it calls."""
    report = explain.run(ISLAND_CALLS, "router.lisp")
    reach = [(r["line"], r["computes"], r["calls"]) for r in report["reach"]]
    assert reach == [
        (10, "f32", ["e (expert.forward)", "expert.act", "router.scale"]),
        (12, "f32", ["layers (expert.forward)", "expert.act"]),
        (13, "bf16", ["e (expert.forward)", "expert.act"]),
    ]
    lines = lines_of(report)
    assert lines[3]["reasons"] == [
        "sensitive mark: called inside (with-numerics (:sensitivity :high) ...)"
    ]
    text = explain.render(report)
    assert "Calls inside with-numerics forms (they compute as the form says):" in text
    assert "f32: e (expert.forward), expert.act, router.scale" in text


def test_under_f32_an_island_reaches_nothing_worth_naming():
    report = explain.run(ISLAND_CALLS, "router.lisp", Options(run="exact"))
    assert [(r["line"], r["computes"]) for r in report["reach"]] == [(13, "bf16")]
    assert "Calls inside" not in explain.render(explain.run(REASONS, "reasons.lisp"))


def test_a_0d_parameter_and_an_empty_table_are_counted_as_the_state_dict_holds_them(
    build,
):
    """A parameter of shape [] has no first axis, and a [0 4] table no rows: explain
    counted the rows of each f32 master by its first axis and failed on both."""
    text = (
        "(defparam s (uniform []))\n(defparam t (normal [0 4]))\n"
        "(defun forward (x) (+ (* x s) (sum (take t (argmax x)))))\n"
        "(defrun train :precision :bf16)\n"
    )
    report = explain.run(text, "zero.lisp")
    module, _ = build(text, "zero.lisp")
    state = module.Zero().state_dict()
    assert {row["name"]: row["bytes"] for row in report["params"]} == {
        name: tensor.nbytes for name, tensor in state.items()
    }
    assert report["casts"]["per_id"] == 0


def tiny_llama() -> str:
    source = lisp("llama").read_text()
    for old, new in TINY_LLAMA:
        source = source.replace(old, new)
    return source + GENERATE_RUNS


@pytest.mark.parametrize(
    "name, run, target",
    [
        ("llama", "generate", "cuda"),  # bf16, 2 of 4 heads keep keys and values
        ("llama", "generate-exact", "cuda"),
        ("llama", "generate", "metal"),  # bf16 held in f32 tensors
        ("generate-cache", "chat", "cuda"),  # a window passed as a call's key, an if
    ],
)
def test_the_kv_cache_bytes_per_token_are_those_a_generation_allocates(
    name, run, target
):
    """explain's figure, read from the plan and the consts' values, against the runtime
    cache a one-token-at-a-time forward of the module built with its defaults fills."""
    source = tiny_llama() if name == "llama" else lisp(name).read_text()
    options = Options(run=run, target=target)
    report = explain.run(source, f"{name}.lisp", options)
    module = load_module(compile_source(source, f"{name}.lisp", options))
    model = getattr(module, module.__all__[0])()
    cache = Cache()
    with torch.no_grad(), generating(cache):
        cache.begin(0)
        model(torch.zeros(1, 3, dtype=torch.long))
    assert report["cache"]["bytes_per_token"] == cache.bytes_per_token() > 0
    assert report["cache"]["attentions"] == len(cache.keys)
    assert "KV cache (generate): {:,} bytes per token".format(
        cache.bytes_per_token()
    ) in explain.render(report)


def test_a_run_that_does_not_generate_has_no_cache():
    report = explain.run(lisp("llama").read_text(), "llama.lisp", Options(run="exact"))
    assert report["cache"] is None
    assert "KV cache" not in explain.render(report)


def test_a_recurrent_state_costs_no_bytes_per_token():
    """Mamba's generate run keeps conv and SSM states, whose size does not grow: explain
    reports no attention and 0 bytes per token (it read a state's op as an attention).
    """
    report = explain.run(
        lisp("mamba").read_text(), "mamba.lisp", Options(run="generate")
    )
    assert report["cache"]["attentions"] == report["cache"]["bytes_per_token"] == 0


TINY_T5 = [
    ("(defconst vocab-size 32128)", "(defconst vocab-size 64)"),
    ("(defconst d-model 512)", "(defconst d-model 16)"),
    ("(defconst d-kv 64)", "(defconst d-kv 4)"),
    ("(defconst d-ff 2048)", "(defconst d-ff 24)"),
    ("(defconst num-layers 6)", "(defconst num-layers 2)"),
    ("(defconst num-heads 8)", "(defconst num-heads 4)"),
]


def test_an_encoder_decoders_cache_is_its_decoders_self_attentions():
    """T5's generate run: the decoder's self-attentions keep their keys and values; the
    encoder and the cross-attentions' projections are made once per prompt (as the plain
    module makes them) and cost nothing per token."""
    source = lisp("t5").read_text()
    for old, new in TINY_T5:
        assert old in source
        source = source.replace(old, new)
    source += "\n(defrun generate :precision :f32 :generate decoder-input-ids)\n"
    options = Options(run="generate")
    report = explain.run(source, "t5.lisp", options)
    model = load_module(compile_source(source, "t5.lisp", options)).T5()
    cache = Cache()
    with torch.no_grad(), generating(cache):
        cache.begin(0)
        model(torch.zeros(1, 5, dtype=torch.long), torch.zeros(1, 3, dtype=torch.long))
    # 2 layers' K and V, 4 heads of 4, f32
    assert (
        report["cache"]["bytes_per_token"] == cache.bytes_per_token() == 2 * 2 * 16 * 4
    )
    assert report["cache"]["attentions"] == 2 and report["cache"]["unknown"] == 0
    assert len(cache.kept) == 4 and len(cache.prompt) == 1 + 2 * 2
