"""The names pass: a Python name for every class, attribute, method and local, before emission.

Each scope is a `Namespace`: the module's classes; a class's constructor arguments,
attributes and methods; a method's arguments, `&key` arguments, locals, cast temporaries
and loop variables. Source names are allocated first in every scope, so no generated name
takes one. Locals are allocated in the order their statements are written, and a local
whose value is dead (by the layout's liveness, which keeps a value read in a loop live until
the loop ends) gives its name to a new value, unless the new value has a source name of
its own. `--dump-after names` prints the result.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional

from sx2torch.emit.casts import Hoist
from sx2torch.emit.layout import RETURN, TOP, Layout, returns_expression
from sx2torch.emit.names import MODULE_ATTRIBUTES, Namespace, plain_attribute
from sx2torch.syntax.names import mangle
from sx2torch.emit.sharing import Sharing
from sx2torch.emit.targets import Target
from sx2torch.ir import CALLS, ISLAND, REGION, Kind, Node, walk
from sx2torch.syntax.scalars import Scalar, ScalarOp
from sx2torch.ops import REGISTRY
from sx2torch.policy import Lowered, Typed
from sx2torch.policy.rules import is_param
from sx2torch.syntax.program import Model, Program

# the target whose code decides which specializations share a method (see `run`)
DECIDING = Target("cpu")
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


@dataclass
class Naming:
    """The pass's output: every name the emitted module binds."""

    classes: dict  # model -> class name
    attrs: dict  # model -> {const, param or sub-model -> attribute name}
    layouts: dict  # Typed -> Layout
    locals: dict  # Typed -> Locals
    methods: dict = field(default_factory=dict)  # Typed -> method name
    specialized: set = field(default_factory=set)  # the Typed named with their dtypes
    # model -> {param or sub-model whose key is no plain attribute -> its store}
    stores: dict = field(default_factory=dict)
    # the public Typed that casts f32 arguments down at entry -> those arguments' indices
    entry: dict = field(default_factory=dict)
    # a Typed whose method is another's code, which serves its arguments -> that Typed
    code: dict = field(default_factory=dict)
    # model -> the consts its methods read, each stored as an attribute (`self.d = d`)
    read_consts: dict = field(default_factory=dict)


def run(program: Program, lowered: Lowered, target: Target) -> Naming:
    """Which specializations of a defun share a method, and what each public method
    computes, is decided once for every target, on a held target's plans (sharing.py),
    where every rounding is written out: a cuda method that computes two specializations
    through its tensors' dtypes (`x * torch.sigmoid(x)` on f32 and on bf16) cannot be one
    method there, whose tensors are all f32."""
    classes = _class_names(program)
    attrs = {}
    namespaces = {}
    for model in program.all_models():
        attrs[model.name], namespaces[model.name] = attributes(
            model, _built_classes(model, classes)
        )
    stores = {
        model.name: _stores(model, attrs[model.name]) for model in program.all_models()
    }
    naming = _layouts(Naming(classes, attrs, {}, {}, stores=stores), lowered, target)
    judge = target if target.held else DECIDING
    deciding = naming if judge is target else _layouts(naming, lowered, judge)
    sharing = Sharing(lowered, judge, deciding.layouts)
    methods, specialized = _method_names(
        program, lowered, namespaces, deciding, sharing
    )
    naming.methods, naming.specialized = methods, specialized
    naming.code, naming.entry = deciding.code, deciding.entry
    naming.read_consts = _read_consts(naming.code.get(t, t) for t in methods)
    if deciding is not naming:  # the arguments cast at entry, on this target's layouts
        for typed, layout in deciding.layouts.items():
            if layout.conversions.entry:
                entry = layout.conversions.entry
                naming.layouts[typed] = Layout(typed, target, lowered, entry)
                naming.locals[typed] = _LocalNaming(naming.layouts[typed]).run()
    return naming


def _read_consts(emitted) -> dict:
    """model -> the consts the emitted methods read (a sub-model's through it, `layer.d`)."""
    found: dict = {}

    def scan(typed, value) -> None:
        if isinstance(value, Scalar):
            if value.op is ScalarOp.CONST:
                owner = value.args[2] if len(value.args) > 2 else typed.model
                found.setdefault(owner, set()).add(value.args[0])
            for arg in value.args:
                scan(typed, arg)
        elif isinstance(value, (tuple, list)):
            for item in value:
                scan(typed, item)
        elif isinstance(value, dict):
            scan(typed, list(value.values()))

    for typed in emitted:
        scan(typed, typed.graph.output)
        for node in walk(typed.graph.nodes):
            scan(typed, [node.inputs, node.attrs])
            scan(typed, [region.outputs for region in node.regions])
    return found


def _layouts(naming: Naming, lowered: Lowered, target: Target) -> Naming:
    """`naming` with every specialization's layout and locals on `target`."""
    layouts = {
        typed: Layout(typed, target, lowered) for typed in lowered.specializations
    }
    return replace(
        naming,
        layouts=layouts,
        locals={typed: _LocalNaming(layout).run() for typed, layout in layouts.items()},
    )


