"""Which values depend on X, and what a node reads, from around its regions included."""

from __future__ import annotations

from sx2torch.ir import Kind, Node, reads, walk
from sx2torch.ops.registry import ArgKind


class Dependence:
    """The values that depend on X: a node where it reads one, a loop's carried value where
    its start or an iteration's result does. `expansion`: (the GRADIENT node being expanded,
    its nodes, its value): that node depends on X as its value does."""

    def __init__(self, x: Node, expansion: tuple = (None, (), None)):
        self.x = x
        self.found = {x}
        self.gradient, self.nodes, self.value = expansion

    def mark(self, nodes: list) -> None:
        for node in nodes:
            if node is self.gradient:
                self.mark(self.nodes)
                if self.value in self.found:
                    self.found.add(node)
                continue
            if node.kind is Kind.FOR:
                self.carry(node)
            for region in node.regions:
                self.mark(region.nodes)
            if any(isinstance(i, Node) and i in self.found for i in _valued(node)):
                self.found.add(node)

    def around(self, visible: list, around: list) -> "Dependence":
        """Marks the values a gradient may read (`visible`) and those the loops around it
        (`around`, those that hold it) carry: before the loops, since a carried value may
        start as one computed from X before its loop, and after, since the values read in
        the body (and the gradient's own nodes) may read a carried one."""
        self.mark(visible)
        for loop in around:
            if loop.kind is Kind.FOR and self.x not in made_inside(loop):
                self.carry(loop)
        self.mark(visible)
        return self

    def carry(self, loop: Node) -> None:
        (body,) = loop.regions
        while True:
            self.mark(body.nodes)
            more = {
                carried
                for carried, start, out in zip(body.inputs, loop.inputs, body.outputs)
                if carried not in self.found
                and (start in self.found or out in self.found)
            }
            if not more:
                return
            self.found |= more


def _valued(node: Node) -> list:
    """What a node reads for its values: not the tensors an op reads only for the shape."""
    if node.kind is not Kind.OP:
        return reads(node)
    args = node.op.args
    return [
        value
        for k, value in enumerate(node.inputs)
        if args[min(k, len(args) - 1)].kind is not ArgKind.LIKE
    ]


def made_inside(node: Node) -> set:
    """The values made in a node's regions, their inputs included."""
    nodes = [*walk([n for region in node.regions for n in region.nodes])]
    return {*nodes, *(v for n in [node, *nodes] for r in n.regions for v in r.inputs)}


def reads_around(node: Node) -> list:
    """The values a node reads, its regions' nodes reading from around them included."""
    return [*node.inputs, *read_in_regions(node)]


def read_in_regions(node: Node) -> list:
    """The values a node's regions read from around them, what they give included: a
    loop's body may read (or give) the value a carried one starts as, and that read has
    a contribution of its own, apart from the start's."""
    inside = {value for region in node.regions for value in region.inputs}
    found = [out for region in node.regions for out in region.outputs]
    for inner in walk([r for region in node.regions for r in region.nodes]):
        inside.add(inner)
        inside.update(value for region in inner.regions for value in region.inputs)
        found.extend(reads(inner))
    return [value for value in found if value not in inside]
