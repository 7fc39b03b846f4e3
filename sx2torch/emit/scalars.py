"""Compile-time scalars as Python writes them. The syntax layer says what each `ScalarOp`
computes (sx2torch/syntax/scalars.py); writing code is emission's alone."""

from __future__ import annotations

import libcst as cst

import sx2torch.build as b
from sx2torch.plan.methods import MATH
from sx2torch.syntax.scalars import ScalarOp


def python(op: ScalarOp, args: tuple, write) -> cst.BaseExpression:
    """An operation on operands as Python writes it, each operand written by `write`."""
    if op is ScalarOp.NEG:
        return b.neg(write(args[0]))
    if op is ScalarOp.NOT:
        return cst.UnaryOperation(cst.Not(), b.at_least(write(args[0]), b.NOT))
    if op in (ScalarOp.AND, ScalarOp.OR):
        level = b.AND if op is ScalarOp.AND else b.OR
        kind = cst.And if op is ScalarOp.AND else cst.Or
        return cst.BooleanOperation(
            b.at_least(write(args[0]), level),
            kind(),
            b.at_least(write(args[1]), level + 1),
        )
    if op is ScalarOp.INT:
        return b.call("int", write(args[0]))
    if op in MATH:  # imported where the plan found a module calls one
        return b.call(f"math.{op}", write(args[0]))
    if op is ScalarOp.IN:
        options = args[1]
        if not isinstance(options, tuple):  # a list const or &key
            return b.compare(write(args[0]), "in", write(options))
        return b.compare(write(args[0]), "in", b.tuple_([write(o) for o in options]))
    if op is ScalarOp.LIST:
        return b.tuple_([write(a) for a in args])
    if op is ScalarOp.AT:
        return b.subscript(write(args[0]), write(args[1]))
    if op is ScalarOp.LEN:
        return b.call("len", write(args[0]))
    if op is ScalarOp.IF:
        condition, then, otherwise = (write(a) for a in args)
        return cst.IfExp(
            b.at_least(condition, b.CONDITIONAL + 1),
            b.at_least(then, b.CONDITIONAL + 1),
            b.at_least(otherwise, b.CONDITIONAL),
        )
    if op in b.COMPARE:
        return b.compare(write(args[0]), op, write(args[1]))
    return b.chain(op, [write(a) for a in args])
