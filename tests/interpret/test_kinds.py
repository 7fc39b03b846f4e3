"""The interpreter's precision kinds against the registry's. The interpreter declares its own
(sx2torch/interpret/ops.py), from the rules rather than the compiler's tables, so that the
difference test compares two readings of docs/LANGUAGE.md; this test ties the two readings
together op by op, so that neither changes alone: each op's kind, and which of its operands
decide no dtype."""

from __future__ import annotations

import torch

import sx2torch.interpret as interpret
import sx2torch.interpret.ops as interpreted
from sx2torch.ops.registry import REGISTRY, ArgKind, Result

# The interpreter's kind for each of the registry's results. An int result (positions, a
# size, argmax) is the interpreter's KEEP: what it reads decides no float dtype, and its
# integers pass through.
KIND = {
    Result.FLOAT: interpreted.FLOAT,
    Result.BOOL: interpreted.BOOL,
    Result.KEEP: interpreted.KEEP,
    Result.INT: interpreted.KEEP,
    # a sum: floats in the dtype decided, integers and booleans into torch's int64
    Result.SUM: interpreted.KEEP,
    Result.RUN: interpreted.RUN,
}
# Where the two words differ but the values agree, each with why. The interpreter's KEEP
# casts a float operand to the dtype decided as FLOAT does, and only leaves the result
# uncast after the op, which these ops make in their operand's dtype anyway.
APART = {
    # X with the entries above the diagonal filled: moved, not computed
    "causal-mask": (Result.FLOAT, interpreted.KEEP),
    # (values, indices): the values are X's in the dtype decided, the indices integers,
    # and the interpreter casts no tuple after an op
    "topk": (Result.FLOAT, interpreted.KEEP),
}


def kind(name: str, keys: dict) -> str:
    """The interpreter's kind the registry's entry says: an island where it is sensitive
    (with `keys`, the source's keywords: softmax's :dtype)."""
    op = REGISTRY[name]
    attrs = {k.name: keys.get(k.name, k.default) for k in op.keys}
    return interpreted.ISLAND if op.is_sensitive(attrs) else KIND[op.result]


def test_each_interpreted_op_has_the_registry_s_precision_kind():
    differ = {
        name: (REGISTRY[name].result, spec.kind_of({}))
        for name, spec in interpreted.OPS.items()
        if spec.kind_of({}) != kind(name, {})
    }
    assert differ == APART
    # the interpreter reads a keyword as ":input", the registry's attrs as "input"
    assert kind("softmax", {"dtype": "input"}) == interpreted.FLOAT
    assert interpreted.OPS["softmax"].kind_of({"dtype": ":input"}) == interpreted.FLOAT


# The registry's argument kinds whose operands decide no dtype and are never cast: read for
# their shape or as they are, integer ids, a condition, an additive or boolean mask, an
# equation. The interpreter's `skip` names those positions.
UNDECIDING = {
    ArgKind.LIKE,
    ArgKind.AS_IS,
    ArgKind.IDS,
    ArgKind.BOOL_TENSOR,
    ArgKind.MASK,
    ArgKind.EQUATION,
}


def test_each_interpreted_op_skips_the_operands_the_registry_says_decide_no_dtype():
    """`len` read its tensor as a TENSOR in the registry (cast where the policy decided a
    dtype, and refused by a gradient through it) and for its shape alone here."""
    differ = {
        name: (sorted(spec.skip), sorted(deciding_none))
        for name, spec in interpreted.OPS.items()
        for deciding_none in [
            {i for i, a in enumerate(REGISTRY[name].args) if a.kind in UNDECIDING}
        ]
        if set(spec.skip) != deciding_none
    }
    assert differ == {}


def test_integer_arithmetic_stays_integer():
    """`(+ (positions ids) 1)` indexes a table, as the module's `torch.arange(...) + 1`
    does: the interpreter made the sum a float (`+` was FLOAT, the registry's KEEP) and
    the gather failed."""
    source = """
(defparam wpe (normal [8 4] :std 0.02))
(defun forward (ids)
  (take wpe (- (+ (positions ids :axis 1) 2) 1)))
"""
    wpe = torch.randn(8, 4)
    model = interpret.load(source, state={"wpe": wpe})
    ids = torch.zeros(2, 3, dtype=torch.long)
    assert torch.equal(model("forward", ids), wpe[torch.arange(3) + 1])
