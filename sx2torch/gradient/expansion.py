"""Every GRADIENT node of a graph, in trace order, replaced by the backward nodes that
compute its value, and every read of it by a read of that value."""

from __future__ import annotations

from typing import Optional

from sx2torch.ops.shapes import ranked, reshape
from sx2torch.errors import SourceError
from sx2torch.gradient.backward import Backward
from sx2torch.gradient.checks import aliased_start_check, carried_check
from sx2torch.gradient.dependence import reads_around
from sx2torch.gradient.labels import label
from sx2torch.gradient.writer import Writer
from sx2torch.ir import Graph, Kind, Node, Operand, prune, reads, walk
from sx2torch.syntax.echo import echo
from sx2torch.syntax.program import Program
from sx2torch.ops.builder import Builder


def run(program: Program, graphs: dict) -> None:
    """Expand every GRADIENT node of `graphs` (trace's output), in trace order."""
    for graph in graphs.values():
        if any(node.kind is Kind.GRADIENT for node in walk(graph.nodes)):
            _Expansion(program, graph).block(graph.nodes, [])
            prune(graph)
            reshape(graph, program)  # its readers read each gradient's value now


class _Expansion:
    """One graph's GRADIENT nodes replaced by their backward nodes, and every read of one by
    a read of its value, so that a later gradient differentiates through an earlier one.
    """

    def __init__(self, program: Program, graph: Graph):
        self.program = program
        self.graph = graph
        self.values: dict = {}  # GRADIENT node -> dY/dX
        # values whose shapes are one iteration's, not known (the writer adds its own)
        self.iterated = _iterated(graph.nodes, set())

    def block(self, nodes: list, opened: list) -> None:
        """`opened`: (block, end) of the blocks around `nodes`: their nodes up to `end`
        are those a node of `nodes` may read."""
        k = 0
        while k < len(nodes):
            node = nodes[k]
            node.inputs = tuple(self._value(i) for i in node.inputs)
            if node.kind is Kind.GRADIENT:
                visible = [
                    n for block, end in [*opened, (nodes, k)] for n in block[:end]
                ]
                around = [block[end] for block, end in opened]
                built = self._expand(node, visible, around)
                nodes[k : k + 1] = built
                k += len(built)
                continue
            for region in node.regions:
                self.block(region.nodes, [*opened, (nodes, k)])
                region.outputs = [self._value(o) for o in region.outputs]
            k += 1
        if nodes is self.graph.nodes:
            out = self.graph.output
            self.graph.output = (
                tuple(map(self._value, out))
                if isinstance(out, tuple)
                else self._value(out)
            )

    def _value(self, operand):
        return (
            self.values.get(operand, operand) if isinstance(operand, Node) else operand
        )

    def _expand(self, node: Node, visible: list, around: list) -> list:
        """The nodes that compute dY/dX in place of the GRADIENT node; `around`: the
        nodes whose regions hold it."""
        t = Writer(self.graph, self.program, self.iterated)
        t.nodes = []
        t.frames, t.datum, t.stamps = node.frames, node.form, node.attrs["marks"]
        (y, x), y_form = node.inputs, node.form.items[1]
        scalar = self._is_scalar(y) if isinstance(y, Node) else False
        if scalar is False:
            raise SourceError(
                y_form.span,
                "gradient needs a scalar Y: reduce it over all axes, as (sum ...) or (mean ...)",
            )
        if scalar is None:
            y = _expect_scalar(t, y, y_form)
        aliased_start_check(node, y, visible, around)
        backward = Backward(t, node.form, [*visible, *t.nodes], around)
        value = backward.run(y, x)
        _pass_note(backward.noted, t.nodes, value)
        carried_check(node, visible, around, backward, (t.nodes, value))
        self.values[node] = value
        _bind(value, node)
        return t.nodes

    def _is_scalar(self, node: Node) -> Optional[bool]:
        """Whether a value is a 0-d tensor; None where its rank depends on arguments of unknown rank."""
        dims = None if node in self.iterated else ranked(node.shape.dims)
        return None if dims is None else dims == ()


def _pass_note(noted: Optional[Node], nodes: list, value: Operand) -> None:
    """The gradient form's comment goes from a seed nothing reads (its readers made ones of
    their own shapes) to the first value after it that is read and named, so a statement.
    """
    made = list(walk(nodes))
    read = {i for n in made for i in reads(n)}
    if noted is None or noted in read or noted not in made:
        return
    later = made[made.index(noted) + 1 :]
    heir = next((n for n in later if n is value or (n in read and n.name)), None)
    if heir is not None:
        heir.note, noted.note = noted.note, None


def _iterated(nodes: list, found: set, inside: bool = False) -> set:
    """The values inside loop bodies that depend on what the loops carry: ranks finds their
    shapes in one iteration, and another may differ."""
    for node in nodes:
        if node.kind is Kind.FOR:
            found.update(node.regions[0].inputs)
        for region in node.regions:
            _iterated(region.nodes, found, inside or node.kind is Kind.FOR)
        if inside and any(value in found for value in reads_around(node)):
            found.add(node)
    return found


def _expect_scalar(t: Builder, y: Node, y_form) -> Node:
    """Y itself, checked to be 0-d when the module runs, the error naming Y's form."""
    outer = t.frames, t.datum
    t.frames, t.datum = y.frames, y_form
    try:
        checked = t.op("expect-scalar", [y], form=echo(y_form))
        checked.name = label(y)  # named as Y would be: the backward is named after it
        return checked
    finally:
        t.frames, t.datum = outer


def _bind(value: Operand, node: Node) -> None:
    """The names a `let` bound the GRADIENT node to go to its value, as they would had the
    let bound the value itself."""
    if not isinstance(value, Node):
        return
    for name in filter(None, (node.name, *node.aliases)):
        if value.name is None:
            value.name = name
        elif name not in (value.name, *value.aliases):
            value.aliases += (name,)
