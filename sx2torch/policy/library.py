"""The library functions, outlined by the policy. An op defined by other ops with a library
mark inside (`rms-norm`, `layer-norm`, `batch-norm`, `causal-attention`, `newton-schulz`) is
traced in place, so that ranks and a gradient see its nodes; here, once the policy has typed
the uses in place, each use that nothing reads into becomes a CALL of one graph per op, a
function of its arguments and of its number keys (`eps`, `steps`), which the policy then
specializes like a defun and the emitter writes once, at module level
(sx2torch/emit/functions.py). A use a backward reads into stays in place, as does one whose
input's cast a reader outside it shares, and one whose keys that shape its code
(`batch-norm`'s `:axes`) differ from the first's. A function's graph is shaped as its calls
pass it its arguments (`shape`); the call keeps the shape its use had.
"""

from __future__ import annotations

from typing import Optional

from sx2torch.ir import (
    LIBRARY,
    Expansion,
    Graph,
    Kind,
    Node,
    Shape,
    outputs,
    reads,
    walk,
)
from sx2torch.ops.shapes import Analysis, agreed, ranked
from sx2torch.ranks import valued
from sx2torch.syntax.scalars import Scalar, ScalarOp
from sx2torch.trace.library import function_graph


def run(graphs: dict, lowered) -> dict:
    """Replace the separable library uses of every graph by calls, as the policy typed them
    in place (`lowered`); add the functions' graphs to `graphs` under (LIBRARY, op), to be
    shaped by `shape`. The calls made: graph -> [CALL node], in trace order."""
    shapes: dict = {}  # op -> the values of the keys that shape its function's code
    typed: dict = {}
    for specialization in lowered.specializations:
        typed.setdefault(specialization.graph, []).append(specialization)
    calls: dict = {}
    for graph in list(graphs.values()):
        if graph.expansions:
            separable = _Separable(graph, typed.get(graph, []), lowered)
            for record in graph.expansions:
                function = _function(record, graphs, shapes)
                if function is not None and separable(record):
                    _call(graph, record, function)
                    calls.setdefault(graph, []).append(record.result)
        graph.expansions = []
    return calls


class _Separable:
    """Whether a use can be a call that computes the same bits, its gradient included: its
    inner nodes are read only inside it, its inputs are distinct values still in the graph
    (not parameters), and no input's cast inside it is one a reader outside shares (a cast
    read twice sums the gradients through it before it rounds them)."""

    def __init__(self, graph: Graph, specializations: list, lowered):
        self.specializations, self.lowered = specializations, lowered
        self.present = set(graph.inputs)
        self.readers: dict = {}  # value -> {reader}; None for the graph or a region
        self.reads: dict = {}  # value -> [(reader, input index)]
        for node in walk(graph.nodes):
            self.present.add(node)
            for region in node.regions:
                self.present.update(region.inputs)
                for out in region.outputs:
                    self.readers.setdefault(out, set()).add(None)
            for operand in [*reads(node), node.forward]:
                self.readers.setdefault(operand, set()).add(node)
            for index, operand in enumerate(node.inputs):
                self.reads.setdefault(operand, []).append((node, index))
        for value in outputs(graph):
            self.readers.setdefault(value, set()).add(None)

    def __call__(self, record: Expansion) -> bool:
        made = set(record.nodes)
        inputs = record.inputs
        return (
            record.result in self.present
            and len(set(inputs)) == len(inputs)
            and all(self._input(i) for i in inputs)
            and all(self.readers.get(n, set()) <= made for n in made - {record.result})
            and not any(self._cast_shared(i, made) for i in inputs)
        )

    def _input(self, operand) -> bool:
        return (
            isinstance(operand, Node)
            and operand in self.present
            and operand.kind is not Kind.PARAM
        )

    def _cast_shared(self, operand: Node, made: set) -> bool:
        for typed in self.specializations:
            have = self.lowered.value_dtype(typed, operand)
            inside, outside = set(), set()
            for reader, index in self.reads.get(operand, []):
                want = self.lowered.read_dtype(typed, reader, index)
                if want is not None and want != have:
                    (inside if reader in made else outside).add(want)
            if inside & outside:
                return True
        return False


