"""The policy's decisions, read directly: each node's compute dtype, output dtype and reason."""

from __future__ import annotations

import pytest

from sx2torch import compiler
from sx2torch.compiler import Options, Unit
from sx2torch.ir import Kind, walk
from sx2torch.policy.rules import ParamRef, Why

SOURCE = """
(defparam w (normal [4 4]))
(defparam h (normal [4]) :numerics :high)
(defun inner (x) (exp x))
(defun forward (x)
  (let ((a (tanh x))
        (b (matmul a w))
        (c (with-numerics (:sensitivity :high) (sigmoid b)))
        (d (* c h))
        (e (matmul b w :out :f32))
        (f (cast e :bf16))
        (g (with-numerics (:sensitivity :high) (inner f))))
    (+ a b c d e f g)))
"""


def lower(source: str, precision: str):
    """The policy's output, the passes before it run as a compile runs them, for a defrun
    of `precision`."""
    text = f"{source}\n(defrun r :precision :{precision})\n"
    return compiler.run(Unit(text, "model.lisp", Options()), until="policy").lowered


def decisions(precision: str) -> dict:
    lowered = lower(SOURCE, precision)
    found = {}
    for typed in lowered.specializations:
        for node in walk(typed.graph.nodes):
            if node.name is not None and node.kind is not Kind.PARAM:
                decided = typed.decided[node]
                found[typed.graph.name, node.name] = (
                    decided.compute,
                    decided.dtype,
                    decided.reason,
                )
            if node.kind is Kind.OP and node.op.name == "exp":
                found[typed.graph.name, typed.ambient] = typed.decided[node].reason
    return found


def test_bf16_decisions_and_their_reasons():
    found = decisions("bf16")
    assert found["forward", "a"][:2] == ("f32", "f32")
    assert found["forward", "a"][2].why is Why.NOT_YET
    assert found["forward", "b"][:2] == ("bf16", "bf16")
    assert found["forward", "b"][2].why is Why.CONTAGION
    compute, out, reason = found["forward", "c"]
    assert (compute, out, reason.why) == ("f32", "f32", Why.MARK)
    assert reason.frame.text == "(with-numerics (:sensitivity :high) ...)"
    assert found["forward", "d"][2].why is Why.HIGH
    assert found["forward", "d"][2].param == "h"
    assert found["forward", "e"][:2] == ("bf16", "f32")
    assert found["forward", "e"][2].why is Why.OUT_F32
    assert found["forward", "f"][2].why is Why.CAST
    assert found["inner", "island"].why is Why.CALLED_IN


def test_under_f32_the_policy_is_the_reason():
    found = decisions("f32")
    assert found["forward", "a"][2].why is Why.POLICY
    assert found["forward", "b"][:2] == ("f32", "f32")


def test_a_parameter_read_is_typed_by_its_reference_until_read():
    lowered = lower(SOURCE, "bf16")
    (forward,) = [t for t in lowered.specializations if t.graph.name == "forward"]
    params = {
        n.attrs["param"]: forward.decided[n].dtype
        for n in forward.graph.nodes
        if n.kind is Kind.PARAM
    }
    assert params == {"w": ParamRef("model", "w"), "h": ParamRef("model", "h")}
    assert lowered.storage == {("model", "w"): "f32", ("model", "h"): "f32"}


@pytest.mark.parametrize("precision", ["bf16", "f32"])
def test_every_op_node_has_a_reason(precision):
    lowered = lower(SOURCE, precision)
    for typed in lowered.specializations:
        for node in walk(typed.graph.nodes):
            if node.kind in (Kind.OP, Kind.CAST):
                assert typed.decided[node].reason is not None, node


def test_a_value_read_from_an_out_f32_matmul_says_so():
    source = """
(defparam w (normal [4 4]))
(defparam v (normal [4 4]))
(defun forward (x)
  (let ((y (matmul x w :out :f32))
        (z (* y y))
        (u (tanh x)))
    (+ (matmul z v) u)))
"""
    (typed,) = lower(source, "bf16").specializations
    why = {
        n.name: typed.decided[n].reason.why
        for n in typed.graph.nodes
        if typed.decided[n].reason is not None
    }
    assert why["y"] is Why.OUT_F32
    assert why["z"] is Why.AFTER_OUT_F32
    assert why["u"] is Why.NOT_YET


