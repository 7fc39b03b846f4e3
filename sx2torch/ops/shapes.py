"""A graph's shapes by the ops' rank rules (sx2torch/ops/rank.py): one pass over the nodes in
trace order, each op's shape from its inputs'. A parameter's shape is its initializer's, a size
written with a const unknown (the constructor can change it) but its rank known; a defun's
argument has an unknown rank unless the caller of the analysis gives it; a call's result has
the shape of its callee's output, found with the callee's arguments unknown, where the callees'
graphs are given. Each node is shaped as it is made (`Analysis.made`, which the builder
calls), its defun's arguments and its calls' values unknown, so the gradient pass reads the
shapes of the nodes it differentiates; the ranks pass (sx2torch/ranks.py) reports the
mismatches found then and shapes again what the file's calls reach.
"""

from __future__ import annotations

from typing import Optional

import sx2torch.ops.initializers as initializers
from sx2torch.ir import CALLS, Graph, Kind, Node, Scalar, Shape, callee_key, walk
from sx2torch.ops.rank import UNKNOWN, Dims, ShapeError, Tail, known
from sx2torch.syntax.program import Program


def reshape(graph: Graph, program: Program) -> None:
    """Every node of a graph shaped again, in order: after a pass changed what they read."""
    analysis = Analysis(program, None)
    for node in graph.nodes:
        analysis.made(node, graph)


class _Setting:
    """`update` as the analysis calls it, each pair through the mapping's own setter."""

    def update(self, pairs) -> None:
        for node, dims in dict(pairs).items():
            self[node] = dims


class _AsMade(_Setting):
    """The shapes nodes were made with, read and set as the analysis's mapping."""

    def get(self, node) -> Dims:
        return None if node is None or node.shape is None else node.shape.dims

    def __setitem__(self, node, dims) -> None:
        node.shape = Shape(dims)


_AS_MADE = _AsMade()


class _Changed(_Setting, dict):
    """The shapes that differ from those the nodes were made with; a node's own elsewhere."""

    def get(self, node, default=None) -> Dims:
        return self[node] if node in self else _AS_MADE.get(node)

    def __setitem__(self, node, dims) -> None:
        if node in self or dims != _AS_MADE.get(node):
            super().__setitem__(node, dims)

    def reaches(self, node: Node) -> bool:
        """Whether a changed shape, or a call's, can change the node's: it is a call or
        reads a changed value, itself or a node in its regions."""
        if not node.regions:
            return node.kind in CALLS or any(i in self for i in node.inputs)
        inner = [node, *walk([n for region in node.regions for n in region.nodes])]
        outputs = [o for region in node.regions for o in region.outputs]
        return (
            any(n.kind in CALLS or any(i in self for i in n.inputs) for n in inner)
            or any(o in self for o in outputs)
            or node.attrs.get("reverse") in self
        )


class Analysis:
    def __init__(self, program: Program, graphs: Optional[dict]):
        self.program = program
        self.graphs = graphs or {}
        self.done: dict = {}  # graph -> its shapes with its arguments unknown
        self.problems: list = []  # (node, message) of each provable mismatch

    def made(self, node: Node, graph: Graph) -> None:
        """Set a node of `graph` its shape as it is made, from its inputs' (`Node.shape`):
        a loop's or a conditional's shapes its regions' nodes again, as the loop's carried
        values settle. A mismatch its rule proves goes to `graph.mismatches`."""
        node.shape = Shape(self._node(node, graph.model, _AS_MADE))
        for found, message in self.problems:
            graph.mismatches.setdefault(found, message)
        self.problems.clear()

    def alone(self, graph: Graph) -> dict:
        """The graph's shapes with its arguments unknown, found once."""
        if graph not in self.done:
            self.done[graph] = {}  # resolve rejects recursion; this only guards
            self.done[graph] = self.refined(graph, {})
        return self.done[graph]

    def refined(self, graph: Graph, given: dict) -> dict:
        """The graph's shapes, its arguments `given` and its calls' values their callees':
        the nodes' own (as they were made) where neither reaches them, the rules run again
        only on what these change."""
        found = _Changed()
        found.update((node, given.get(node)) for node in graph.inputs)
        for node in graph.nodes:
            if found.reaches(node):
                found[node] = self._node(node, graph.model, found)
        return found

    def as_called(self) -> dict:
        """The shapes of every graph's nodes, its arguments shaped as its callers pass them,
        that differ from the nodes' own (a node's own elsewhere)."""
        passed: dict = {}  # graph -> [the shapes of its arguments at one call]
        found = _Changed()
        for graph in self._callers_first():
            calls = passed.get(graph)
            if calls:
                given = {
                    node: agreed([call[k] for call in calls])
                    for k, node in enumerate(graph.inputs)
                }
                shapes = self.refined(graph, given)
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

    def nodes(self, model: str, nodes: list, given: dict) -> dict:
        found = dict(given)
        self._into(found, model, nodes)
        return found

    def _into(self, found, model: str, nodes: list) -> None:
        for node in nodes:
            found[node] = self._node(node, model, found)

    def _node(self, node: Node, model: str, found: dict) -> Dims:
        inputs = [() if isinstance(i, Scalar) else found.get(i) for i in node.inputs]
        if node.kind is Kind.OP:  # most nodes
            return self._op(node, inputs)
        if node.kind is Kind.PARAM:
            return self._param(node, model)
        if node.kind in CALLS:
            return self._called(node, model)
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
        raise AssertionError(f"{node!r}: no shape rule for a {node.kind}")

    def _op(self, node: Node, inputs: list) -> Dims:
        """An op's shape by its rank rule, from its inputs' (`inputs`)."""
        rule = node.op.rank
        if rule.tails:
            inputs = [UNKNOWN if dims is None else dims for dims in inputs]
        else:
            inputs = [ranked(dims) for dims in inputs]
        try:
            dims = rule.shape(inputs, node.attrs)
        except ShapeError as error:
            self.problems.append((node, str(error)))
            return None
        return None if type(dims) is Tail and not dims.sizes else dims  # UNKNOWN

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
        self._into(found, model, region.nodes)
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
