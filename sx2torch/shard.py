"""The shard pass: the tensor-parallel plan, which linear layers of a model split across
devices, derived from the graphs as Megatron-LM splits a transformer.

A *linear layer* is a sub-model whose forward is one `linear` of its input by its weights
(torch's [out, in] layout), as nn.Linear is. Called on a whole input, its weights can be
split by rows (*colwise*): each device computes a share of the output features. That share
may flow only through ops that keep it (the registry's `shards` rules: elementwise ops,
heads split from the features and merged back, per-head attention, rotary within a head)
into a linear layer that contracts it (*rowwise*: its weights split by columns, each
device's product a partial sum that one all-reduce completes). The layers a split value
joins form a group; where any of its values meets an op that needs the whole of it (a
norm over the features, a loss, a loop, a sub-model that is no linear layer), the group's
weights stay whole on every device, and the plan says which op and where. A group of
colwise layers alone gathers their output instead (`colwise_gather_output`: the weight is
split, the output whole again), as transformers' plan does for lm_head.

Weights read any other way (a matmul on a raw parameter, as tiny-gpt's, an embedding, a
norm's scale) are kept whole, each with its reason: this pass splits linear layers only,
so the generated code itself never calls a collective.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from sx2torch.ir import LIBRARY, Graph, Kind, Node, callee_key, outputs, walk
from sx2torch.ops.sharding import PARTIAL, Heads, Refused
from sx2torch.syntax.names import mangle
from sx2torch.syntax.program import LISTS, Program
from sx2torch.syntax.scalars import ScalarOp

COLWISE, ROWWISE, GATHER = "colwise", "rowwise", "colwise_gather_output"


@dataclass(frozen=True)
class Entry:
    path: str  # the weight's module, from the top one: model.layers.*.self_attn.q_proj
    style: Optional[str]  # COLWISE, ROWWISE or GATHER; None: whole on every device
    reason: str = ""  # why it is whole (or why its output is gathered)
    # a colwise layer whose output splits into heads: each head's sizes (scalars, literals
    # or consts of `owner`, the model that calls the layer), which every device's share of
    # its rows must hold whole
    heads: tuple = ()
    owner: str = ""


@dataclass
class Plan:
    entries: list = field(default_factory=list)  # [Entry], in the modules' order
    # the precision of a rowwise layer's reduction: f32 partial sums rounded once, or the
    # partial products rounded to bf16 and summed in bf16 (transformers', torchtitan's)
    reduce: str = "f32"

    @property
    def styles(self) -> dict:
        """The plan as the runtime applies it: module path -> style."""
        return {e.path: e.style for e in self.entries if e.style}

    @property
    def whole(self) -> list:
        return [e for e in self.entries if not e.style]


def run(program: Program, graphs: dict, reduce: str = "f32") -> Plan:
    units = {
        model.name: ways
        for model in program.models.values()
        if (ways := _linear_layer(model, graphs))
    }
    groups = _Groups()
    for (model, _), graph in graphs.items():
        if model != LIBRARY:
            _Flow(program, graphs, units, groups).top(graph)
    _ties(program, groups)
    return Plan(_entries(program, units, groups), reduce)


def _linear_layer(model, graphs: dict) -> frozenset:
    """The ways a model splits as a linear layer: COLWISE with each weight split by rows and
    its output then split along its features, ROWWISE with its input split along its
    features and its matrix by columns, giving a partial sum. Empty: no linear layer (a
    frozen weight is a buffer, which torch's styles do not split)."""
    declared = model.params.values()
    if any(p.is_module or not p.trainable for p in declared) or set(model.defuns) != {
        "forward"
    }:
        return frozenset()
    graph = graphs[(model.name, "forward")]
    if len(graph.inputs) != 1 or graph.arity != 1 or not model.params:
        return frozenset()
    params = [n for n in walk(graph.nodes) if n.kind is Kind.PARAM]
    if any(_dims(p) is None for p in params):
        return frozenset()
    ways = set()
    (x,) = graph.inputs
    if _alone(graph, {p: -len(_dims(p)) for p in params if _dims(p)}) == -1:
        ways.add(COLWISE)
    columns = {p: -1 for p in params if len(_dims(p)) == 2}
    if _alone(graph, {x: -1, **columns}) == PARTIAL:
        ways.add(ROWWISE)
    return frozenset(ways)


def _dims(node) -> Optional[tuple]:
    dims = getattr(node.shape, "dims", None) if isinstance(node, Node) else None
    return dims if isinstance(dims, tuple) else None


def _alone(graph: Graph, seeds: dict):
    """The split of a linear layer's output, its input and weights split as `seeds` say;
    None where anything refuses."""
    states = dict(seeds)
    return states.get(graph.output) if _flows(graph.nodes, states) else None


def _flows(nodes: list, states: dict) -> bool:
    """Follows the splits through `nodes` (and their regions) into `states`; False where
    anything refuses. An `if` gives its branches' split where they agree: the layer
    library's Linear chooses between `linear` with and without its bias by a const."""
    for node in nodes:
        if node in states:
            continue
        if any(states.get(i) is not None for i in node.inputs) and not (
            node.kind is Kind.CAST or node.kind is Kind.OP and node.op.shards
        ):
            return False
        if not all(_flows(region.nodes, states) for region in node.regions):
            return False
        if node.kind is Kind.CAST:
            states[node] = states.get(node.inputs[0])
        elif node.kind is Kind.OP and node.op.shards:
            try:
                states[node], _ = _through(node, [states.get(i) for i in node.inputs])
            except Refused:
                return False
        elif node.kind is Kind.IF:
            given = {
                states.get(out) for region in node.regions for out in region.outputs
            }
            if len(given) > 1:
                return False
            states[node] = given.pop()
    return True


def _through(node: Node, axes: list) -> tuple:
    """The output's split axis, and each head's sizes where the op splits the features
    into heads (else None)."""
    shapes = [_dims(i) if isinstance(i, Node) else () for i in node.inputs]
    found = node.op.shards(axes, shapes, node.attrs)
    if isinstance(found, Heads):
        return found.axis, found.sizes
    return found, None


# a value every device holds whole: no split axis, no group, no layer's features
WHOLE = (None, None, frozenset())


class _Groups:
    """Union-find over the linear layers, (model, sub-model param); each root's members'
    ways and the reasons it stays whole."""

    def __init__(self):
        self.parent: dict = {}
        self.ways: dict = {}  # layer -> {COLWISE, ROWWISE}
        self.refused: dict = {}  # root -> [reason]
        self.pinned: set = set()  # layers whose weight itself must stay whole (a tie)
        self.returned: set = set()  # layers whose split output the top model returns
        # colwise layer -> {(model, sizes)}: the heads it splits into
        self.heads: dict = {}

    def find(self, key):
        self.parent.setdefault(key, key)
        while self.parent[key] != key:
            key = self.parent[key]
        return key

    def add(self, key, way: str) -> None:
        self.ways.setdefault(key, set()).add(way)
        self.find(key)

    def union(self, keys) -> Optional[tuple]:
        roots = list(dict.fromkeys(self.find(k) for k in keys if k is not None))
        for other in roots[1:]:
            self.parent[other] = roots[0]
            self.refused.setdefault(roots[0], []).extend(self.refused.pop(other, []))
        return roots[0] if roots else None

    def pin(self, key, reason: str) -> None:
        self.pinned.add(key)
        self.refuse(key, reason)

    def refuse(self, key, reason: str) -> None:
        reasons = self.refused.setdefault(self.find(key), [])
        if reason not in reasons:
            reasons.append(reason)

    def members(self, key) -> list:
        root = self.find(key)
        return [k for k in self.parent if self.find(k) == root]


class _Flow:
    """Splits through one graph, and the graphs it calls, from whole inputs. A value's
    state is its split axis, its group, and the colwise layers whose output features it
    still is, feature for feature (their heads' sizes are recorded where it splits into
    heads)."""

    def __init__(self, program: Program, graphs: dict, units: dict, groups: _Groups):
        self.program, self.graphs = program, graphs
        self.units = units  # linear layers' models -> the ways they split
        self.groups = groups
        # (callee, its arguments' states) -> its outputs' states: a callee is walked once per
        # state its calls pass, not once per path through a DAG of calls (2**depth)
        self.calls: dict = {}

    def top(self, graph: Graph) -> None:
        for value, (axis, group, _) in zip(
            outputs(graph), self.graph(graph, [WHOLE] * len(graph.inputs))
        ):
            if axis is not None:
                self.groups.refuse(group, f"{_where(graph, value)} returns it split")
                if graph.model == self.program.top.name:
                    self.groups.returned.add(group)

    def graph(self, graph: Graph, args: list) -> list:
        states = dict(zip(graph.inputs, args))
        for node in walk(graph.nodes):
            if node not in states:
                states[node] = self.node(graph, node, states)
        for node in walk(graph.nodes):  # a region's values, given to its if or loop
            for region in node.regions:
                for value in region.outputs:
                    axis, group, _ = states.get(value, WHOLE)
                    if axis is not None:
                        self.groups.refuse(group, f"{_where(graph, node)} carries it")
        return [states.get(v, WHOLE) for v in outputs(graph)]

    def node(self, graph: Graph, node: Node, states: dict) -> tuple:
        read = [states.get(i, WHOLE) for i in node.inputs]
        axes = [a for a, _, _ in read]
        group = None
        if axes.count(None) != len(
            axes
        ):  # split values read (few are): their groups joined
            group = self.groups.union(g for a, g, _ in read if a is not None)
        if node.kind is Kind.PARAM and node.attrs.get("via"):
            self._inline(graph, node)
        if node.kind is Kind.CAST:
            return read[0]
        if node.kind is Kind.SUBMODEL:
            return self._submodel(graph, node, axes, group)
        if node.kind is Kind.CALL:
            key = (callee_key(node, graph.model), tuple(read))
            if key not in self.calls:
                self.calls[key] = self.graph(self.graphs[key[0]], read)
            got = self.calls[key]
            return got[0] if len(got) == 1 else self._refuse(graph, node, got, group)
        if node.kind is Kind.OP and node.op.shards and group is not None:
            try:
                axis, heads = _through(node, axes)
            except Refused as refused:
                self.groups.refuse(group, f"{_where(graph, node)}: {refused}")
                return WHOLE
            if axis is None:
                return WHOLE
            layers = frozenset().union(*(o for a, _, o in read if a is not None))
            if heads is not None:
                self._heads(graph, node, layers, heads, group)
            return axis, group, layers if axis == -1 and heads is None else frozenset()
        if group is not None:
            self.groups.refuse(group, f"{_where(graph, node)} needs all of it")
        return WHOLE

    def _heads(self, graph: Graph, node: Node, layers, sizes: tuple, group) -> None:
        """Record the heads `layers`' output splits into, whose sizes the runtime reads
        from the built module (a number, or a const of the model calling the layer) to
        check that each device holds whole heads."""
        if not all(
            s.op is ScalarOp.LIT or s.op is ScalarOp.CONST and len(s.args) == 1
            for s in sizes
        ):
            self.groups.refuse(
                group,
                f"{_where(graph, node)}: its heads' size is neither a number nor a "
                f"const of {graph.model}, so that the heads could not be checked whole",
            )
        for layer in layers:
            self.groups.heads.setdefault(layer, set()).add((graph.model, sizes))

    def _refuse(self, graph: Graph, node: Node, got: list, group) -> tuple:
        for axis, inner, _ in got:
            if axis is not None:
                self.groups.refuse(inner, f"{_where(graph, node)} returns it split")
        return WHOLE

    def _submodel(self, graph: Graph, node: Node, axes: list, group) -> tuple:
        model = self.program.model(graph.model)
        key = (graph.model, node.attrs["target"])
        whole = "item" in node.attrs  # an item of a list or a choice: ITEM
        ways = (
            frozenset()
            if whole
            else self.units.get(model.params[key[1]].init.model, frozenset())
        )
        if any(a is not None for a in axes):
            if ROWWISE in ways and axes == [-1]:
                self.groups.add(key, ROWWISE)
                self.groups.union([key, group])
                return WHOLE
            self.groups.refuse(group, f"{_where(graph, node)} needs all of it")
            return WHOLE
        if COLWISE in ways:
            self.groups.add(key, COLWISE)
            return -1, key, frozenset({key})
        return WHOLE

    def _inline(self, graph: Graph, node: Node) -> None:
        key = node.attrs["via"][-1]  # (model, sub-model): the instance read through
        self.groups.pin(
            key, f"{_where(graph, node)} reads its weight outside its forward"
        )


def _where(graph: Graph, node) -> str:
    at = f" at {node.span.line}:{node.span.col}" if isinstance(node, Node) else ""
    return f"{node.what if isinstance(node, Node) else 'it'} in {graph.model}.{graph.name}{at}"


def _ties(program: Program, groups: _Groups) -> None:
    """A layer whose weight is tied, or weight-normed (torch's parametrization computes
    it from two tensors a split does not know), stays whole."""
    for model in program.all_models():
        for name, param in model.params.items():
            for init in param.init.instances if param.is_module else ():
                if init.weight_norm is not None:
                    groups.pin(
                        (model.name, name),
                        f"{name}'s {init.weight_norm.name.name} is weight-normed",
                    )
        for tie in model.ties:
            for name in (tie.name, tie.target):
                steps = program.member(model, name.name)
                if steps and len(steps) >= 2:
                    owner, sub = steps[-2]
                    groups.pin(
                        (owner.name, sub),
                        f"its weight is tied: (tie {tie.name.name} {tie.target.name})",
                    )


def _entries(program: Program, units: dict, groups: _Groups) -> list:
    """Each linear layer's style, and each weight kept whole with its reason, by path."""
    found, seen = [], set()

    def visit(model, path: str) -> None:
        for name, param in model.params.items():
            here = f"{path}{mangle(name)}"
            for k, init in enumerate(param.init.instances if param.is_module else ()):
                sub = program.models[init.model]
                there = here + (".*" if init.kind == "stack" else "")
                there += f".{k}" if param.init.kind in LISTS else ""
                if sub.name not in units:
                    visit(sub, f"{there}.")
                    continue
                entry = (
                    Entry(there, None, ITEM)
                    if init is not param.init
                    else _verdict(groups, (model.name, name), there)
                )
                if entry.path not in seen:
                    seen.add(entry.path)
                    found.append(entry)
            if not param.is_module and here not in seen:
                seen.add(here)
                found.append(Entry(here, None, f"{_not_linear(model)}"))

    visit(program.top, "")
    return found


# why a linear layer that is an item of a sequential, module-list or choice stays whole
ITEM = "an item of a list or choice of sub-models, whose calls the plan does not follow"


def _not_linear(model) -> str:
    return (
        f"read by {model.name}, no linear layer (a sub-model whose forward is one linear "
        "of its input by its weights, the only layers split)"
    )


def _verdict(groups: _Groups, key: tuple, path: str) -> Entry:
    if key not in groups.ways:
        return Entry(path, None, "never called on a whole input nor a split one")
    members = groups.members(key)
    reasons = list(groups.refused.get(groups.find(key), []))
    ways = {w for m in members for w in groups.ways.get(m, ())}
    both = [m for m in members if len(groups.ways.get(m, ())) > 1]
    if both:
        reasons.append(f"{'.'.join(both[0])} is called both ways")
    twice = [m for m in members if len(groups.heads.get(m, ())) > 1]
    if twice:
        reasons.append(f"{'.'.join(twice[0])}'s output splits into heads of two sizes")
    (owner, heads), *_ = groups.heads.get(key) or [("", ())]
    if not reasons:
        return Entry(path, next(iter(groups.ways[key])), heads=heads, owner=owner)
    returned = groups.returned & set(members)
    if ways == {COLWISE} and returned and not groups.pinned & set(members):
        return Entry(path, GATHER, "; ".join(reasons))  # gathered: read whole
    return Entry(path, None, "; ".join(reasons))
