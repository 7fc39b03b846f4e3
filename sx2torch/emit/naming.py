"""The names pass: a Python name for every class, attribute, method and local, before emission.

Each scope is a `Namespace`: the module's classes; a class's constructor arguments,
attributes and methods; a method's arguments, `&key` arguments, locals, cast temporaries
and loop variables. Source names are allocated first in every scope, so no generated name
takes one. Locals are allocated in the order their statements are written, and a local
whose value is dead (by the layout's liveness, which keeps a value read in a loop live until
the loop ends) gives its name to a new value, unless the new value has a source name of
its own. The modules the plan says the code imports (`math`) are taken in every scope.
`--dump-after names` prints the result.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from sx2torch.emit.names import MODULE_ATTRIBUTES, Namespace, plain_attribute
from sx2torch.ir import CALLS, ISLAND, REGION, Kind, Node, walk
from sx2torch.plan import Plans
from sx2torch.plan.casts import Hoist
from sx2torch.plan.layout import RETURN, TOP, Layout, returns_expression
from sx2torch.policy import Typed
from sx2torch.policy.rules import is_param
from sx2torch.syntax.names import mangle
from sx2torch.syntax.program import Model, Program

MAX_DERIVED = 40  # characters of a temporary's name made from its input's


@dataclass
class Locals:
    """The names of one method's values."""

    args: list
    keys: dict  # &key -> name
    values: dict  # Node -> local name
    hoists: dict = field(default_factory=dict)  # Hoist (the layout's) -> name
    loops: dict = field(default_factory=dict)  # FOR -> (index name or None, layer name)
    # a FOR whose adjoint loop reads the carried values of each layer -> their lists' names
    records: dict = field(default_factory=dict)
    # a value the source binds to several names -> the name its statement assigns, and
    # the other names, assigned from it right after (`values` holds the last)
    targets: dict = field(default_factory=dict)
    aliases: dict = field(default_factory=dict)
    # a call giving several values -> the names its statement unpacks them into
    unpacked: dict = field(default_factory=dict)
    # a `let`-bound compile-time number the layout keeps as a local -> its name
    scalars: dict = field(default_factory=dict)


@dataclass
class Naming:
    """The pass's output: every name the emitted module binds."""

    classes: dict  # model -> class name
    attrs: dict  # model -> {const, param or sub-model -> attribute name}
    locals: dict  # Typed -> Locals
    methods: dict = field(default_factory=dict)  # Typed -> method name
    # model -> {param or sub-model whose key is no plain attribute -> its store}
    stores: dict = field(default_factory=dict)


def run(program: Program, plans: Plans) -> Naming:
    """Names what the plan decided: a method per code that serves specializations, a
    local per statement of each plan's layout."""
    imported = plans.imports
    classes = _class_names(program, imported)
    attrs = {}
    namespaces = {}
    for model in program.all_models():
        attrs[model.name], namespaces[model.name] = attributes(
            model, _built_classes(model, classes), imported
        )
    stores = {
        model.name: _stores(model, attrs[model.name]) for model in program.all_models()
    }
    locals_ = {
        typed: _LocalNaming(plan.layout, imported).run()
        for typed, plan in plans.plans.items()
    }
    methods = _method_names(program, plans, namespaces)
    return Naming(classes, attrs, locals_, methods, stores)


def class_name(name: str) -> str:
    """`tiny-gpt` -> `TinyGpt`."""
    parts = [p for p in mangle(name).split("_") if p]
    return "".join(p[0].upper() + p[1:] for p in parts) or "Model"


def _class_names(program: Program, imported: frozenset) -> dict:
    names = Namespace(imported)
    return {
        model.name: names.fresh(class_name(model.name))
        for model in [program.top, *program.models.values()]
    }


def _built_classes(model: Model, classes: dict) -> frozenset:
    """The classes a model's constructor names, to build its sub-models."""
    return frozenset(
        classes[init.model]
        for param in model.params.values()
        if param.is_module
        for init in param.init.instances
    )


