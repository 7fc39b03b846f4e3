"""A graph's shapes by the ops' rank rules (sx2torch/ops/rank.py): one pass over the nodes in
trace order, each op's shape from its inputs'. A parameter's shape is its initializer's, a size
written with a const unknown (the constructor can change it) but its rank known; a defun's
argument has an unknown rank unless the caller of the analysis gives it; a call's result has
the shape of its callee's output, found with the callee's arguments unknown, where the callees'
graphs are given. The gradient pass reads a graph's shapes as it is traced, alone; the ranks
pass (sx2torch/ranks.py) finds them as the file calls each defun, and the mismatches they prove.
"""

from __future__ import annotations

from typing import Optional

import sx2torch.ops.initializers as initializers
from sx2torch.ir import CALLS, Graph, Kind, Node, Scalar, callee_key, reads, walk
from sx2torch.ops.rank import Dims, ShapeError, Tail, known
from sx2torch.syntax.program import Program


def shapes(
    graph: Graph,
    program: Program,
    inputs: Optional[dict] = None,
    graphs: Optional[dict] = None,
) -> dict:
    """{node: shape} for the graph's inputs and nodes; `inputs` maps argument names to shapes,
    `graphs` (trace's output) lets calls take their callee's output shape."""
    found = Analysis(program, graphs).graph(graph, inputs or {})
    return {node: ranked(dims) for node, dims in found.items()}


def rank_of(node: Node, graph: Graph, program: Program) -> Optional[int]:
    """The rank of one node of a graph still being traced, from the nodes it depends on."""
    cone, pending = set(), [node]
    while pending:
        item = pending.pop()
        if isinstance(item, Node) and item not in cone:
            cone.add(item)
            pending.extend(reads(item))
    nodes = [n for n in graph.nodes if n in cone]
    dims = ranked(Analysis(program, None).nodes(graph.model, nodes, {}).get(node))
    return None if dims is None else len(dims)