def class_name(name: str) -> str:
    """`tiny-gpt` -> `TinyGpt`."""
    parts = [p for p in mangle(name).split("_") if p]
    return "".join(p[0].upper() + p[1:] for p in parts) or "Model"


def _class_names(program: Program) -> dict:
    names = Namespace()
    return {
        model.name: names.fresh(class_name(model.name))
        for model in [program.top, *program.models.values()]
    }


def _built_classes(model: Model, classes: dict) -> frozenset:
    """The classes a model's constructor names, to build its sub-models."""
    return frozenset(
        classes[param.init.model] for param in model.params.values() if param.is_module
    )


def attributes(model: Model, classes: frozenset = frozenset()) -> tuple:
    """Attribute names for consts, params and sub-models; and the class namespace for methods.

    A parameter's or sub-model's name is its `state_dict` key, kept exactly (a checkpoint
    names it); a const is also a constructor argument, which must not shadow a class the
    constructor builds, nor a Python name.
    """
    names = Namespace(MODULE_ATTRIBUTES)
    attrs = {name: mangle(name) for name in model.params}
    names.taken.update(attrs.values())
    attrs.update((name, names.fresh(name, avoid=classes)) for name in model.consts)
    return attrs, names


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


def argument_names(typed: Typed) -> tuple:
    """Python names of a defun's arguments and &key arguments, the same at every call site."""
    names = Namespace()
    args = [names.fresh(node.name) for node in typed.graph.inputs]
    keys = [names.fresh(key) for key, _ in typed.graph.keys]
    return args, keys, names


def _method_names(
    program: Program, lowered: Lowered, namespaces: dict, naming: Naming, sharing
):
    """Method names: specializations of a defun that one method serves share it
    (sx2torch/emit/sharing.py). The public method is named as the source names the
    defun: the one at f32 (and integer) arguments where the program calls it so, else the
    one its callers call, which casts f32 arguments at entry (`entry`); a specialization
    only a public copy would call is left out. The others are named with their dtypes and
    returned as `specialized`."""
    by_defun = defuns(lowered)
    group = sharing.run(by_defun)  # Typed -> its Group
    naming.code = {t: g.rep for t, g in group.items() if g.rep is not t}
    public, called = _publics(program, lowered, by_defun, group)
    naming.entry = {
        typed: _entry(lowered.natural[key], typed)
        for key, typed in public.items()
        if typed is not lowered.natural[key]
    }
    _cast_at_entry(naming, sharing, set(group.values()))
    kept = {key: [t for t in specs if t in called] for key, specs in by_defun.items()}
    names: dict = {}
    specialized: set = set()
    for model in program.all_models():
        namespace = namespaces[model.name]
        # Source names first, so that no specialization takes one.
        plain_names = {defun: namespace.fresh(defun) for defun in model.defuns}
        for defun in model.defuns:
            plain = public[model.name, defun]
            chosen: dict = {}  # stand-in -> name
            if plain is not None:
                chosen[group[plain]] = plain_names[defun]
            for typed in kept.get((model.name, defun), []):
                if group[typed] not in chosen:
                    chosen[group[typed]] = namespace.fresh(
                        f"{defun}_{specialization_suffix(typed)}"
                    )
                names[typed] = chosen[group[typed]]
                if plain is None or group[typed] != group[plain]:
                    specialized.update((typed, group[typed].rep))
    return names, specialized


def _cast_at_entry(naming: Naming, sharing, groups: set) -> None:
    """A method serving bf16 arguments it reads only cast down casts them at entry."""
    for group in groups:
        rep = group.rep
        layout = naming.layouts[rep]
        found = sharing.entry(group, layout)
        if found:
            entry = frozenset(rep.graph.inputs[i] for i in found)
            layout = Layout(rep, layout.target, layout.lowered, entry)
            naming.layouts[rep] = layout
            naming.locals[rep] = _LocalNaming(layout).run()
            naming.entry[rep] = sorted(set(naming.entry.get(rep) or []) | set(found))


def _publics(program: Program, lowered: Lowered, by_defun: dict, group: dict):
    """(model, defun) -> its public specialization, and the specializations emitted: those
    the program runs, the public ones and what they call. A public method the program
    does not run may call a natural specialization, which is then public itself."""
    called = _called(program, lowered, group)
    while True:
        optional = _optional(called)
        public = {
            key: _public(natural, by_defun.get(key, []), called, group, optional)
            for key, natural in lowered.natural.items()
        }
        grown = _closure(called | {t for t in public.values() if t is not None}, group)
        if grown == called:
            return public, called
        called = grown