def attributes(
    model: Model, classes: frozenset = frozenset(), imported: frozenset = frozenset()
) -> tuple:
    """Attribute names for consts, params and sub-models; and the class namespace for methods.

    A parameter's or sub-model's name is its `state_dict` key, kept exactly (a checkpoint
    names it); a const is also a constructor argument, which must not shadow a class the
    constructor builds, nor a Python name, nor a module the code imports.
    """
    names = Namespace(MODULE_ATTRIBUTES | imported)
    attrs = {name: mangle(name) for name in model.params}
    names.taken.update(attrs.values())
    attrs.update((name, names.fresh(name, avoid=classes)) for name in model.consts)
    return attrs, names


def argument(const, attrs: dict) -> str:
    """A const's name as its constructor's argument: its key's, where its instances pass
    it by another key than the name the model reads (`bias`, read as `has-bias`)."""
    return mangle(const.key) if const.key else attrs[const.name]


def _stores(model: Model, attrs: dict) -> dict:
    """The store (`parameters`, `buffers`, `modules`) of each member whose key is no plain
    attribute: a Python keyword, or one of nn.Module's own attributes."""
    return {
        name: store(param)
        for name, param in model.params.items()
        if not plain_attribute(attrs[name])
    }


def store(param) -> str:
    if param.is_module:
        return "modules"
    return "parameters" if param.trainable else "buffers"


def argument_names(typed: Typed, imported: frozenset) -> tuple:
    """Python names of a defun's arguments and &key arguments, the same at every call site."""
    names = Namespace(imported)
    args = [names.fresh(node.name) for node in typed.graph.inputs]
    keys = [names.fresh(key) for key, _ in typed.graph.keys]
    return args, keys, names


def _method_names(program: Program, plans: Plans, namespaces: dict) -> dict:
    """Method names: the specializations one method serves (the plan's `code`) share its
    name. The public one is named as the source names the defun, the others (the plan's
    `specialized`) with their dtypes."""
    names: dict = {}
    for model in program.all_models():
        namespace = namespaces[model.name]
        # Source names first, so that no specialization takes one.
        plain_names = {defun: namespace.fresh(defun) for defun in model.defuns}
        for defun in model.defuns:
            plain = plans.public[model.name, defun]
            chosen: dict = {}  # the code -> its name
            if plain is not None:
                chosen[plans.plans[plain].code] = plain_names[defun]
            for typed in plans.emitted.get((model.name, defun), []):
                code = plans.plans[typed].code
                if plans.function(typed):
                    continue  # named at module level (sx2torch/emit/functions.py)
                if code not in chosen:
                    chosen[code] = namespace.fresh(
                        f"{defun}_{specialization_suffix(typed)}"
                    )
                names[typed] = chosen[code]
    return names


def specialization_suffix(typed: Typed) -> str:
    """`bf16` where an argument is bf16, else `f32`; `island` or `region` for a call in a
    with-numerics form. Never the signature spelled out: two specializations of one
    dtype are numbered (`ln_bf16`, `ln_bf16_2`)."""
    kinds = {str(s) for s in typed.signature if not is_param(s)}
    # the dtype that sets it apart: a bf16 argument's, else an f32 one's, else integers'
    tags = [next((k for k in ("bf16", "f32", "int", "bool") if k in kinds), "f32")]
    if typed.ambient == ISLAND:
        tags.append("island")
    elif typed.ambient == REGION:
        tags.append("region")
    return "_".join(tags)


