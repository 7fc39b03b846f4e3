"""A specialization's plan printed: its typed graph as text (sx2torch/printer.py), each line
noted with the plan its code is written from: which values are statements and in which
precision blocks, how each read is cast, the casts hoisted before each statement, which
results are rounded on store, and the methods called, by the names given so far. On a held
target, two specializations of a defun whose plans print the same have the same code but
for the names of their locals: sharing compares them (sx2torch/plan/sharing.py).
`--dump-after plan` prints each method's plan on the compile's target.
"""

from __future__ import annotations

import sx2torch.printer as printer
from sx2torch.ir import CALLS, Kind, Node
from sx2torch.plan.casts import Hoist
from sx2torch.plan.layout import RETURN, TOP, Layout, returns_expression
from sx2torch.plan.spelled import Spelled


def printed(
    layout: Layout, methods: dict, spelled: Spelled = None, text: printer.Text = None
) -> str:
    """The specialization's typed graph, noted with its plan (`spelled`: the layout's casts,
    where they are already spelled; `text`: the graph's without notes, where it is printed
    again). On a held target the same text as another's where their code is the same but
    for the names of their locals. `methods`: Typed -> the name its callers call it by.
    """
    return printer.graph(layout.graph, _Plan(layout, methods, spelled), text=text)


class _Plan(printer.Notes):
    """On a held target a new tensor is f32 whatever its node computes in, so a node's
    dtypes show in its code only through its casts and its rounding, and where its op's
    keys choose its dtype over the policy's (the f32-out matmul is written by the dtype it
    computes in)."""

    def __init__(self, layout: Layout, methods: dict, spelled: Spelled = None):
        self.layout = layout
        self.typed = layout.typed
        self.methods = methods
        self.spelled = spelled or Spelled(layout)

    def node(self, node: Node) -> str:
        layout, spelled = self.layout, self.spelled
        notes = (
            " statement" + _blocks(layout, layout.path(node))
            if node in layout.named
            else ""
        )
        notes += "".join(self._read(node, i) for i in range(len(node.inputs)))
        if node.kind in CALLS:
            notes += f" calls {self.methods[self.typed.callee[node]]}"
        if node in layout.topk_values:
            notes += " topk's values"
        if node.kind is not Kind.OP:
            return notes
        if node in spelled.stores:
            notes += " rounds"
        if node in spelled.gathered:
            notes += f" gathered {spelled.gathered[node].spelling}"
        op = node.op
        if op.out_dtype is not None and op.out_dtype(node.attrs) is not None:
            notes += f" computes {self.typed.decided[node].compute}"
        return notes

    def _read(self, node: Node, index: int) -> str:
        """A read's cast as it is written; a loop's initial value is assigned before
        it where it is cast, even to nothing written."""
        cast = self.spelled.reads.get((node, index))
        if isinstance(cast, Hoist):
            return f" read {index} by name"
        if cast is None or cast.spelling is None and node.kind is not Kind.FOR:
            return ""
        return f" read {index} {cast.spelling or 'as it is'}"

    def before(self, where, ids: dict) -> list:
        """The casts hoisted before a statement, each assigned a name of its own."""
        layout = self.layout
        if isinstance(where, tuple):
            statement = layout.yields.get(where)
        else:
            statement = {printer.TOP: TOP, printer.RETURN: RETURN}.get(where, where)
        kept = [f"number {name} kept as a local" for name, _ in layout.scalars]
        return (kept if statement == TOP else []) + [
            f"cast {ids[hoist.operand]} to {hoist.conversion[1]}: "
            f"{self.spelled.hoists[hoist].spelling or 'as it is'}"
            for hoist in layout.hoists.at.get(statement, [])
        ]

    def output(self, node: Node, region: int, index: int) -> str:
        cast = self.spelled.outputs.get((node, region, index))
        return f" as {cast.spelling}" if cast and cast.spelling else ""

    def returned(self) -> str:
        """A return that computes one value is written in that value's blocks."""
        output = self.layout.graph.output
        if returns_expression(self.layout) and not isinstance(output, tuple):
            return _blocks(self.layout, self.layout.path(output))
        return ""


def _blocks(layout: Layout, path: tuple) -> str:
    return "".join(
        f" in [{frame.mode} {frame.text}{' unblocked' * (frame in layout.unblocked)}]"
        for frame in path
    )