def _called(program: Program, lowered: Lowered, group: dict) -> set:
    """The specializations the program runs: the top model's public methods (its forward
    and the defuns it does not call itself) and what they call."""
    top = [t for t in lowered.specializations if t.model == program.top.name]
    inner = {c.graph.name for t in top for c in t.callee.values() if c.model == t.model}
    return _closure(
        {
            lowered.natural[program.top.name, defun]
            for defun in program.top.defuns
            if defun == "forward" or defun not in inner
        }
        - {None},
        group,
    )


def _optional(called: set) -> set:
    """(specialization, argument index) for the arguments a caller may pass None: an
    `if` with a `none` branch, or an argument of its own that may be None."""
    found: set = set()
    grown = True
    while grown:
        grown = False
        for typed in called:
            for node, callee in typed.callee.items():
                for index, operand in enumerate(node.inputs):
                    if (callee, index) not in found and _may_be_none(
                        operand, typed, found
                    ):
                        found.add((callee, index))
                        grown = True
    return found


def _may_be_none(operand, typed, found: set) -> bool:
    if operand is None:
        return True
    if not isinstance(operand, Node):
        return False
    if operand.kind is Kind.IF:
        outputs = [o for region in operand.regions for o in region.outputs]
        return any(_may_be_none(o, typed, found) for o in outputs)
    inputs = typed.graph.inputs
    return operand in inputs and (typed, inputs.index(operand)) in found


def _closure(roots: set, group: dict) -> set:
    """`roots` and every specialization they call, directly or not: the calls of the
    code that serves each."""
    seen: set = set()
    stack = list(roots)
    while stack:
        typed = stack.pop()
        if typed not in seen:
            seen.add(typed)
            stack.extend(group[typed].rep.callee.values())
    return seen


def _public(natural, specs: list, called: set, group: dict, optional: set):
    """The specialization named as the source names the defun: the natural one, unless
    the program calls the defun only with bf16 where the natural one takes f32 and other
    code: then the first of those, which casts its f32 arguments down at entry, serves
    callers from outside too (not where such an argument may be None)."""
    if natural is None or any(group[t] == group[natural] for t in specs if t in called):
        return natural
    for typed in specs:
        mates = [t for t in specs if group[t] == group[typed] and t in called]
        casts = _entry(natural, typed)
        if (
            typed in called
            and group[typed].rep is typed
            and casts is not None
            and all(_entry(natural, t) == casts for t in mates)
            and not any((typed, i) in optional for i in casts)
        ):
            return typed
    return natural


def _entry(natural, typed) -> Optional[list]:
    """The arguments `typed` casts at entry to serve f32 callers, or None where it cannot."""
    if typed.ambient != natural.ambient:
        return None
    casts = []
    for index, (have, want) in enumerate(zip(natural.signature, typed.signature)):
        if have == want:
            continue
        if (have, want) != ("f32", "bf16"):
            return None
        casts.append(index)
    return casts


def defuns(lowered: Lowered) -> dict:
    """(model, defun) -> its specializations, in order: found once, not by a scan per defun."""
    found: dict = {}
    for typed in lowered.specializations:
        found.setdefault((typed.model, typed.graph.name), []).append(typed)
    return found


def specialization_suffix(typed: Typed) -> str:
    """`bf16` where an argument is bf16, else `f32`; `island` or `region` for a call in a
    with-numerics form. Never the signature spelled out: two specializations of one
    dtype are numbered (`ln_bf16`, `ln_bf16_2`)."""
    floats = {str(s) for s in typed.signature if not is_param(s)}
    tags = ["bf16" if "bf16" in floats else "f32"]
    if typed.ambient == ISLAND:
        tags.append("island")
    elif typed.ambient == REGION:
        tags.append("region")
    return "_".join(tags)


class _LocalNaming:
    """A method's locals, allocated in the order emission writes their statements."""

    def __init__(self, layout: Layout):
        self.layout = layout
        graph = layout.graph
        args, keys, self.names = argument_names(layout.typed)
        self.locals = Locals(
            args,
            dict(zip((k for k, _ in graph.keys), keys)),
            dict(zip(graph.inputs, args)),
        )
        self.values = self.locals.values
        self.holder: dict = {name: node for node, name in self.values.items()}

    def run(self) -> Locals:
        layout = self.layout
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
        base = node.name or self._temporary_name(node)
        self.values[node] = self._fresh(base, node, at)
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

    def _fresh(self, base: str, value, at: int) -> str:
        """A local for `value`, first bound at statement `at`: a dead value's name is reused."""

        def reusable(name: str) -> bool:
            old = self.holder.get(name)
            return old is not None and self.layout.last_read.get(old, -1) <= at

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
        word = node.label or (
            REGISTRY[node.op].word if node.kind is Kind.OP else node.what
        )
        source = next(
            (self._label(i) for i in node.inputs if isinstance(i, Node)), None
        )
        named = f"{word}_{source}" if source else word
        # Named after a name derived in turn, a chain's names grew with it: the 5,000th sum
        # of (+ x x ...) had 20,000 characters, and the module grew as the square of the source.
        return named if len(named) <= MAX_DERIVED else word

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