def _keys(record: Expansion) -> tuple:
    """(the number keys, the keys that shape the code) of a use."""
    numbers, shaping = {}, {}
    for spec in record.op.keys:
        value = record.attrs[spec.name]
        if (
            isinstance(value, Scalar)
            and spec.default is not None
            and not isinstance(value.value, bool)
        ):
            numbers[spec.name] = value
        else:
            shaping[spec.name] = value
    return numbers, shaping


def _function(record: Expansion, graphs: dict, shapes: dict) -> Optional[Graph]:
    """The op's function graph, traced at its first use; None where the op has no mark
    inside (its code is one expression), this use's shaping keys differ from the first's,
    or one reads a const.
    """
    op = record.op
    numbers, shaping = _keys(record)
    if any(_reads_names(value) for value in shaping.values()):
        return None  # a const in a key that shapes the code: written where it is read
    shape = (len(record.inputs), _shown(shaping))
    if shapes.setdefault(op, shape) != shape:
        return None
    key = (LIBRARY, op.name)
    if key not in graphs:
        graphs[key] = function_graph(op, record, numbers, shaping)
    graph = graphs[key]
    marked = any(f.library for n in walk(graph.nodes) for f in n.frames)
    return graph if marked and isinstance(graph.output, Node) else None


def _reads_names(value) -> bool:
    """Whether a key's value reads a const or a key (eager-attention's :scale of a const),
    which a function shared by the module's models could not name."""
    values = value if isinstance(value, tuple) else (value,)
    return any(isinstance(v, Scalar) and v.op is not ScalarOp.LIT for v in values)


def _shown(shaping: dict) -> tuple:
    """The shaping keys as values two uses compare by (literals, or the scalars)."""
    return tuple(
        (
            (name, tuple(s.value if s.op is ScalarOp.LIT else s for s in value))
            if isinstance(value, tuple)
            else (name, value)
        )
        for name, value in shaping.items()
    )


def _call(graph: Graph, record: Expansion, function: Graph) -> None:
    """The use's result node becomes the call, its other nodes are dropped."""
    numbers, _ = _keys(record)
    defaults = dict(function.keys)
    keys = {
        name: value
        for name, value in numbers.items()
        if not (value.op is ScalarOp.LIT and value.value == defaults[name].value)
    }
    inner = set(record.nodes) - {record.result}
    _drop(graph.nodes, inner)
    node = record.result
    node.kind, node.op, node.inputs = Kind.CALL, None, record.inputs
    node.attrs = {"target": function.name, "keys": keys, "library": True}
    node.frames = record.frames


def _drop(nodes: list, inner: set) -> None:
    nodes[:] = [n for n in nodes if n not in inner]
    for node in nodes:
        for region in node.regions:
            _drop(region.nodes, inner)


def shape(program, graphs: dict) -> None:
    """Every value of the functions' graphs shaped, each argument as every call passes it
    where the calls agree (as the ranks pass shapes a defun's); the callers keep theirs.
    """
    passed: dict = {}  # function -> [the shapes of its arguments at one call]
    for (model, _), graph in graphs.items():
        for node in walk(graph.nodes):
            if node.kind is Kind.CALL and node.attrs.get("library"):
                passed.setdefault(node.attrs["target"], []).append(
                    [() if isinstance(i, Scalar) else i.shape.dims for i in node.inputs]
                )
    analysis = Analysis(program, graphs)
    for (model, name), graph in graphs.items():
        if model != LIBRARY:
            continue
        calls = passed.get(name)
        given = {
            node: agreed([call[k] for call in calls]) if calls else None
            for k, node in enumerate(graph.inputs)
        }
        found = analysis.nodes(model, graph.nodes, given)
        for node in valued(graph):
            node.shape = Shape(ranked(found.get(node)))
