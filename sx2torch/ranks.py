"""The ranks pass: ranks, and shapes where known, of every node of a traced graph, set on
the node (`Node.shape`, which the policy reads); the mismatches they prove.

The analysis is the ops' rank rules run over a graph (sx2torch/ops/shapes.py), which the
gradient pass also reads, each graph alone. Here each defun's arguments are shaped as every
call in the file passes them, and `check` reports a mismatch no value of the unknowns can fix,
such as `(matmul a b)` of [3 4] and [5 6].
"""

from __future__ import annotations

from sx2torch.errors import SourceError
from sx2torch.ir import Graph, Shape, walk
from sx2torch.ops.shapes import Analysis, ranked
from sx2torch.syntax.program import Program


def run(program: Program, graphs: dict) -> None:
    """Raise the first provable shape mismatch, then set every node's shape: its defun's
    arguments have the shapes every call in the file passes them, where they agree; else
    unknown (a 0-d value, an element of a vector or a full reduction, is known as such).
    """
    found = check(program, graphs).as_called()
    for graph in graphs.values():
        for node in valued(graph):
            node.shape = Shape(ranked(found.get(node)))


def valued(graph: Graph):
    """Every node of a graph that has a value: its inputs, its nodes and its regions' inputs."""
    yield from graph.inputs
    for node in walk(graph.nodes):
        yield node
        for region in node.regions:
            yield from region.inputs


def check(program: Program, graphs: dict) -> Analysis:
    """Raise the first provable shape mismatch in the source, if any; else the analysis,
    each graph's shapes with its arguments unknown found."""
    analysis = Analysis(program, graphs)
    for graph in graphs.values():
        analysis.alone(graph)
    if analysis.problems:
        node, message = min(
            analysis.problems, key=lambda p: (p[0].span.line, p[0].span.col)
        )
        raise SourceError(node.span, message)
    return analysis
