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

An encoder-decoder's run names the argument that grows (the decoder's ids); the others are the
prompt's. Values are followed as made from the sequence or the prompt: a call of the prompt's
values alone is made once per prompt (`once`: the encoder, a cross-attention's key and value
projections), and a sub-model that the sequence reaches through other values than where it was
first followed, whose code the pass rewrites differently there (a cross-attention, beside the
self-attention of the same model), is followed as a copy of its model, the instance's own.
"""

from __future__ import annotations

from copy import deepcopy
from dataclasses import replace
from typing import Optional

from sx2torch.errors import SourceError
from sx2torch.ir import CALLS, Graph, Kind, Node, Scalar, numbers_read, walk
from sx2torch.ops import REGISTRY, ArgKind
from sx2torch.ops.cache import LAST_POSITION
from sx2torch.ops.sequence import (
    KEYS,
    LENGTH,
    MARKS,
    OPEN_KEYS,
    SEQUENCE,
    Seen,
    open_keys,
)
from sx2torch.ops.shapes import Analysis, agreed, ranked, reshape
from sx2torch.syntax.scalars import ScalarOp
from sx2torch.syntax.echo import echo
from sx2torch.syntax.program import Program, Run
from sx2torch.trace.calls import calls, head


def run(program: Program, graphs: dict, chosen: Optional[Run]) -> None:
    if chosen is None or not chosen.generate:
        return
    entry = (program.top.name, "forward")
    shapes = _Follow(program, graphs).run(entry, grows(chosen, program))
    reached = _reached(program, graphs, entry)
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
    # their ops rewritten, their nodes read the last position: shaped again
    for graph in graphs.values():
        reshape(graph, program)


def grows(chosen: Run, program: Program) -> int:
    """The index of forward's argument that grows: `:generate true`'s first, or the one the
    run names (an encoder-decoder's decoder ids)."""
    if chosen.generate is True:
        return 0
    names = [a.name for a in program.top.defuns["forward"].args]
    if chosen.generate not in names:
        raise SourceError(
            chosen.span,
            f"run '{chosen.name}' generates '{chosen.generate}', which is not an argument "
            f"of forward ({' '.join(names)})",
        )
    return names.index(chosen.generate)


def _reached(program: Program, graphs: dict, entry: tuple) -> list:
    """`entry` and the defuns it calls, at any depth, but through a call computed once per
    prompt (which runs as the plain module does)."""
    found, pending = [], [entry]
    while pending:
        key = pending.pop()
        if key not in found:
            found.append(key)
            pending.extend(callee for callee, _ in _calls(program, graphs[key]))
    return found


def _calls(program: Program, graph: Graph) -> list:
    once = [n for n in walk(graph.nodes) if n.attrs.get("once")]
    skipped = [(_callee(n, graph, program), head(n.form)) for n in once]
    return [call for call in calls(program, graph) if call not in skipped]


class _Follow(Analysis):
    """The reached graphs' shapes as the generating forward calls them, its ids
    `[batch, LENGTH]` (sx2torch/ops/sequence.py), each op's `cached` rule applied in place as
    its node is reached; what cannot be cached, a diagnostic."""

    def __init__(self, program: Program, graphs: dict):
        super().__init__(program, graphs)
        # (graph, its arguments' roles) -> (its values made from the sequence, from the prompt)
        self.made: dict = {}
        self.followed: dict = {}  # (graph, its arguments' shapes, roles) -> its shapes
        # the made values of the graphs being followed, innermost last
        self.within: list = []
        self.traced: dict = {}  # node -> (op, attrs) as traced
        self.became: dict = {}  # node -> the op it became where first followed
        self.lengths: set = set()  # the sizes of an aligned axis: the sequence's length
        self.once: dict = {}  # call node -> whether it is computed once per prompt
        self.kept: set = set()  # the values made from what such a call gives

    def run(self, entry: tuple, grows: int) -> dict:
        """The entry's shapes, its argument `grows` the sequence's ids [batch, LENGTH] and
        the others the prompt's; every graph reached followed."""
        graph = self.graphs[entry]
        roles = tuple(
            SEQUENCE_ROLE if k == grows else PROMPT for k in range(len(graph.inputs))
        )
        ids = {graph.inputs[grows]: (None, LENGTH)}
        shapes = self.follow(graph, {x: ids.get(x) for x in graph.inputs}, roles)
        for key in _reached(self.program, self.graphs, entry):
            graph = self.graphs[key]  # a call whose graph the shapes do not follow
            if not any(k[0] is graph for k in self.made):
                self.follow(graph, {}, (SEQUENCE_ROLE,) * len(graph.inputs))
        return shapes

    def follow(self, graph: Graph, given: dict, roles: tuple) -> dict:
        """The graph's shapes, its arguments `given`, each made from the sequence or the
        prompt or neither (`roles`); followed once per distinct shapes and roles (a defun
        called from many places, at many depths, is not followed again)."""
        made = self.made.setdefault((graph, roles), _from_input(graph, roles))
        key = (graph, tuple(given.get(x) for x in graph.inputs), roles)
        if key not in self.followed:
            self.within.append(made)
            try:
                # `none` (a carried value before the first layer sets it) holds no positions
                given = {**given, None: ()}
                self.followed[key] = self.nodes(graph.model, graph.nodes, given)
            finally:
                self.within.pop()
        return self.followed[key]

    def _node(self, node: Node, model: str, found: dict):
        if any(x in self.kept for x in node.inputs):
            self.kept.add(node)
        if node.kind in CALLS:
            callee = self._callee(node, model)
            if callee is None:
                return None
            sequence, prompt = self.within[-1]
            roles = tuple(
                SEQUENCE_ROLE if x in sequence else PROMPT if x in prompt else None
                for x in node.inputs
            )
            # the first call of the prompt's values: one of what it gives runs each time
            once = PROMPT in roles and SEQUENCE_ROLE not in roles
            once = once and not any(x in self.kept for x in node.inputs)
            if self.once.setdefault(node, once) != once:
                raise SourceError(
                    node.span,
                    f"a :generate run cannot cache {echo(node.form)}: its defun is called "
                    "with the sequence's values in one place and the prompt's in another",
                )
            if once:  # the encoder, cross-attention's keys: computed once per prompt
                node.attrs = {**node.attrs, "once": True}
                self.kept.add(node)
                return None
            given = dict(zip(callee.inputs, _operands(node, found)))
            if node.kind is Kind.SUBMODEL and self._other_roles(callee, roles):
                callee, given = self._own_copy(node, model, callee, given, roles)
            shapes = self.follow(callee, given, roles)
            if isinstance(callee.output, tuple):
                return tuple(shapes.get(o) for o in callee.output)
            return shapes.get(callee.output)
        if node.kind is Kind.IF:  # a branch decided when the module runs: either's axes
            branches = [ranked(self._region(r, model, found)[0]) for r in node.regions]
            # a number or none in one branch holds no positions: the other's axes
            branches = [dims for dims in branches if dims != ()] or [()]
            if any(_crossed(axis) for axis in zip(*filter(None, branches))):
                raise SourceError(
                    node.span,
                    f"a :generate run cannot cache {echo(node.form)}: one branch holds "
                    "the chunk's positions where the other holds the cached keys'",
                )
            return agreed(branches)
        if node.kind is not Kind.OP:
            return super()._node(node, model, found)
        seen = self._cache(node, found)
        dims = super()._node(node, model, found)
        rule = node.op.sequence
        return rule(seen, ranked(dims)) if rule else dims

    def _other_roles(self, graph: Graph, roles: tuple) -> bool:
        """Whether the graph was followed with its arguments made from other values (the
        sequence's where these are the prompt's: a decoder's self- and cross-attention).
        """
        return any(g is graph and r != roles for g, r in self.made)

    def _own_copy(self, node: Node, model: str, callee: Graph, given: dict, roles):
        """The callee of a sub-model call that the sequence reaches through other values
        than where it was followed before: followed as a copy of its model, the instance's
        own where the pass rewrites anything differently (cross-attention's products are
        the plain ones, its keys computed once per prompt), else the callee itself."""
        target = node.attrs["target"]
        init = self.program.instance(
            self.program.model(model), target, node.attrs.get("item")
        )
        original = self.program.models[init.model]
        name = _fresh(self.program, f"{original.name}-{target}")
        copies = {}
        for defun in original.defuns:
            copies[defun] = _copy(self.graphs[original.name, defun], name, self.traced)
            self.graphs[name, defun] = copies[defun]
        models = list(self.program.models.items())  # the copy's class after its own
        at = [n for n, _ in models].index(original.name) + 1
        copied = replace(original, name=name, copy_of=(original.name, target))
        models.insert(at, (name, copied))
        self.program.models = dict(models)
        init.model = name
        copy = copies["forward"]
        shapes = self.follow(copy, dict(zip(copy.inputs, given.values())), roles)
        if all(_same(self.graphs[original.name, d], copies[d]) for d in copies):
            init.model = original.name  # the same code serves both: no copy
            del self.program.models[name]
            for defun in copies:
                del self.graphs[name, defun]
            return callee, given
        return copy, dict(zip(copy.inputs, given.values()))

    def _cache(self, node: Node, found: dict) -> Seen:
        """The node's `cached` rule, from the op it was traced as (a graph called with other
        shapes is followed again); the op it becomes, the same at every call."""
        op, attrs = self.traced.setdefault(node, (node.op, node.attrs))
        made = self.within[-1][0]
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
    if axes is None:
        return None
    return tuple(axes) if isinstance(axes, (list, tuple)) else (axes,)


def _crossed(sizes: tuple) -> bool:
    """Whether an axis is the chunk's positions in one value and the keys' in another."""
    return LENGTH in sizes and bool({OPEN_KEYS, KEYS} & set(sizes))


def _fresh(program: Program, name: str) -> str:
    taken, k = program.models, 2
    found = name
    while found in taken:
        found, k = f"{name}-{k}", k + 1
    return found


def _copy(graph: Graph, model: str, traced: dict) -> Graph:
    """A copy of the graph as traced (its ops as they were before the pass rewrote them),
    for the model `model`: the registry's entries are shared, every node its own."""
    copied = deepcopy(graph, {id(op): op for op in REGISTRY.values()})
    copied.model = model
    for original, node in zip(walk(graph.nodes), walk(copied.nodes)):
        if original in traced:
            node.op, node.attrs = traced[original][0], dict(traced[original][1])
        node.attrs.pop("once", None)
    return copied


def _same(graph: Graph, copied: Graph) -> bool:
    """Whether the pass rewrote a graph and its copy alike."""
    return all(
        a.op is b.op and a.attrs.get("once") == b.attrs.get("once")
        for a, b in zip(walk(graph.nodes), walk(copied.nodes))
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


# what an argument of a followed graph is made from
SEQUENCE_ROLE, PROMPT = "sequence", "prompt"


def _from_input(graph: Graph, roles: tuple) -> tuple:
    """(the values computed from the graph's arguments made from the sequence, or from
    those made from the prompt), their carried values among them (activations), not
    counting reads for a shape or device alone."""
    found = []
    for role in (SEQUENCE_ROLE, PROMPT):
        made = {x for x, r in zip(graph.inputs, roles) if r == role}
        size = -1
        while size != len(made):  # a conditional's value is made where a branch's is
            size = len(made)
            for node in walk(graph.nodes):
                if _made_by(node, made):
                    made.add(node)
                    for region in node.regions:
                        made.update(region.inputs)
        found.append(made)
    return tuple(found)


def _made_by(node: Node, made: set) -> bool:
    given = [out for region in node.regions for out in region.outputs]
    return any(x in made for x in given) or any(
        x in made and not _shape_only(node.op, k) for k, x in enumerate(node.inputs)
    )


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
            for callee, _ in _calls(program, graph):
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
        return not node.attrs.get("once") and holds[_callee(node, graph, program)]
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
