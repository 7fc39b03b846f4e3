"""A library op's function (sx2torch/policy/library.py outlines its uses into calls of it),
traced as a graph of its own with the builder its uses were traced with."""

from __future__ import annotations

from sx2torch.ir import LIBRARY, Expansion, Graph, Node, argument
from sx2torch.syntax.read import List, Symbol
from sx2torch.syntax.scalars import Scalar, ScalarOp
from sx2torch.ops.builder import Builder, default


def function_graph(op, record: Expansion, numbers: dict, shaping: dict) -> Graph:
    """The graph of a library op's function, traced at its first use `record`: its
    arguments, then its number keys (`numbers`) as &key arguments with the op's defaults;
    the keys that shape its code (`shaping`) as the use has them."""
    span = record.result.span
    names = [arg.name for arg in op.args[: len(record.inputs)]]
    specs = {spec.name: spec for spec in op.keys}
    keys = [(name, default(specs[name].default)) for name in numbers]
    graph = Graph(LIBRARY, op.name, [], keys, None, span=span)
    for name in names:
        symbol = Symbol(name, span)
        node = argument(name, span, symbol)
        graph.inputs.append(node)
    builder = Builder(graph, None)
    builder.expanding = True  # the ops it is defined by are its own nodes
    builder.datum = List(
        (Symbol(op.name, span), *(Symbol(n, span) for n in names)), span
    )
    attrs = dict(shaping)
    for name, value in keys:
        attrs[name] = Scalar(ScalarOp.KEY, (name,), value.value)
    result = op.expand(builder, list(graph.inputs), attrs)
    if isinstance(result, Node) and result.label is None:
        result.label = op.word
    graph.output = result
    return graph
