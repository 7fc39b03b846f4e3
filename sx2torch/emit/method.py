"""One specialization of a defun -> one method.

A node becomes a statement when the source names it (`let`), when several
nodes read it, when an op must read it twice, or when it sits in another
precision block than its reader; otherwise its expression is written inside its
reader's. Casts are explicit: a parameter's cast down is written once at the
top of the method, a cast several readers share once before the first of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import libcst as cst

from sx2torch.emit import build as b
from sx2torch.emit.names import Namespace
from sx2torch.ir import CALLS, ISLAND, Kind, Node, Scalar, reads, walk
from sx2torch.ops import REGISTRY, SYMBOLIC, EmitContext
from sx2torch.emit.targets import Target
from sx2torch.policy import Lowered, Typed
from sx2torch.policy.rules import output_dtype

RETURN = "return"
MAX_BLOCKS = 4  # precision blocks nested as in the source; deeper, only those that change something
MAX_ROUNDINGS = 2  # a held target's line is split where it would hold more
MAX_INLINE_DEPTH = 24  # a deeper expression is split into statements (readable, and within Python's limits)


@dataclass
class ClassContext:
    """What a method needs to know of its class and of the other methods."""

    target: Target
    lowered: Lowered  # every specialization's dtypes, and where parameters are stored
    attrs: dict  # source name -> attribute name, for consts, params and sub-models
    model_attrs: dict  # the same for every model, by model name
    method_names: dict  # Typed -> method name
    specialized: set  # the Typed whose method name carries its dtypes
    source_lines: Optional[str] = (
        None  # the file name for `# file.lisp:LINE` comments, when asked for
    )


def argument_names(typed: Typed) -> tuple:
    """Python names of a defun's arguments and &key arguments, the same at every call site."""
    names = Namespace()
    args = [names.fresh(node.name) for node in typed.graph.inputs]
    keys = [names.fresh(key) for key, _ in typed.graph.keys]
    return args, keys, names


@dataclass(eq=False)
class Yield:
    """The end of a region, as a statement: it stores the region's outputs in the
    variables of its IF or FOR."""

    node: Node
    region: int