class Analysis:
    def __init__(self, program: Program, graphs: Optional[dict]):
        self.program = program
        self.graphs = graphs or {}
        self.done: dict = {}  # graph -> its shapes with its arguments unknown
        self.problems: list = []  # (node, message) of each provable mismatch

    def alone(self, graph: Graph) -> dict:
        """The graph's shapes with its arguments unknown, found once."""
        if graph not in self.done:
            self.done[graph] = {}  # resolve rejects recursion; this only guards
            self.done[graph] = self.graph(graph, {})
        return self.done[graph]

    def as_called(self) -> dict:
        """{node: shape} of every graph, its arguments shaped as its callers pass them."""
        passed: dict = {}  # graph -> [the shapes of its arguments at one call]
        found: dict = {}
        for graph in self._callers_first():
            calls = passed.get(graph)
            if calls:
                given = {
                    node: agreed([call[k] for call in calls])
                    for k, node in enumerate(graph.inputs)
                }
                shapes = self.nodes(graph.model, graph.nodes, given)
            else:  # no call shapes its arguments: its shapes alone
                shapes = self.alone(graph)
            found.update(shapes)
            for node in walk(graph.nodes):
                callee = self._callee(node, graph.model)
                if callee is not None:
                    passed.setdefault(callee, []).append(
                        [
                            () if isinstance(i, Scalar) else ranked(shapes.get(i))
                            for i in node.inputs
                        ]
                    )
        return found

    def _callers_first(self) -> list:
        """The graphs, each after every graph that calls it (resolve rejects recursion)."""
        done, order = set(), []

        def visit(graph: Graph) -> None:
            if graph not in done:
                done.add(graph)
                for node in walk(graph.nodes):
                    callee = self._callee(node, graph.model)
                    if callee is not None:
                        visit(callee)
                order.append(graph)

        for graph in self.graphs.values():
            visit(graph)
        return order[::-1]

    def graph(self, graph: Graph, inputs: dict) -> dict:
        given = {node: inputs.get(node.name) for node in graph.inputs}
        return self.nodes(graph.model, graph.nodes, given)

    def nodes(self, model: str, nodes: list, given: dict) -> dict:
        found = dict(given)
        for node in nodes:
            found[node] = self._node(node, model, found)
        return found

    def _node(self, node: Node, model: str, found: dict) -> Dims:
        if node.kind is Kind.PARAM:
            return self._param(node, model)
        if node.kind in CALLS:
            return self._called(node, model)
        inputs = [() if isinstance(i, Scalar) else found.get(i) for i in node.inputs]
        if node.kind is Kind.CAST:
            return inputs[0]
        if node.kind is Kind.ITEM:
            return inputs[0] and inputs[0][node.attrs["index"]]
        if node.kind is Kind.GRADIENT:  # dY/dX, before the gradient pass writes it
            return inputs[1]
        if node.kind is Kind.FOR:
            return self._loop(node, model, found, inputs)
        if node.kind is Kind.IF:
            then, otherwise = (self._region(r, model, found)[0] for r in node.regions)
            return then if then == otherwise else None
        rule = node.op.rank
        if rule.tails:
            inputs = [Tail(()) if dims is None else dims for dims in inputs]
        else:
            inputs = [ranked(dims) for dims in inputs]
        try:
            dims = rule.shape(inputs, node.attrs)
        except ShapeError as error:
            self.problems.append((node, str(error)))
            return None
        return None if dims == Tail(()) else dims

    def _loop(self, node: Node, model: str, found: dict, inputs: list) -> tuple:
        """The carried values' shapes after the loop: what an iteration gives, where that
        stays the same from one iteration to the next and the stack has layers."""
        (body,) = node.regions
        count = known(self.program.model(model).params[node.attrs["stack"]].init.count)
        forward = node.attrs.get("reverse")
        # an adjoint loop: the forward's carried values, recorded
        if forward is not None:
            found.update(zip(body.inputs[len(inputs) :], found.get(forward) or ()))
        carried = inputs
        for _ in range(2 if count else 1):
            found.update(zip(body.inputs, carried))
            before, carried = carried, self._region(body, model, found)
        if not count:
            return tuple(i if i == o else None for i, o in zip(inputs, carried))
        return tuple(b if b == a else None for b, a in zip(before, carried))

    def _region(self, region, model: str, found: dict) -> list:
        found.update(self.nodes(model, region.nodes, found))
        return [() if isinstance(o, Scalar) else found.get(o) for o in region.outputs]

    def _param(self, node: Node, model: str) -> Dims:
        owner = self.program.model(node.attrs.get("owner", model))
        init = owner.params[node.attrs["param"]].init
        return tuple(known(size) for size in initializers.sizes(init))

    def _called(self, node: Node, model: str) -> Dims:
        callee = self._callee(node, model)
        if callee is None:
            return None
        if isinstance(callee.output, tuple):  # read by its ITEMs
            return tuple(self.alone(callee).get(o) for o in callee.output)
        if not isinstance(callee.output, Node):
            return None
        return self.alone(callee).get(callee.output)

    def _callee(self, node: Node, model: str) -> Optional[Graph]:
        """The graph a call node calls, if it is known."""
        if node.kind not in CALLS:
            return None
        target = node.attrs["target"]
        if node.kind is Kind.CALL:
            return self.graphs.get(callee_key(node, model))
        owner = self.program.model(model)
        # a stack chained inside an inlined sub-model: not followed
        if target not in owner.params:
            return None
        callee = self.program.submodel(owner, target, node.attrs.get("item"))
        return self.graphs.get((callee, "forward"))


def ranked(dims) -> Dims:
    """A shape of known rank, or None: what readers outside the analysis see of a Tail."""
    return None if isinstance(dims, Tail) else dims


def agreed(shapes: list) -> Dims:
    """The shape all of `shapes` have, a size unknown where they differ; None where their
    ranks differ or one is unknown."""
    if any(dims is None for dims in shapes) or len({len(d) for d in shapes}) > 1:
        return None
    return tuple(sizes[0] if len(set(sizes)) == 1 else None for sizes in zip(*shapes))
