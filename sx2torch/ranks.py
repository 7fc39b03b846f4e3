"""The ranks pass: the shapes of every node of the expanded graphs as the file calls each
defun, set on the node (`Node.shape`, which the policy reads); the first mismatch they prove.

Each node was shaped as it was made by the ops' rank rules (sx2torch/ops/shapes.py), its
defun's arguments and its calls' values unknown, and each mismatch a rule proved was recorded
in its graph. Here each defun's arguments are shaped as every call in the file passes them,
and each call's value as its callee's output; the rules run again only on the nodes these
reach. A mismatch is one no value of the unknowns can fix, such as `(matmul a b)` of [3 4]
and [5 6].
"""

from __future__ import annotations

from sx2torch.errors import SourceError
from sx2torch.ir import Graph, Shape, walk
from sx2torch.ops.rank import Tail
from sx2torch.ops.shapes import Analysis, ranked
from sx2torch.syntax.program import Program


def run(program: Program, graphs: dict) -> None:
    """Raise the first provable shape mismatch, then set every node's shape: its defun's
    arguments have the shapes every call in the file passes them, where they agree; else
    unknown (a 0-d value, an element of a vector or a full reduction, is known as such).
    """
    check(graphs)
    found = Analysis(program, graphs).as_called()
    for graph in graphs.values():
        for node in valued(graph):
            dims = found.get(node)
            if node in found or isinstance(dims, Tail):
                node.shape = Shape(ranked(dims))


def valued(graph: Graph):
    """Every node of a graph that has a value: its inputs, its nodes and its regions' inputs."""
    yield from graph.inputs
    for node in walk(graph.nodes):
        yield node
        for region in node.regions:
            yield from region.inputs


def check(graphs: dict) -> None:
    """Raise the first provable shape mismatch in the source, if any: of those the rules
    found as the graphs' nodes were made, the first of a node still in its graph."""
    problems = [
        (node, graph.mismatches[node])
        for graph in graphs.values()
        for node in walk(graph.nodes)
        if node in graph.mismatches
    ]
    if problems:
        node, message = min(problems, key=lambda p: (p[0].span.line, p[0].span.col))
        raise SourceError(node.span, message)