class _LocalNaming:
    """A method's locals, allocated in the order emission writes their statements."""

    def __init__(self, layout: Layout, imported: frozenset):
        self.layout = layout
        graph = layout.graph
        args, keys, self.names = argument_names(layout.typed, imported)
        self.locals = Locals(
            args,
            dict(zip((k for k, _ in graph.keys), keys)),
            dict(zip(graph.inputs, args)),
        )
        self.values = self.locals.values
        self.holder: dict = {name: node for node, name in self.values.items()}
        # topk's indices -> the gather of its values that their statement assigns too
        self.topk = {
            indices: gather
            for gather, indices in layout.topk_values.items()
            if not layout.absorbs(gather)
        }
        # the names the source gives, which no temporary named for its reader may take
        self.sources = {mangle(n.name) for n in walk(graph.nodes) if n.name} | set(
            args + keys
        )
        self.sources |= {mangle(name) for name, _ in layout.scalars}

    def run(self) -> Locals:
        layout = self.layout
        for name, scalar in layout.scalars:  # assigned before every statement
            self.locals.scalars[scalar] = self._fresh(mangle(name), scalar, -1)
        self._hoists(TOP)
        self._block(layout.graph.nodes)
        if returns_expression(layout):
            self._hoists(RETURN)
        return self.locals

    def _block(self, nodes: list) -> None:
        for node in nodes:
            if node not in self.layout.named:
                continue
            self._hoists(node)
            if node.kind is Kind.FOR:
                self._for(node)
            elif self.layout.compound(node, self.layout.named):
                self._bind(node)
                for index, region in enumerate(node.regions):
                    self._region(node, index)
            else:
                self._bind(node)

    def _region(self, node: Node, index: int) -> None:
        self._block(node.regions[index].nodes)
        self._hoists(self.layout.end(node, index))

    def _hoists(self, statement) -> None:
        for hoist in self.layout.hoists.at.get(statement, []):
            self._hoist(hoist)

    def _hoist(self, hoist: Hoist) -> None:
        operand, want = hoist.operand, hoist.conversion[1]
        base = f"{self.values.get(operand) or operand.name or operand.what}_{want}"
        at = self.layout.order[hoist.statement]
        self.locals.hoists[hoist] = self._fresh(base, (operand, want), at)

    def _for(self, node: Node) -> None:
        """The carried values, then the layer and its index; the items a loop gives are
        known by its carried values' names."""
        (body,) = node.regions
        at = self.layout.order[node]
        items = {item.attrs["index"]: item for item, _ in self.layout.readers[node]}
        carried_count = len(node.inputs)
        for k, (init, carried) in enumerate(zip(node.inputs, body.inputs)):
            item = items.get(k)
            base = (
                carried.name
                or (item and item.name)
                or self.values.get(init)
                or self._label(init)
                or "x"
            )
            self.values[carried] = self._fresh(base, carried, at)
            if item is not None:
                self.values[item] = self.values[carried]
        if node.attrs.get("recorded"):
            self.locals.records[node] = [
                self._fresh(f"{self.values[carried]}_per_layer", (node, k), at)
                for k, carried in enumerate(body.inputs)
            ]
        forward = node.attrs.get("reverse")
        if forward is not None:  # an adjoint loop: named as the forward names them
            for recorded, carried in zip(
                body.inputs[carried_count:], forward.regions[0].inputs
            ):
                self.values[recorded] = self._fresh(self.values[carried], recorded, at)
        layer = self._fresh(node.attrs["layer"], (node, "layer"), at)
        index = node.attrs["index"] and self._fresh(
            node.attrs["index"], (node, "index"), at
        )
        self.locals.loops[node] = (index, layer)
        self._region(node, 0)
        for item in items.values():
            self.holder[self.values[item]] = item

    def _bind(self, node: Node) -> None:
        at = self.layout.order[node]
        if node.kind in CALLS and self.layout.typed.callee[node].graph.arity > 1:
            self._unpack(node, at)
            return
        if node in self.topk:  # `top, chosen = torch.topk(...)`
            gather = self.topk[node]
            self.values[gather] = self._fresh(gather.name or "values", gather, at)
            self.values[node] = self._fresh(node.name or "indices", node, at)
            self.locals.unpacked[node] = [self.values[gather], self.values[node]]
            return
        base = node.name or self._temporary_name(node)
        # A value named after its op and input (`slice_qkv`) takes no dead value's name:
        # two such are two computations, which one name would read as one value.
        derived = (
            node.name is None and node.kind is Kind.OP and base != self._role(node)
        )
        self.values[node] = self._fresh(base, node, at, reuse=not derived)
        if node.aliases:
            first = self.locals.targets[node] = self.values[node]
            # readers read the last alias, so the first name is free for a new value
            self.holder[first] = (node, "assigned")
            self.locals.aliases[node] = [
                self._fresh(alias, node, at) for alias in node.aliases
            ]
            self.values[node] = self.locals.aliases[node][-1]

    def _unpack(self, node: Node, at: int) -> None:
        """`h, pooled = self.encode(x)`: a name for each value read, `_` for the others."""
        items = {r.attrs["index"]: r for r, _ in self.layout.readers[node]}
        names = self.locals.unpacked[node] = []
        for k in range(self.layout.typed.callee[node].graph.arity):
            item = items.get(k)
            names.append("_" if item is None else self._fresh(item.name, item, at))
            if item is not None:
                self.values[item] = names[-1]

    def _fresh(self, base: str, value, at: int, reuse: bool = True) -> str:
        """A local for `value`, first bound at statement `at`: a dead value's name is reused
        (`reuse`)."""

        def reusable(name: str) -> bool:
            old = self.holder.get(name)
            return (
                reuse and old is not None and self.layout.last_read.get(old, -1) <= at
            )

        name = self.names.fresh(base, reusable)
        self.holder[name] = value
        return name

    def _temporary_name(self, node: Node) -> str:
        if node.kind is Kind.CALL:
            return self._call_name(node)
        if node.kind in CALLS:  # a sub-model's: named as its attribute
            return node.attrs["target"]
        if node.kind is Kind.IF:  # named as the value its first branch gives
            given = next(
                (o for r in node.regions for o in r.outputs if isinstance(o, Node))
            )
            return given.name or self._temporary_name(given)
        role = self._role(node)
        if role is not None:
            return role
        operand = next((i for i in node.inputs if isinstance(i, Node)), None)
        if _converts(node) and operand.name is None and operand not in self.values:
            return self._temporary_name(operand)
        word = node.label or (node.op.word if node.kind is Kind.OP else node.what)
        source = next(
            (self._label(i) for i in node.inputs if isinstance(i, Node)), None
        )
        named = f"{word}_{source}" if source else word
        # Named after a name derived in turn, a chain's names grew with it: the 5,000th sum
        # of (+ x x ...) had 20,000 characters, and the module grew as the square of the source.
        return named if len(named) <= MAX_DERIVED else word

    def _role(self, node: Node) -> Optional[str]:
        """The name of the one operand that reads `node`, where that name says what the
        value is (cross-entropy's `logits`, `labels`) and the source gives it to nothing.
        """
        readers = self.layout.readers.get(node, [])
        if len(readers) != 1 or getattr(readers[0][0], "kind", None) is not Kind.OP:
            return None
        reader, index = readers[0]
        args = reader.op.args
        arg = args[min(index, len(args) - 1)]
        name = mangle(arg.name)
        return name if arg.names and name not in self.sources else None

    def _call_name(self, node: Node) -> str:
        """A method call's value is named as the callee names what it returns, else after
        the callee and its first argument (`forward_idx`): never the method's own name.
        """
        returned = self.layout.typed.callee[node].graph.output
        if isinstance(returned, Node) and returned.name is not None:
            return returned.name
        source = next(
            (self._label(i) for i in node.inputs if isinstance(i, Node)), None
        )
        return f"{node.attrs['target']}_{source or 'out'}"

    def _label(self, node: Node) -> Optional[str]:
        """The name a value is known by: its local's, or its source name, or a call's value's
        (`forward_idx`), or its first input's."""
        while node is not None and node not in self.values and node.name is None:
            if node.kind is Kind.CALL:
                return self._call_name(node)
            node = next((i for i in node.inputs if isinstance(i, Node)), None)
        if node is None:
            return None
        return self.values.get(node) or node.name


def _converts(node: Node) -> bool:
    """Whether `node`'s value is its operand's in another dtype."""
    return node.kind is Kind.CAST or (node.kind is Kind.OP and node.op.converts)
