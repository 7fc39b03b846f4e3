"""A method's plan as its code is written from it, and the plan printed.

`written` and `rounds` say what a value's expression is written as, which decides how a
cast of it is written (sx2torch/emit/targets.py, `Target.spelling`); emission reads them.
`printed` is a specialization's typed graph as text (sx2torch/printer.py), each line noted
with the plan its held code is written from: which values are statements and in which
precision blocks, how each read is cast, the casts hoisted before each statement, which
results are rounded on store, and the methods called, by the names given so far. Two
specializations of a defun whose plans print the same have the same code on that target,
but for the names of their locals: sharing compares them (sx2torch/emit/sharing.py).
"""

from __future__ import annotations

from typing import Optional

import sx2torch.printer as printer
from sx2torch.emit.layout import RETURN, TOP, Layout, returns_expression
from sx2torch.ir import CALLS, Kind, Node
from sx2torch.ops import REGISTRY
from sx2torch.policy import Typed
from sx2torch.policy.rules import output_dtype

# what a cast's spelling leaves its value written as (see `written`)
AFTER = {"fill": "fill", "round": "rounding"}


def rounds(typed: Typed, node: Node) -> bool:
    """Whether an op's result is a bf16 value its op can leave, which a held target rounds
    on store."""
    return typed.decided[node].dtype == "bf16" and not REGISTRY[node.op].is_exact(
        node.inputs
    )


def written(layout: Layout, operand) -> Optional[str]:
    """What an operand is written as where a node reads it: "rounding" (a held target's
    rounding), "fill" (`torch.ones_like(x, dtype=...)`), or None (a name, a member, any
    other expression)."""
    if (
        not isinstance(operand, Node)
        or operand.kind in (Kind.INPUT, Kind.PARAM, Kind.ITEM)
        or operand in layout.named
    ):
        return None
    if operand.kind is Kind.CAST:
        return read_written(layout, operand, 0)
    if operand.kind is not Kind.OP:
        return None
    result = stored(layout, operand)
    gathered = layout.conversions.gathered(operand)
    if gathered is None:
        return result
    return _after(layout.target.spelling(*gathered, result), result)


def stored(layout: Layout, node: Node) -> Optional[str]:
    """What an op's result is written as, before the cast of the rows it gathered."""
    if layout.target.held and rounds(layout.typed, node):
        return "rounding"
    return "fill" if REGISTRY[node.op].fills else None


def read_written(layout: Layout, node: Node, index: int) -> Optional[str]:
    """What input `index` is written as as `node` reads it, cast or not."""
    operand = node.inputs[index]
    conversion = layout.conversions.conversion(node, index)
    if conversion is None:
        return written(layout, operand)
    if (node, index) in layout.hoists.reads:
        return None  # read by name
    inner = written(layout, operand)
    return _after(layout.target.spelling(*conversion, inner), inner)


def _after(spelling: Optional[str], inner: Optional[str]) -> Optional[str]:
    return inner if spelling is None else AFTER.get(spelling)


def printed(layout: Layout, methods: dict) -> str:
    """The specialization's typed graph, noted with its plan on a held target: the same
    text as another's where their code is the same but for the names of their locals.
    `methods`: Typed -> the name its callers call it by."""
    assert layout.target.held, "a cuda method computes through its tensors' dtypes"
    return printer.graph(layout.graph, _Plan(layout, methods))


class _Plan(printer.Notes):
    """On a held target a new tensor is f32 whatever its node computes in, so a node's
    dtypes show in its code only through its casts and its rounding, and where its op's
    keys choose its dtype over the policy's (the f32-out matmul is written by the dtype it
    computes in)."""

    def __init__(self, layout: Layout, methods: dict):
        self.layout = layout
        self.typed = layout.typed
        self.methods = methods

    def node(self, node: Node) -> str:
        layout = self.layout
        notes = (
            " statement" + _blocks(layout.path(node)) if node in layout.named else ""
        )
        notes += "".join(self._read(node, i) for i in range(len(node.inputs)))
        if node.kind in CALLS:
            notes += f" calls {self.methods[self.typed.callee[node]]}"
        if node.kind is not Kind.OP:
            return notes
        if rounds(self.typed, node):
            notes += " rounds"
        gathered = layout.conversions.gathered(node)
        if gathered is not None:
            spelling = layout.target.spelling(*gathered, stored(layout, node))
            notes += f" gathered {spelling}"
        op = REGISTRY[node.op]
        if op.out_dtype is not None and op.out_dtype(node.attrs) is not None:
            notes += f" computes {self.typed.decided[node].compute}"
        return notes

    def _read(self, node: Node, index: int) -> str:
        """A read's cast as it is written; a loop's initial value is assigned before
        it where it is cast, even to nothing written."""
        layout = self.layout
        conversion = layout.conversions.conversion(node, index)
        if conversion is None:
            return ""
        if (node, index) in layout.hoists.reads:
            return f" read {index} by name"
        inner = written(layout, node.inputs[index])
        spelling = layout.target.spelling(*conversion, inner)
        if spelling is None and node.kind is not Kind.FOR:
            return ""
        return f" read {index} {spelling or 'as it is'}"

    def before(self, where, ids: dict) -> list:
        """The casts hoisted before a statement, each assigned a name of its own."""
        layout = self.layout
        if isinstance(where, tuple):
            statement = layout.yields.get(where)
        else:
            statement = {printer.TOP: TOP, printer.RETURN: RETURN}.get(where, where)
        return [
            f"cast {ids[hoist.operand]} to {hoist.conversion[1]}: "
            f"{layout.target.spelling(*hoist.conversion, written(layout, hoist.operand)) or 'as it is'}"
            for hoist in layout.hoists.at.get(statement, [])
        ]

    def output(self, node: Node, region: int, index: int) -> str:
        operand = node.regions[region].outputs[index]
        want = output_dtype(self.typed, node, index)
        conversion = self.layout.conversions.conversion_of(operand, want)
        if conversion is None:
            return ""
        spelling = self.layout.target.spelling(
            *conversion, written(self.layout, operand)
        )
        return f" as {spelling}" if spelling else ""

    def returned(self) -> str:
        """A return that computes one value is written in that value's blocks."""
        output = self.layout.graph.output
        if returns_expression(self.layout) and not isinstance(output, tuple):
            return _blocks(self.layout.path(output))
        return ""


def _blocks(path: tuple) -> str:
    return "".join(f" in [{frame.mode} {frame.text}]" for frame in path)
