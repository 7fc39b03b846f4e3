"""The shard pass: the tensor-parallel plan derived from the graphs (docs/LANGUAGE.md, "Tensor
parallelism"). The Llama port's plan is transformers' own (LlamaConfig.base_model_tp_plan,
lm_head colwise_gather_output); an op that needs a split value whole keeps its group's
weights whole and says which op, where; the plan reaches the module, explain and the dump.
"""

from __future__ import annotations

import pytest

from cases import lisp
from sx2torch import compiler
from sx2torch.compiler import Options, Unit, compile_source
from sx2torch.errors import SourceError
from sx2torch.tools import explain

LAYER = """\
(defmodel linear-layer (&key (in-features 8) (out-features 8))
  (defparam weight (normal [out-features in-features] :std 0.02))
  (defun forward (x) (linear x weight)))
"""


def mlp(body: str, top: str = "(defun forward (x) (block x))\n") -> str:
    return (
        LAYER + "(defmodel mlp (&key (dim 8) (hidden 16))\n"
        "  (defparam up (linear-layer :in-features dim :out-features hidden))\n"
        "  (defparam down (linear-layer :in-features hidden :out-features dim))\n"
        f"  (defun forward (x) {body}))\n"
        "(defparam block (mlp))\n" + top
    )


def plan(text: str, filename: str = "net.lisp", run=None):
    unit = Unit(text, filename, Options(run=run))
    return compiler.run(unit, until="shard").tp


def entries(text: str) -> dict:
    return {e.path: (e.style, e.reason) for e in plan(text).entries}


def test_the_llama_port_s_plan_is_transformers_own():
    from transformers import LlamaConfig, LlamaForCausalLM

    path = lisp("llama")
    got = plan(path.read_text(), path.name).styles
    want = {f"model.{k}": v for k, v in LlamaConfig.base_model_tp_plan.items()}
    want.update(LlamaForCausalLM._tp_plan)
    assert got == want


def test_a_pointwise_op_between_keeps_the_split():
    got = entries(mlp("(down (relu (up x)))"))
    assert got["block.up"] == ("colwise", "")
    assert got["block.down"] == ("rowwise", "")


def test_a_norm_over_the_features_keeps_the_group_whole_and_says_where():
    body = "(let ((h (up x))) (down (/ h (mean h :axes [-1] :keepdims true))))"
    got = entries(mlp(body))
    style, reason = got["block.up"]
    assert style is None and got["block.down"][0] is None
    assert reason.startswith("mean in mlp.forward at 7:51 needs all of it")


def test_a_reshape_naming_the_head_count_keeps_the_group_whole():
    body = "(down (reshape (relu (reshape (up x) [0 4 4])) [0 16]))"
    style, reason = entries(mlp(body))["block.up"]
    assert style is None
    assert reason.startswith("reshape in mlp.forward at 7:43: ")
    assert "write -1" in reason


def test_heads_split_with_minus_one_and_merged_back_keep_the_split():
    body = "(down (reshape (relu (reshape (up x) [0 -1 4])) [0 -1]))"
    got = entries(mlp(body))
    assert got["block.up"][0] == "colwise" and got["block.down"][0] == "rowwise"


def test_the_heads_a_split_output_makes_are_recorded_with_their_size():
    # the head's size a number or the calling model's const, which tensor_parallel reads
    # from the built module to check that each device holds whole heads
    for size, want in (("4", (4,)), ("dim", ("dim",))):
        body = f"(down (reshape (relu (reshape (up x) [0 -1 {size}])) [0 -1]))"
        got = {e.path: e for e in plan(mlp(body)).entries}
        up = got["block.up"]
        assert up.style == "colwise" and up.owner == "mlp"
        assert tuple(s.value if s.op == "lit" else s.args[0] for s in up.heads) == want
        assert got["block.down"].heads == ()  # its columns are the heads merged back
    got = {e.path: e for e in plan(mlp("(down (relu (up x)))")).entries}
    assert got["block.up"].heads == ()  # no heads: its rows split evenly is enough


