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
from sx2torch.emit.echo import echo
from sx2torch.emit.names import Namespace
from sx2torch.ir import ISLAND, Node, Scalar
from sx2torch.ops import REGISTRY, EmitContext
from sx2torch.emit.targets import Target
from sx2torch.policy import Lowered, Typed
from sx2torch.policy.rules import CALLS

RETURN = "return"
MAX_BLOCKS = 4  # precision blocks nested as in the source; deeper, only those that change something
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


class MethodEmitter:
    def __init__(self, typed: Typed, ctx: ClassContext):
        self.typed = typed
        self.ctx = ctx
        self.graph = typed.graph
        args, keys, self.names = argument_names(typed)
        self.py: dict[Node, str] = dict(zip(self.graph.inputs, args))
        self.key_names = dict(zip((k for k, _ in self.graph.keys), keys))
        self.readers = self._readers()
        self.named = self._named()
        self.statement_of = self._statement_of()
        self.order = {
            node: i
            for i, node in enumerate(n for n in self.graph.nodes if n in self.named)
        }
        self.order[RETURN] = len(self.order)
        self.last_read = self._last_reads()
        self.holder: dict = {name: node for node, name in self.py.items()}
        self.hoisted: dict = {}

    # Analysis.

    def _readers(self) -> dict:
        readers: dict = {node: [] for node in [*self.graph.inputs, *self.graph.nodes]}
        for node in self.graph.nodes:
            for index, operand in enumerate(node.inputs):
                if isinstance(operand, Node):
                    readers[operand].append((node, index))
        if isinstance(self.graph.output, Node) and self.graph.output in readers:
            readers[self.graph.output].append((RETURN, None))
        return readers

    def _named(self) -> set:
        named, depth = set(), {}
        for node in self.graph.nodes:
            if node.op in ("input", "param"):
                continue
            readers = self.readers[node]
            depth[node] = 1 + max(
                (depth.get(i, 0) for i in node.inputs if isinstance(i, Node)), default=0
            )
            if (
                node.op == "chain"
                or node.name is not None
                or len(readers) != 1
                or depth[node] >= MAX_INLINE_DEPTH
                or any(
                    r != RETURN and REGISTRY.get(r.op) and REGISTRY[r.op].name_inputs
                    for r, _ in readers
                )
                or (
                    readers[0][0] != RETURN
                    and self.path(readers[0][0]) != self.path(node)
                )
            ):
                named.add(node)
                depth[node] = 0
        return named

    def _statement_of(self) -> dict:
        """For each node, the statement its expression is written in."""
        where: dict = {}
        for node in reversed(self.graph.nodes):
            if node in self.named:
                where[node] = node
            elif self.readers.get(node):
                reader = self.readers[node][0][0]
                where[node] = RETURN if reader == RETURN else where[reader]
        return where

    def _last_reads(self) -> dict:
        """The last statement that reads each value, and each cast of a value."""
        last: dict = {}
        for node in self.graph.nodes:
            at = self.order.get(self.statement_of.get(node), -1)
            for index, operand in enumerate(node.inputs):
                conversion = self.conversion(node, index)
                for value in (operand, (operand, conversion and conversion[1])):
                    last[value] = max(last.get(value, -1), at)
        output = self.graph.output
        if isinstance(output, Node):
            last[output] = self.order[RETURN]
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
        """(dtype it has, dtype `node` reads it in) for an input that needs a cast, else None.

        A bf16-stored parameter is "bf16-stored": a real bf16 tensor even where the target
        holds bf16 values in f32, so that target reads it through `.float()`."""
        lowered = self.ctx.lowered
        want = lowered.read_dtype(self.typed, node, index)
        if want is None:
            return None
        operand = node.inputs[index]
        have = lowered.value_dtype(self.typed, operand)
        if self.ctx.target.held and have == "bf16":
            if operand.op == "param":
                return "bf16-stored", want
            return None  # a bf16 value already is an f32 tensor there
        return None if have == want else (have, want)

    # Emission.

    def body(self) -> list:
        """The method's statements, precision blocks nested."""
        casts = self._casts()
        statements: list = []  # (path, statement)
        for operand, conversion in casts:
            if operand.op == "param":
                statements.append(((), self._hoist(operand, conversion, -1)))
        for node in self.graph.nodes:
            if node not in self.named:
                continue
            for operand, conversion in self._shared_casts(node, casts):
                statements.append(
                    (
                        self.path(node),
                        self._hoist(operand, conversion, self.order[node]),
                    )
                )
            statements.extend((self.path(node), s) for s in self._statements(node))
        output = self.graph.output
        if (
            isinstance(output, Node)
            and output not in self.named
            and output.op not in ("input", "param")
        ):
            for operand, conversion in self._shared_casts(RETURN, casts):
                statements.append(
                    (
                        self.path(output),
                        self._hoist(operand, conversion, self.order[RETURN]),
                    )
                )
            returned = cst.SimpleStatementLine([cst.Return(self.expr(output))])
            statements.append((self.path(output), self._located(returned, output)))
        else:
            statements.append(
                ((), cst.SimpleStatementLine([cst.Return(self.ref(output))]))
            )
        return _nest(statements, self.ctx.target.device)

    def _casts(self) -> dict:
        """(value, dtype) -> how many operand slots read the value cast to dtype."""
        counts: dict = {}
        for node in self.graph.nodes:
            for index, operand in enumerate(node.inputs):
                conversion = self.conversion(node, index)
                if conversion and node.op != "cast":
                    key = (operand, conversion)
                    counts[key] = counts.get(key, 0) + 1
        return counts

    def _shared_casts(self, statement, casts: dict) -> list:
        """Casts read more than once whose first reader is in this statement."""
        due = []
        for node in self.graph.nodes:
            if self.statement_of.get(node) is not statement:
                continue
            for index, operand in enumerate(node.inputs):
                key = (operand, self.conversion(node, index))
                if casts.get(key, 0) > 1 and key not in self.hoisted and key not in due:
                    due.append(key)
        return due

    def _hoist(
        self, operand: Node, conversion: tuple, at: int
    ) -> cst.SimpleStatementLine:
        want = conversion[1]
        name = self._fresh(
            f"{self.py.get(operand) or operand.name or operand.op}_{want}",
            (operand, want),
            at,
        )
        self.hoisted[operand, conversion] = name
        return _assign(name, self.ctx.target.cast(self.ref(operand), *conversion))

    def _statements(self, node: Node) -> list:
        name = self._bind(node)
        statements = (
            self._chain(node, name)
            if node.op == "chain"
            else [_assign(name, self.expr(node))]
        )
        if node.note:
            comment = cst.EmptyLine(comment=cst.Comment("# " + node.note))
            statements[0] = statements[0].with_changes(leading_lines=[comment])
        return [self._located(s, node) for s in statements]

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
        if node.op == "chain":
            return self.py.get(node.inputs[0]) or self._label(node.inputs[0]) or "x"
        if node.op in CALLS:
            return node.attrs["target"]
        word = node.label or (
            REGISTRY[node.op].word if node.op in REGISTRY else node.op
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

    def _chain(self, node: Node, name: str) -> list:
        x, *rest = node.inputs
        statements = []
        if self.py.get(x) != name:
            statements.append(_assign(name, self.ref(x)))
        layer = self._fresh("layer", None, self.order[node])
        call = self._invoke(
            node, b.name(layer), [b.name(name)] + [self.ref(i) for i in rest]
        )
        loop = cst.For(
            target=b.name(layer),
            iter=b.attr(b.name("self"), self.ctx.attrs[node.attrs["target"]]),
            body=cst.IndentedBlock([_assign(name, call)]),
        )
        return statements + [loop]

    def _invoke(self, node: Node, module: b.Expr, args: list) -> b.Expr:
        callee = self.typed.callee[node]
        _, key_names, _ = argument_names(callee)
        keys = dict(zip((k for k, _ in callee.graph.keys), key_names))
        kwargs = {keys[k]: self.scalar(v) for k, v in node.attrs["keys"].items()}
        method = self.ctx.method_names[callee]
        if node.op == "call":
            return b.call(b.attr(b.name("self"), method), *args, **kwargs)
        return b.call(
            module if method == "forward" else b.attr(module, method), *args, **kwargs
        )

    def ref(self, operand) -> b.Expr:
        """An operand as it is, without a cast."""
        if isinstance(operand, Scalar) or operand is None:
            return self.scalar(operand) if operand is not None else b.name("None")
        if operand.op == "param":
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
        if node.op == "cast":
            return self.read(node, 0)
        if node.op == "call":
            return self._invoke(node, None, [self.ref(i) for i in node.inputs])
        if node.op == "submodel":
            module = b.attr(b.name("self"), self.ctx.attrs[node.attrs["target"]])
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
        rounds = self.typed.dtype[node] == "bf16" and not op.exact
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
        if scalar.op == "neg":
            return b.neg(self.scalar(scalar.args[0]))
        return b.chain(scalar.op, [self.scalar(a) for a in scalar.args])


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
    if isinstance(value, Scalar):
        return value.value
    if isinstance(value, tuple):
        return tuple(v.value for v in value)
    return value


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
    comment = cst.EmptyLine(
        comment=cst.Comment("# " + echo(frame.form, body=frame.library))
    )
    return cst.With(
        [cst.WithItem(manager)], cst.IndentedBlock(body), leading_lines=[comment]
    )
