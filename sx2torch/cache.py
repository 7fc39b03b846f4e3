"""The cache pass: the cached specialization of a `(defrun NAME :generate true)` run, made
from the traced graphs (docs/LANGUAGE.md, "Generation").

The pass follows the sequence through the defuns the top model's `forward` reaches, as shapes
with its length marked (sx2torch/ops/sequence.py): forward's ids are `[batch, length]`, and
the ops' rank rules carry the length to the axis each value holds the positions on, through
`swap-axes`, `transpose` and calls. On the way, each op's `cached` rule rewrites it: each
`(attention ... :causal true)` becomes `cached-attention`, which keeps its keys and values; a
`conv1d` along the sequence becomes `cached-conv1d`, which keeps its last inputs, and a
`linear-scan` along it `cached-linear-scan`, which keeps its last value (Mamba's conv and SSM
states); each `arange-of` and `positions` over the axis a value made from the input holds the
positions on becomes its cached op, which starts where the cache ends. In `forward`, the
value made by the last form that reaches one of those that keep a state goes through
`last-position` along its positions' axis, so the tokenwise work
after it (the final norm's reader, lm_head) runs on the last position only, transformers'
`logits_to_keep=1`. Anything else that mixes positions would compute wrong numbers from a
cache, so it is a located diagnostic: a non-causal attention or one given a mask, a product of
two values made from the input (attention written out) that do not hold the positions on one
batch axis, an op that combines values along an axis other than the last (a reduction, a scan,
a softmax over it) that is not known to be another than the sequence's, a convolution or slice
across the positions, a concat, pad, roll or repeat along them, a pooling, interpolation or
transposed convolution across them, a broadcast of them against a fixed size, the sequence's
size used other than as a slice's end. Other runs are
left as they are.
"""

from __future__ import annotations

from typing import Optional

from sx2torch.errors import SourceError
from sx2torch.ir import CALLS, Graph, Kind, Node, Scalar, numbers_read, walk
from sx2torch.ops import REGISTRY, ArgKind
from sx2torch.ops.cache import LAST_POSITION
from sx2torch.ops.sequence import LENGTH, MARKS, SEQUENCE, Seen, open_keys
from sx2torch.ops.shapes import Analysis, ranked
from sx2torch.syntax.scalars import ScalarOp
from sx2torch.syntax.echo import echo
from sx2torch.syntax.program import Program, Run
from sx2torch.trace.calls import calls


def run(program: Program, graphs: dict, chosen: Optional[Run]) -> None:
    if chosen is None or not chosen.generate:
        return
    entry = (program.top.name, "forward")
    reached = _reached(program, graphs, entry)
    shapes = _Follow(program, graphs).run(entry, reached)
    holds = _holding(program, graphs, reached)
    if not holds[entry]:
        raise SourceError(
            chosen.span,
            f"run '{chosen.name}' asks to generate, but forward calls no causal "
            "attention, convolution or scan along the sequence: there is nothing to cache",
        )
    _keep_last(graphs[entry], program, holds, shapes)
    for key in reached:  # a library op the pass rewrote inside is written out in place
        graph = graphs[key]
        graph.expansions = [
            e for e in graph.expansions if not any(n.op.internal for n in e.nodes)
        ]


def _reached(program: Program, graphs: dict, entry: tuple) -> list:
    """`entry` and the defuns it calls, at any depth."""
    found, pending = [], [entry]
    while pending:
        key = pending.pop()
        if key not in found:
            found.append(key)
            pending.extend(callee for callee, _ in calls(program, graphs[key]))
    return found