class MethodEmitter:
    def __init__(self, typed: Typed, ctx: ClassContext):
        self.typed = typed
        self.ctx = ctx
        self.graph = typed.graph
        args, keys, self.names = argument_names(typed)
        self.py: dict[Node, str] = dict(zip(self.graph.inputs, args))
        self.key_names = dict(zip((k for k, _ in self.graph.keys), keys))
        self.yields: dict = {}
        self.scope = self._scopes()
        self.readers = self._readers()
        self.casts = self._casts()
        self.named = self._named()
        self.statement_of = self._statement_of()
        self.nodes_of = self._nodes_of()
        self.order = {
            statement: i
            for i, statement in enumerate(
                s for s in self._sequence() if s in self.named or isinstance(s, Yield)
            )
        }
        self.order[RETURN] = len(self.order)
        self.last_read = self._last_reads()
        self.holder: dict = {name: node for node, name in self.py.items()}
        self.hoisted: dict = {}
        self.loop_names: dict = {}  # FOR node -> (index name or None, layer name)

    # Analysis.

    def _scopes(self) -> dict:
        """Each node and region input -> the region it is made in (None: the method's own)."""
        scope: dict = {node: None for node in self.graph.inputs}

        def visit(nodes: list, region) -> None:
            for node in nodes:
                scope[node] = region
                for inner in node.regions:
                    scope.update((i, inner) for i in inner.inputs)
                    visit(inner.nodes, inner)

        visit(self.graph.nodes, None)
        return scope

    def _sequence(self) -> list:
        """Nodes and region ends in the order their statements are written."""
        order: list = []

        def visit(nodes: list) -> None:
            for node in nodes:
                order.append(node)
                for index, region in enumerate(node.regions):
                    visit(region.nodes)
                    order.append(self._yield(node, index))

        visit(self.graph.nodes)
        return order

    def _yield(self, node: Node, index: int) -> Yield:
        return self.yields.setdefault((node, index), Yield(node, index))

    def _readers(self) -> dict:
        readers: dict = {node: [] for node in self.scope}
        for node in walk(self.graph.nodes):
            for index, operand in enumerate(node.inputs):
                if isinstance(operand, Node):
                    readers[operand].append((node, index))
            for r, region in enumerate(node.regions):
                for index, out in enumerate(region.outputs):
                    if isinstance(out, Node):
                        readers[out].append((self._yield(node, r), index))
        if isinstance(self.graph.output, Node) and self.graph.output in readers:
            readers[self.graph.output].append((RETURN, None))
        return readers

    def _region_of(self, reader):
        """The region a reader's statement is written in."""
        if reader == RETURN:
            return None
        if isinstance(reader, Yield):
            return reader.node.regions[reader.region]
        return self.scope[reader]

    def _named(self) -> set:
        """The nodes written as statements of their own."""
        named, depth, roundings = set(), {}, {}
        for node in _post_order(self.graph.nodes):
            if node.kind in (Kind.INPUT, Kind.PARAM, Kind.ITEM):
                continue
            readers = self.readers[node]
            depth[node] = 1 + max(
                (depth.get(i, 0) for i in reads(node) if isinstance(i, Node)),
                default=0,
            )
            if (
                self._compound(node, named)
                or node.name is not None
                or len(readers) != 1
                or depth[node] >= MAX_INLINE_DEPTH
                or any(
                    r != RETURN
                    and not isinstance(r, Yield)
                    and r.kind is Kind.OP
                    and REGISTRY[r.op].name_inputs
                    for r, _ in readers
                )
                or self._region_of(readers[0][0]) is not self.scope[node]
                or (
                    readers[0][0] != RETURN
                    and self._path_of(readers[0][0]) != self.path(node)
                )
            ):
                named.add(node)
                depth[node] = 0
            self._limit_roundings(node, named, roundings)
        return named

    def _limit_roundings(self, node: Node, named: set, roundings: dict) -> None:
        """On the held targets a line holds at most MAX_ROUNDINGS roundings: the inputs
        that hold the most are written as statements of their own first."""
        inlined = [i for i in node.inputs if isinstance(i, Node) and roundings.get(i)]
        total = self._roundings(node) + sum(roundings[i] for i in inlined)
        for operand in sorted(inlined, key=roundings.get, reverse=True):
            if total <= MAX_ROUNDINGS:
                break
            named.add(operand)
            total -= roundings[operand]
        roundings[node] = 0 if node in named else total

    def _roundings(self, node: Node) -> int:
        """How many `sx.round_to_bf16` a node's own expression writes on a held target."""
        if not self.ctx.target.held:
            return 0
        stores = (
            node.kind is Kind.OP
            and self.typed.dtype.get(node) == "bf16"
            and not REGISTRY[node.op].is_exact(node.inputs)
        )
        written = (
            0  # the casts down written inside the expression, not hoisted before it
        )
        for index, operand in enumerate(node.inputs):
            conversion = self.conversion(node, index)
            if conversion is None or conversion[1] != "bf16":
                continue
            shared = self.casts.get((operand, conversion, self.scope[node]), 0) > 1
            hoisted = node.kind is not Kind.CAST and (
                operand.kind is Kind.PARAM or shared
            )
            written += not hoisted
        return stores + written

    def _compound(self, node: Node, named: set) -> bool:
        """Whether a node is written as a compound statement: a FOR, or an IF whose
        branches need statements of their own (else it is a conditional expression)."""
        return node.kind is Kind.FOR or (
            node.kind is Kind.IF
            and any(n in named for r in node.regions for n in walk(r.nodes))
        )

    def _path_of(self, reader) -> tuple:
        """A region's outputs are stored in the blocks of its node."""
        return self.path(reader.node if isinstance(reader, Yield) else reader)

    def _statement_of(self) -> dict:
        """For each node, the statement its expression is written in."""
        where: dict = {}
        for node in reversed(list(_post_order(self.graph.nodes))):
            if node in self.named:
                where[node] = node
            elif self.readers.get(node):
                reader = self.readers[node][0][0]
                where[node] = self._written_in(reader, where)
        return where

    def _nodes_of(self) -> dict:
        """id(statement) -> the nodes written in it, in walk order, loops left out: found
        once, not by a walk of the whole graph per statement."""
        nodes: dict = {}
        for node in walk(self.graph.nodes):
            if node.kind is not Kind.FOR:
                nodes.setdefault(id(self.statement_of.get(node)), []).append(node)
        return nodes

    def _written_in(self, reader, where: dict):
        """The statement a reader's expression is in: an IF written as an expression
        stores its regions' outputs where it is itself written."""
        if isinstance(reader, Yield):
            compound = self._compound(reader.node, self.named)
            return reader if compound else where[reader.node]
        return reader if reader == RETURN else where[reader]

    def _last_reads(self) -> dict:
        """The last statement that reads each value, and each cast of a value; a value read
        in a loop, or carried by it, is live until the loop ends."""
        last: dict = {}

        def note(value, at: int) -> None:
            last[value] = max(last.get(value, -1), at)

        for node in walk(self.graph.nodes):
            at = self.order.get(self.statement_of.get(node), -1)
            for index, operand in enumerate(node.inputs):
                conversion = self.conversion(node, index)
                for value in (operand, (operand, conversion and conversion[1])):
                    note(value, at)
            for r, region in enumerate(node.regions):
                end = self._written_in(self._yield(node, r), self.statement_of)
                for out in region.outputs:
                    note(out, self.order.get(end, -1))
        output = self.graph.output
        if isinstance(output, Node):
            last[output] = self.order[RETURN]
        for loop in (n for n in walk(self.graph.nodes) if n.kind is Kind.FOR):
            (body,) = loop.regions
            start, end = self.order[loop], self.order[self._yield(loop, 0)]
            inside = set(walk(body.nodes)) | set(body.inputs)
            for value, at in list(last.items()):
                key = value[0] if isinstance(value, tuple) else value
                if start < at <= end and key not in inside:
                    last[value] = max(at, end)
            for carried in body.inputs:
                last[carried] = max(last.get(carried, -1), end)
        return last

    def _fresh(self, base: str, value, at: int) -> str:
        """A local for `value`, first bound at statement `at`: a dead value's name is reused."""

        def reusable(name: str) -> bool:
            old = self.holder.get(name)
            return old is not None and self.last_read.get(old, -1) <= at

        name = self.names.fresh(base, reusable)
        self.holder[name] = value
        return name

    def path(self, node: Node) -> tuple:
        """The precision blocks a node's statement sits in, outermost first."""
        blocks, mode = [], self.typed.ambient
        for frame in node.frames:
            if frame.mode != mode:
                blocks.append(frame)
                mode = frame.mode
        return _without_repeats(tuple(blocks))

    # Dtypes.

    def conversion(self, node: Node, index: int) -> Optional[tuple]:
        """(dtype it has, dtype `node` reads it in) for an input that needs a cast, else None."""
        want = self.ctx.lowered.read_dtype(self.typed, node, index)
        return self._conversion(node.inputs[index], want)

    def _conversion(self, operand, want: Optional[str]) -> Optional[tuple]:
        """A bf16-stored parameter is "bf16-stored": a real bf16 tensor even where the target
        holds bf16 values in f32, so that target reads it through `.float()`."""
        if want is None or isinstance(operand, Scalar):
            return None
        have = self.ctx.lowered.value_dtype(self.typed, operand)
        if have not in ("f32", "bf16"):
            return None
        if self.ctx.target.held and have == "bf16":
            if operand.kind is Kind.PARAM:
                return "bf16-stored", want
            return None  # a bf16 value already is an f32 tensor there
        return None if have == want else (have, want)

    # Emission.

    def body(self) -> list:
        """The method's statements, precision blocks nested."""
        casts = self.casts
        statements: list = [
            ((), self._hoist(operand, conversion, -1))
            for operand, conversion, _ in casts
            if operand.kind is Kind.PARAM
            and not operand.attrs.get("conditional")  # a :when parameter may be absent
            and (operand, conversion) not in self.hoisted
        ]
        statements += self._block(self.graph.nodes, casts)
        output = self.graph.output
        if (
            isinstance(output, Node)
            and output not in self.named
            and output.kind not in (Kind.INPUT, Kind.PARAM, Kind.ITEM)
        ):
            statements += self._hoists(RETURN, self.path(output), casts)
            returned = cst.SimpleStatementLine([cst.Return(self.expr(output))])
            statements.append((self.path(output), self._located(returned, output)))
        else:
            statements.append(
                ((), cst.SimpleStatementLine([cst.Return(self.ref(output))]))
            )
        return _nest(statements, self.ctx.target.device)

    def _block(self, nodes: list, casts: dict) -> list:
        """(path, statement) for the named nodes of one block, in order."""
        statements: list = []
        for node in nodes:
            if node not in self.named:
                continue
            statements += self._hoists(node, self.path(node), casts)
            statements.extend(
                (self.path(node), s) for s in self._statements(node, casts)
            )
        return statements

    def _hoists(self, statement, path: tuple, casts: dict) -> list:
        at = self.order[statement]
        return [
            (path, self._hoist(operand, conversion, at))
            for operand, conversion in self._shared_casts(statement, casts)
        ]

    def _casts(self) -> dict:
        """(value, dtype, region) -> how many operand slots of that region read the value
        cast to dtype; a cast is shared within its region only."""
        counts: dict = {}
        for node in walk(self.graph.nodes):
            for index, operand in enumerate(node.inputs):
                conversion = self.conversion(node, index)
                if conversion and node.kind not in (Kind.CAST, Kind.FOR):
                    key = (operand, conversion, self.scope[node])
                    counts[key] = counts.get(key, 0) + 1
        return counts

    def _shared_casts(self, statement, casts: dict) -> list:
        """Casts read more than once in a region whose first reader is in this statement."""
        due = []
        for node in self.nodes_of.get(id(statement), []):
            for index, operand in enumerate(node.inputs):
                conversion = self.conversion(node, index)
                key = (operand, conversion)
                shared = casts.get((operand, conversion, self.scope[node]), 0) > 1
                if shared and key not in self.hoisted and key not in due:
                    due.append(key)
        return due

    def _hoist(
        self, operand: Node, conversion: tuple, at: int
    ) -> cst.SimpleStatementLine:
        want = conversion[1]
        name = self._fresh(
            f"{self.py.get(operand) or operand.name or operand.what}_{want}",
            (operand, want),
            at,
        )
        self.hoisted[operand, conversion] = name
        return _assign(name, self.ctx.target.cast(self.ref(operand), *conversion))

    def _statements(self, node: Node, casts: dict) -> list:
        if node.kind is Kind.FOR:
            statements = self._for(node, casts)
        elif self._compound(node, self.named):
            statements = [self._if(node, casts)]
        else:
            statements = [_assign(self._bind(node), self.expr(node))]
        if node.note:
            comment = cst.EmptyLine(comment=cst.Comment("# " + node.note))
            statements[0] = statements[0].with_changes(leading_lines=[comment])
        return [self._located(s, node) for s in statements]

    def _region_body(self, node: Node, index: int, casts: dict, names: list) -> list:
        """A region's statements, its outputs stored in `names` at its end, nested in the
        blocks they need inside the node's own."""
        region = node.regions[index]
        end = self._yield(node, index)
        inner = self._block(region.nodes, casts) + self._hoists(
            end, self.path(node), casts
        )
        stores = [(name, self._output(node, index, k)) for k, name in enumerate(names)]
        inner += [(self.path(node), s) for s in _stores(stores)]
        outer = len(self.path(node))
        return _nest([(path[outer:], s) for path, s in inner], self.ctx.target.device)

    def _output(self, node: Node, region: int, index: int) -> b.Expr:
        """A region's output as its node stores it: cast to the node's dtype for it."""
        operand = node.regions[region].outputs[index]
        want = output_dtype(self.typed, node, index)
        conversion = self._conversion(operand, want)
        value = self.ref(operand)
        return value if conversion is None else self.ctx.target.cast(value, *conversion)

    def _for(self, node: Node, casts: dict) -> list:
        """`for i, layer in enumerate(self.stack):`, the carried values assigned before it
        and at the end of its body."""
        (body,) = node.regions
        at = self.order[node]
        items = {item.attrs["index"]: item for item, _ in self.readers[node]}
        statements = []
        names = []
        for k, (init, carried) in enumerate(zip(node.inputs, body.inputs)):
            item = items.get(k)
            base = (
                carried.name
                or (item and item.name)
                or self.py.get(init)
                or self._label(init)
                or "x"
            )
            name = self._fresh(base, carried, at)
            self.py[carried] = name
            if item is not None:
                self.py[item] = name
            names.append(name)
            if self.py.get(init) != name or self.conversion(node, k):
                statements.append(_assign(name, self.read(node, k)))
        layer = self._fresh(node.attrs["layer"], None, at)
        index = node.attrs["index"] and self._fresh(node.attrs["index"], None, at)
        self.loop_names[node] = (index, layer)
        stack = b.attr(b.name("self"), self.ctx.attrs[node.attrs["stack"]])
        target = b.name(layer)
        if index is not None:
            target = cst.Tuple(
                [cst.Element(b.name(index)), cst.Element(b.name(layer))],
                lpar=[],
                rpar=[],
            )
            stack = b.call("enumerate", stack)
        body = cst.IndentedBlock(self._region_body(node, 0, casts, names))
        for item in items.values():
            self.holder[self.py[item]] = item
        return statements + [cst.For(target=target, iter=stack, body=body)]

    def _if(self, node: Node, casts: dict) -> cst.If:
        name = self._bind(node)
        then, otherwise = (self._region_body(node, r, casts, [name]) for r in (0, 1))
        return cst.If(
            self.scalar(node.attrs["condition"]),
            cst.IndentedBlock(then or [cst.SimpleStatementLine([cst.Pass()])]),
            orelse=cst.Else(cst.IndentedBlock(otherwise)) if otherwise else None,
        )

    def _located(self, statement, node: Node):
        """With --source-lines, a trailing `# file.lisp:LINE` comment."""
        if self.ctx.source_lines is None or not isinstance(
            statement, cst.SimpleStatementLine
        ):
            return statement
        comment = cst.Comment(f"# {self.ctx.source_lines}:{node.span.line}")
        return statement.with_changes(
            trailing_whitespace=cst.TrailingWhitespace(
                cst.SimpleWhitespace("  "), comment
            )
        )

    def _bind(self, node: Node) -> str:
        base = node.name or self._temporary_name(node)
        name = self._fresh(base, node, self.order[node])
        self.py[node] = name
        return name

    def _temporary_name(self, node: Node) -> str:
        if node.kind in CALLS:
            return node.attrs["target"]
        word = node.label or (
            REGISTRY[node.op].word if node.kind is Kind.OP else node.what
        )
        source = next(
            (self._label(i) for i in node.inputs if isinstance(i, Node)), None
        )
        return f"{word}_{source}" if source else word

    def _label(self, node: Node) -> Optional[str]:
        """The name a value is known by: its local's, or its source name, or its first input's."""
        while node is not None and node not in self.py and node.name is None:
            node = next((i for i in node.inputs if isinstance(i, Node)), None)
        if node is None:
            return None
        return self.py.get(node) or node.name

    def _invoke(self, node: Node, module: b.Expr, args: list) -> b.Expr:
        callee = self.typed.callee[node]
        _, key_names, _ = argument_names(callee)
        keys = dict(zip((k for k, _ in callee.graph.keys), key_names))
        kwargs = {keys[k]: self.scalar(v) for k, v in node.attrs["keys"].items()}
        method = self.ctx.method_names[callee]
        if node.kind is Kind.CALL:
            return b.call(b.attr(b.name("self"), method), *args, **kwargs)
        return b.call(
            module if method == "forward" else b.attr(module, method), *args, **kwargs
        )

    def ref(self, operand) -> b.Expr:
        """An operand as it is, without a cast."""
        if isinstance(operand, Scalar) or operand is None:
            return self.scalar(operand) if operand is not None else b.name("None")
        if operand.kind is Kind.PARAM:
            attrs = operand.attrs
            return self.member(attrs["param"], attrs.get("via", ()), attrs.get("owner"))
        if operand in self.py:
            return b.name(self.py[operand])
        return self.expr(operand)

    def read(self, node: Node, index: int) -> b.Expr:
        """An operand as `node` reads it: cast to the dtype the node computes in."""
        operand = node.inputs[index]
        conversion = self.conversion(node, index)
        if conversion is None:
            return self.ref(operand)
        if (operand, conversion) in self.hoisted:
            return b.name(self.hoisted[operand, conversion])
        return self.ctx.target.cast(self.ref(operand), *conversion)

    def expr(self, node: Node) -> b.Expr:
        if node.kind is Kind.CAST:
            return self.read(node, 0)
        if node.kind is Kind.IF:
            return b.scalar_operation(
                "if",
                (node.attrs["condition"], 0, 1),
                lambda a: (
                    self.scalar(a)
                    if isinstance(a, Scalar)
                    else self._output(node, a, 0)
                ),
            )
        if node.kind is Kind.CALL:
            return self._invoke(node, None, [self.ref(i) for i in node.inputs])
        if node.kind is Kind.SUBMODEL:
            loop = node.attrs.get("loop")
            module = (
                b.name(self.loop_names[loop][1])
                if loop is not None
                else b.attr(b.name("self"), self.ctx.attrs[node.attrs["target"]])
            )
            if "at" in node.attrs:  # (nth STACK I ...)
                module = b.subscript(module, self.scalar(node.attrs["at"]))
            return self._invoke(node, module, [self.ref(i) for i in node.inputs])
        op = REGISTRY[node.op]
        operands = [self.read(node, i) for i in range(len(node.inputs))]
        context = EmitContext(
            self.ctx.target.name,
            self.typed.compute.get(node),
            {k: self._attr(v) for k, v in node.attrs.items()},
            {k: _value(v) for k, v in node.attrs.items()},
            tuple(isinstance(i, Scalar) for i in node.inputs),
        )
        rounds = self.typed.dtype[node] == "bf16" and not op.is_exact(node.inputs)
        return self.ctx.target.store(op.emit(operands, context), rounds)

    def _attr(self, value):
        if isinstance(value, Scalar):
            return self.scalar(value)
        if isinstance(value, tuple):
            return tuple(self.scalar(v) for v in value)
        return value

    def member(self, name: str, via: tuple = (), owner: Optional[str] = None) -> b.Expr:
        """`self.name`, or `self.enc.name` for a sub-model's member read where its forward is inlined."""
        path = [self.ctx.model_attrs[model][param] for model, param in via]
        attrs = self.ctx.model_attrs[owner] if owner else self.ctx.attrs
        return b.attr(b.name("self"), *path, attrs[name])

    def scalar(self, scalar: Scalar) -> b.Expr:
        if scalar.op == "lit":
            return b.number(scalar.value)
        if scalar.op == "const":
            return self.member(*scalar.args)
        if scalar.op == "key":
            return b.name(self.key_names[scalar.args[0]])
        if scalar.op == "index":
            return b.name(self.loop_names[scalar.args[0]][0])
        return b.scalar_operation(scalar.op, scalar.args, self.scalar)