def test_a_head_size_computed_from_consts_keeps_the_group_whole():
    body = "(down (reshape (relu (reshape (up x) [0 -1 (// dim 2)])) [0 -1]))"
    style, reason = entries(mlp(body))["block.up"]
    assert style is None
    assert reason.startswith("reshape in mlp.forward at 7:43: its heads' size is neither")


def test_a_frozen_weight_is_a_buffer_torch_s_styles_do_not_split():
    frozen = mlp("(down (relu (up x)))").replace(
        ":std 0.02))", ":std 0.02) :trainable false)", 1
    )
    assert ":trainable false" in frozen
    assert plan(frozen).styles == {}


def test_a_layer_called_on_a_whole_and_on_a_split_input_stays_whole():
    body = "(down (+ (relu (up x)) (down (up x))))"
    assert entries(mlp(body))["block.down"][0] is None


def test_logits_returned_split_are_gathered_unless_tied():
    top = (
        "(defparam head (linear-layer :in-features 8 :out-features 32))\n"
        "(defun forward (x) (head (block x)))\n"
    )
    style, reason = entries(mlp("(down (relu (up x)))", top))["head"]
    assert style == "colwise_gather_output"
    assert reason == "submodel in net.forward at 10:20 returns it split"
    tied = top + "(defparam wte (normal [32 8]))\n(tie head.weight wte)\n"
    style, reason = entries(mlp("(down (relu (up x)))", tied))["head"]
    assert style is None and "its weight is tied: (tie head.weight wte)" in reason


def test_raw_parameter_matmuls_stay_whole_and_the_module_has_no_plan():
    path = lisp("tiny-gpt")
    tp = plan(path.read_text(), path.name)
    assert tp.styles == {} and tp.whole
    assert all("no linear layer" in e.reason for e in tp.whole)
    assert "TP_PLAN" not in compile_source(path.read_text(), path.name)


def test_the_module_says_the_plan_and_the_reduction():
    text = mlp("(down (relu (up x)))") + "(defrun train :precision :bf16)\n"
    code = compile_source(text, "net.lisp")
    assert 'TP_PLAN = {"block.up": "colwise", "block.down": "rowwise"}' in code
    assert 'TP_REDUCE = "f32"' in code
    assert "rowwise layers all-reduce f32 partial sums, rounded once." in code
    text += "(defrun tp :precision :bf16 :tp-reduce :bf16)\n"
    code = compile_source(text, "net.lisp", Options(run="tp"))
    assert 'TP_REDUCE = "bf16"' in code
    assert "rowwise layers all-reduce partial products rounded to bf16." in code


def test_an_unknown_reduction_is_a_located_diagnostic():
    text = mlp("(down (up x))") + "(defrun tp :precision :bf16 :tp-reduce :f16)\n"
    with pytest.raises(SourceError) as caught:
        compile_source(text, "net.lisp")
    line, col = caught.value.span.line, caught.value.span.col
    assert (line, col) == (10, 40)  # the :f16
    assert ":tp-reduce" in caught.value.message


@pytest.mark.parametrize("run, each", [("exact", 4), ("train", 4), ("tp", 2)])
def test_explain_shows_the_bytes_each_reduction_moves(run, each):
    text = mlp("(down (relu (up x)))") + (
        "(defrun exact)\n(defrun train :precision :bf16)\n"
        "(defrun tp :precision :bf16 :tp-reduce :bf16)\n"
    )
    report = explain.run(text, "net.lisp", Options(run=run))
    (down,) = [s for s in report["tp"]["split"] if s["style"] == "rowwise"]
    assert down["module"] == "block.down"
    assert down["bytes_per_token"] == 8 * each  # dim features, once
    assert report["tp"]["whole"] == []
    text_report = explain.render(report)
    assert f"block.down  rowwise  {8 * each} bytes per token" in text_report


def test_the_dump_prints_the_plan(capsys):
    from sx2torch.cli import main

    path = lisp("llama")
    assert main([str(path), "--dump-after", "shard"]) == 0
    out = capsys.readouterr().out
    assert "model.layers.*.self_attn.o_proj: rowwise\n" in out
    assert "model.norm.weight: whole  (read by llama-rms-norm" in out