class _Follow(Analysis):
    """The reached graphs' shapes as the generating forward calls them, its ids
    `[batch, LENGTH]` (sx2torch/ops/sequence.py), each op's `cached` rule applied in place as
    its node is reached; what cannot be cached, a diagnostic."""

    def __init__(self, program: Program, graphs: dict):
        super().__init__(program, graphs)
        self.made: dict = {}  # graph -> its values made from the input
        self.followed: dict = {}  # (graph, its arguments' shapes) -> its shapes
        # the made values of the graphs being followed, innermost last
        self.within: list = []
        self.traced: dict = {}  # node -> (op, attrs) as traced
        self.became: dict = {}  # node -> the op it became where first followed
        self.lengths: set = set()  # the sizes of an aligned axis: the sequence's length

    def run(self, entry: tuple, reached: list) -> dict:
        """The entry's shapes, every reached graph followed."""
        graph = self.graphs[entry]
        ids = {x: (None, LENGTH) for x in graph.inputs[:1]}  # [batch, length]
        shapes = self.follow(graph, {x: ids.get(x) for x in graph.inputs})
        for key in reached:  # a call whose graph the shapes do not follow: its own
            if self.graphs[key] not in self.made:
                self.follow(self.graphs[key], {})
        return shapes

    def follow(self, graph: Graph, given: dict) -> dict:
        """The graph's shapes, its arguments `given`; followed once per distinct shapes (a
        defun called from many places, at many depths, is not followed again)."""
        if graph not in self.made:
            self.made[graph] = _from_input(graph)
        key = (graph, tuple(given.get(x) for x in graph.inputs))
        if key not in self.followed:
            self.within.append(self.made[graph])
            try:
                self.followed[key] = self.nodes(graph.model, graph.nodes, given)
            finally:
                self.within.pop()
        return self.followed[key]

    def _node(self, node: Node, model: str, found: dict):
        if node.kind in CALLS:
            callee = self._callee(node, model)
            if callee is None:
                return None
            shapes = self.follow(
                callee, dict(zip(callee.inputs, _operands(node, found)))
            )
            if isinstance(callee.output, tuple):
                return tuple(shapes.get(o) for o in callee.output)
            return shapes.get(callee.output)
        if node.kind is not Kind.OP:
            return super()._node(node, model, found)
        seen = self._cache(node, found)
        dims = super()._node(node, model, found)
        rule = node.op.sequence
        return rule(seen, ranked(dims)) if rule else dims

    def _cache(self, node: Node, found: dict) -> Seen:
        """The node's `cached` rule, from the op it was traced as (a graph called with other
        shapes is followed again); the op it becomes, the same at every call."""
        op, attrs = self.traced.setdefault(node, (node.op, node.attrs))
        made = self.within[-1]
        lengths = frozenset(k for k, v in attrs.items() if _run_node(v) in self.lengths)
        seen = Seen(
            attrs,
            _operands(node, found),
            tuple(x in made for x in node.inputs),
            lengths,
        )
        found = op.cached(seen) if op.cached else None
        if found is None and node in made and op.mixes_along(attrs):
            found = "combines values along an axis that may be the sequence's"
        if op.mixes and open_keys(seen, _mixed_axes(attrs)):
            found = (
                "combines keys no causal mask covers: a cached step has only those up to "
                "its own; mask the scores with (causal-mask ...) first"
            )
        if isinstance(found, str):
            raise SourceError(
                node.span, f"a :generate run cannot cache {echo(node.form)}: it {found}"
            )
        length = [n for n in (*node.inputs, *numbers_read(node)) if n in self.lengths]
        if length and (
            found is None or {_run_node(attrs[k]) for k in lengths} != set(length)
        ):
            raise SourceError(
                length[0].span,
                f"a :generate run cannot cache {echo(length[0].form)}: it uses the "
                "sequence's size as a value, which a cached step does not see",
            )
        if found is not None and op.python_number:
            self.lengths.add(node)
        # the rule names the op the node becomes: its entry is looked up once, here
        became = (REGISTRY[found[0]], found[1]) if found else (op, attrs)
        if self.became.setdefault(node, became[0]) != became[0]:
            raise SourceError(
                node.span,
                f"a :generate run cannot cache {echo(node.form)}: its defun is called with "
                "the sequence on different axes",
            )
        node.op, node.attrs = became
        return seen


def _mixed_axes(attrs: dict):
    """The axes an op that mixes values combines along (None: every axis)."""
    axes = attrs.get("axis", attrs.get("axes"))
    return (
        None
        if axes is None
        else tuple(axes) if isinstance(axes, (list, tuple)) else (axes,)
    )


def _operands(node: Node, found: dict) -> tuple:
    """The shapes of a node's operands (a number's is ()); a size the rank rules computed
    from the sequence's length (2 x LENGTH, of a concat) unknown, as it is."""
    return tuple(
        () if isinstance(x, Scalar) else _unmarked(ranked(found.get(x)))
        for x in node.inputs
    )