def _without_repeats(blocks: tuple) -> tuple:
    """Blocks as the source nests them, MAX_BLOCKS deep; deeper, one whose kind is already open is
    left out: an island inside an island (through a region) changes nothing, autocast being off
    already, nor does a region marker inside a region. So the output stays within Python's limit
    of 20 nested blocks, whatever the depth of with-numerics forms."""
    kept = list(blocks[:MAX_BLOCKS])
    for frame in blocks[MAX_BLOCKS:]:
        if all(open_.mode != frame.mode for open_ in kept):
            kept.append(frame)
    return tuple(kept)


def _value(value):
    """What emission may decide from: a literal's value, never a const's or a key's default."""
    if isinstance(value, Scalar):
        return value.value if value.op == "lit" else SYMBOLIC
    if isinstance(value, tuple):
        return tuple(_value(v) for v in value)
    return value


def _post_order(nodes: list):
    """Every node after its regions' nodes."""
    for node in nodes:
        for region in node.regions:
            yield from _post_order(region.nodes)
        yield node


def _stores(stores: list) -> list:
    """`x = ...`, or `x, y = ..., ...` for several carried values (each reads the old ones)."""
    if len(stores) == 1:
        ((name, value),) = stores
        is_itself = isinstance(value, cst.Name) and value.value == name
        return [] if is_itself else [_assign(name, value)]
    targets = cst.Tuple([cst.Element(b.name(n)) for n, _ in stores], lpar=[], rpar=[])
    values = cst.Tuple([cst.Element(v) for _, v in stores], lpar=[], rpar=[])
    return [cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(targets)], values)])]