OUTLINED = """
(defparam w (normal [4 4]))
(defun half (x) (rms-norm (cast x :bf16)))
(defun forward (x)
  (let ((y (rms-norm (matmul x w :out :f32))))
    (+ (tanh y) (half x))))
"""


def test_each_graph_is_typed_once_where_library_uses_become_calls(monkeypatch):
    """Outlining `rms-norm` types its calls and specializes its function at them; no
    specialization is made twice (the policy typed every graph again after outlining).
    """
    import sx2torch.policy.rules as rules

    made: list = []

    class Counted(rules.Typed):
        def __init__(self, graph, signature, ambient=None):
            super().__init__(graph, signature, ambient)
            made.append((graph.model, graph.name, signature, ambient))

    monkeypatch.setattr(rules, "Typed", Counted)
    lowered = lower(OUTLINED, "bf16")
    calls = [
        (typed.graph.name, typed.callee[node].signature)
        for typed in lowered.specializations
        for node in walk(typed.graph.nodes)
        if node.kind is Kind.CALL and node.attrs.get("library")
    ]
    assert sorted(calls) == [("forward", ("f32",)), ("half", ("bf16",))]
    assert len(made) == len(set(made)) == len(lowered.specializations)


def test_a_library_call_s_reader_is_typed_as_any_call_s_reader():
    """`(tanh y)` reads a call's value, which has no reason: the f32 result of the :out
    :f32 matmul reaches it only through the outlined rms-norm, as through a defun's call.
    """
    lowered = lower(OUTLINED, "bf16")
    (forward,) = [t for t in lowered.specializations if t.graph.name == "forward"]
    (tanh,) = [n for n in walk(forward.graph.nodes) if n.what == "tanh"]
    decided = forward.decided[tanh]
    assert (decided.dtype, decided.compute, decided.reason.why) == (
        "f32",
        "f32",
        Why.NOT_YET,
    )


MIXED = (
    "(defun forward (x)\n  (+ x (* 2.0 x) (sin x) x (* 2.0 x) (sin x)))\n"
    "(defrun train :precision :bf16)\n"
)


def test_an_op_s_operand_kinds_are_looked_up_once_per_rule(monkeypatch):
    """Typing an op looks its operands' kinds up once, for all its checks (each operand's
    kind was looked up three or four times, a tenth of a long expression's typing)."""
    import sx2torch.policy.rules as rules

    one_by_one: list = []
    kind = rules._kind

    def counted(op, index):
        one_by_one.append(op)
        return kind(op, index)

    monkeypatch.setattr(rules, "_kind", counted)
    lowered = lower(MIXED, "bf16")
    assert (
        one_by_one == []
    )  # the policy asks for each node's kinds together (`Op.kinds`)
    (forward,) = lowered.specializations
    ops = [n for n in forward.graph.nodes if n.kind is Kind.OP]
    # typed all the same: no parameter or bf16 value reaches them
    assert {
        (forward.decided[n].compute, forward.decided[n].reason.why) for n in ops
    } == {("f32", Why.NOT_YET)}


def test_the_arguments_reaching_each_kind_are_found_in_one_walk(monkeypatch):
    """Which arguments reach integer operands, conditions and masks is found in one walk
    of each graph for all three (it was one walk per kind)."""
    import sx2torch.policy.rules as rules

    asked: list = []
    wants = rules._Reaching._wants

    def counted(self, node, *args):
        asked.append(node)
        return wants(self, node, *args)

    monkeypatch.setattr(rules._Reaching, "_wants", counted)
    lowered = lower(MIXED, "bf16")
    (forward,) = lowered.specializations
    assert sorted(map(id, asked)) == sorted(map(id, forward.graph.nodes))