def _unmarked(dims):
    if dims is None:
        return None
    return tuple(None if d not in MARKS and (d or 0) >= _DERIVED else d for d in dims)


_DERIVED = 2**40  # a size this large is LENGTH's arithmetic


def _run_node(value) -> Optional[Node]:
    """The node whose Python number a scalar is, where it is one alone."""
    if isinstance(value, Scalar) and value.op is ScalarOp.RUN:
        return value.args[0]
    return None


def _from_input(graph: Graph) -> set:
    """The values computed from the graph's arguments or carried values (activations), not
    counting reads for a shape or device alone."""
    made = set(graph.inputs)
    for node in walk(graph.nodes):
        for region in node.regions:
            made.update(region.inputs)
        op = node.op
        if any(x in made and not _shape_only(op, k) for k, x in enumerate(node.inputs)):
            made.add(node)
    return made


def _shape_only(op, k: int) -> bool:
    """Whether an op reads its k-th operand for its shape or device alone."""
    return op is not None and k < len(op.args) and op.args[k].kind is ArgKind.LIKE


def _holding(program: Program, graphs: dict, reached: list) -> dict:
    """For each reached defun, whether it calls an op that keeps keys and values or a
    state, at any depth (calls nest at most MAX_CALL_DEPTH deep, without recursion: trace
    checked it)."""
    holds: dict = {}

    def visit(key: tuple) -> bool:
        if key not in holds:
            graph = graphs[key]
            for callee, _ in calls(program, graph):
                visit(callee)
            holds[key] = any(
                _holds(n, graph, program, holds) for n in walk(graph.nodes)
            )
        return holds[key]

    for key in reached:
        visit(key)
    return holds


def _holds(node: Node, graph: Graph, program: Program, holds: dict) -> bool:
    if node.kind is Kind.OP:
        return node.op.caches or node.op.state
    if node.kind in (Kind.CALL, Kind.SUBMODEL):
        return holds[_callee(node, graph, program)]
    return any(
        _holds(n, graph, program, holds) for r in node.regions for n in walk(r.nodes)
    )


def _callee(node: Node, graph: Graph, program: Program) -> tuple:
    target = node.attrs["target"]
    if node.kind is Kind.CALL:
        return (graph.model, target)
    callee = program.submodel(
        program.model(graph.model), target, node.attrs.get("item")
    )
    return (callee, "forward")


def _keep_last(graph: Graph, program: Program, holds: dict, shapes: dict) -> None:
    """Put `last-position` after the last top-level node of forward that reaches an
    attention (after each of its ITEMs where it gives several values): every later reader
    of it reads the last position, along the axis that value holds the positions on (axis
    1 where its shape does not say: the ids')."""
    last = [n for n in graph.nodes if _holds(n, graph, program, holds)][-1]
    items = [n for n in graph.nodes if n.kind is Kind.ITEM and n.inputs[0] is last]
    for value in items or [last]:
        dims = ranked(shapes.get(value))
        aligned = list(dims).index(LENGTH) if dims and dims.count(LENGTH) == 1 else None
        _slice_after(graph, value, SEQUENCE if aligned is None else aligned)


def _slice_after(graph: Graph, value: Node, axis: int) -> None:
    kept = Node(
        Kind.OP,
        LAST_POSITION,
        (value,),
        {"axis": Scalar.lit(axis)},
        value.span,
        value.form,
        value.frames,
    )
    at = graph.nodes.index(value) + 1
    after = set(walk(graph.nodes[at:]))
    for node in after:
        node.inputs = tuple(kept if x is value else x for x in node.inputs)
        for region in node.regions:
            region.outputs = [kept if x is value else x for x in region.outputs]
    graph.nodes.insert(at, kept)
    for expansion in graph.expansions:  # the library ops the functions pass may call
        if expansion.result in after:
            expansion.inputs = tuple(
                kept if x is value else x for x in expansion.inputs
            )
    if isinstance(graph.output, tuple):
        graph.output = tuple(kept if x is value else x for x in graph.output)
    elif graph.output is value:
        graph.output = kept