def _assign(name: str, value: b.Expr) -> cst.SimpleStatementLine:
    return cst.SimpleStatementLine(
        [cst.Assign([cst.AssignTarget(b.name(name))], value)]
    )


def _nest(statements: list, device: str) -> list:
    """Statements with their block paths -> statements with nested `with` blocks."""
    root: list = []
    open_blocks: list = [((), root)]
    for path, statement in statements:
        while open_blocks[-1][0] != path[: len(open_blocks[-1][0])]:
            open_blocks.pop()
        while len(open_blocks[-1][0]) < len(path):
            frame = path[len(open_blocks[-1][0])]
            body: list = []
            open_blocks[-1][1].append((frame, body))
            open_blocks.append((open_blocks[-1][0] + (frame,), body))
        open_blocks[-1][1].append(statement)
    return _render(root, device)


def _render(items: list, device: str) -> list:
    rendered = []
    for item in items:
        if isinstance(item, tuple):
            frame, body = item
            rendered.append(_block(frame, _render(body, device), device))
        else:
            rendered.append(item)
    return rendered


def _block(frame, body: list, device: str) -> cst.With:
    if frame.mode == ISLAND:
        manager = b.call("torch.autocast", b.string(device), enabled=b.name("False"))
    else:
        manager = b.call("sx.bf16_region")
    comment = cst.EmptyLine(comment=cst.Comment("# " + frame.text))
    return cst.With(
        [cst.WithItem(manager)], cst.IndentedBlock(body), leading_lines=[comment]
    )
