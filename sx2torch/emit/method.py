"""One specialization of a defun -> one method, as its layout and its names say."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import libcst as cst

import sx2torch.build as b
from sx2torch.emit import scalars, targets
from sx2torch.emit.naming import Locals, Naming
from sx2torch.ir import ISLAND, Kind, Node, Scalar
from sx2torch.ops import SYMBOLIC, EmitContext
from sx2torch.ops.builder import is_number
from sx2torch.ops.rank import rank_of
from sx2torch.plan import Plans
from sx2torch.plan.casts import Hoist
from sx2torch.plan.layout import RETURN, TOP, Layout, returns_expression
from sx2torch.plan.targets import Target
from sx2torch.policy import Typed
from sx2torch.syntax.scalars import ScalarOp, operands_of, walk_up


@dataclass
class ClassContext:
    """What a method needs to know of its class and of the other methods."""

    target: Target
    plans: Plans
    naming: Naming
    attrs: dict  # source name -> attribute name, for consts, params and sub-models
    source_lines: Optional[str] = (
        None  # the file name for `# file.lisp:LINE` comments, when asked for
    )


class Spelling:
    """How a method spells what it reads but does not compute: members (`self.w`, a
    loop's `layer.w`), &key arguments, loop indices, compile-time scalars and the names of
    its locals."""

    def __init__(self, typed: Typed, ctx: ClassContext, locals_: Locals, ref=None):
        self.typed = typed
        self.ctx = ctx
        self.locals = locals_
        self.ref = ref  # how the method writes a value: a run-time number's node
        # the leaf nodes it writes, one for every place it writes each (libcst's nodes are
        # immutable: a long expression reads the same few values thousands of times): a
        # local's Name by its identifier, a literal by its type and repr (2 is not 2.0,
        # -0.0 not 0.0)
        self.names: dict = {}
        self.literals: dict = {}

    def attr(self, value):
        """An op's attribute: its scalars spelled, anything else as it is."""
        if isinstance(value, Scalar):
            return self.scalar(value)
        if isinstance(value, tuple):
            return tuple(self.scalar(v) for v in value)
        return value

    def member(
        self, name: str, via: tuple = (), owner: Optional[str] = None, loop=None
    ) -> b.Expr:
        """`self.name`; `self.enc.name` for a sub-model's member read where its forward is
        inlined, `layer.name` for a loop's layer's."""
        naming = self.ctx.naming
        node = b.name("self" if loop is None else self.locals.loops[loop][1])
        for model, member in (*via, (owner or self.typed.model, name)):
            store = naming.stores.get(model, {}).get(member)
            node = b.member(node, naming.attrs[model][member], store)
        return node

    def scalar(self, scalar: Scalar) -> b.Expr:
        """A number as the method writes it, the kept numbers it holds by their names."""
        if scalar.op is ScalarOp.LIT:  # its number, as `_written` writes one
            return self._literal(scalar.value)
        return walk_up(scalar, self._written, self._unnamed)

    def name(self, identifier: str) -> cst.Name:
        """A local's name as the method reads it."""
        found = self.names.get(identifier)
        if found is None:
            found = self.names[identifier] = b.name(identifier)
        return found

    def _literal(self, value) -> b.Expr:
        key = (type(value), repr(value))
        found = self.literals.get(key)
        if found is None:
            found = self.literals[key] = b.number(value)
        return found

    def _unnamed(self, scalar: Scalar, of) -> tuple:
        """The operands a number is written with: none where a local holds it."""
        return () if scalar in self.locals.scalars else operands_of(scalar)

    def _written(self, scalar: Scalar, of) -> b.Expr:
        if scalar.op is ScalarOp.LIT:
            return b.number(scalar.value)
        if scalar.op is ScalarOp.CONST:
            return self.member(*scalar.args)
        if scalar.op is ScalarOp.KEY:
            return b.name(self.locals.keys[scalar.args[0]])
        if scalar.op is ScalarOp.INDEX:
            return b.name(self.locals.loops[scalar.args[0]][0])
        if scalar.op is ScalarOp.RUN:  # `x.shape[1]`, or the local that holds it
            return self.ref(scalar.args[0])
        if scalar in self.locals.scalars:  # a number the source names, kept as a local
            return b.name(self.locals.scalars[scalar])
        return scalars.python(scalar.op, scalar.args, of)

    def computed(self, scalar: Scalar) -> b.Expr:
        """A compound number written out, the kept numbers it holds by their names."""
        return scalars.python(scalar.op, scalar.args, self.scalar)


class MethodEmitter:
    """Writes one specialization's method as its plan says (sx2torch/plan/): the layout's
    statements, precision blocks and hoisted casts, each cast as it is spelled, under the
    names the names pass gave them (sx2torch/emit/naming.py)."""

    def __init__(self, typed: Typed, ctx: ClassContext):
        self.typed = typed
        self.ctx = ctx
        self.graph = typed.graph
        plan = ctx.plans.plans[typed]
        self.layout: Layout = plan.layout
        self.spelled = plan.spelled
        self.locals: Locals = ctx.naming.locals[typed]
        self.py = self.locals.values
        self.spelling = Spelling(typed, ctx, self.locals, self.ref)

    def body(self) -> list:
        """The method's statements, precision blocks nested."""
        statements = _kept_numbers(self.layout, self.locals, self.spelling)
        statements += self._hoists(TOP, ())
        statements += self._block(self.graph.nodes)
        output = self.graph.output
        several = isinstance(output, tuple)
        one = returns_expression(self.layout) and not several
        # one value computed is returned in its block; several are returned outside any
        path = self.layout.path(output) if one else ()
        statements += self._hoists(RETURN, path)  # only a return that computes has any
        value = (
            _bare_tuple([self.ref(o) for o in output]) if several else self.ref(output)
        )
        returned = cst.SimpleStatementLine([cst.Return(value)])
        statements.append((path, self._located(returned, output) if one else returned))
        return _nest(statements, self.ctx.target.device, self.layout.unblocked)

    def _block(self, nodes: list) -> list:
        """(path, statement) for the named nodes of one block, in order."""
        statements: list = []
        for node in nodes:
            if node not in self.layout.named:
                continue
            path = self.layout.path(node)
            statements += self._hoists(node, path)
            statements.extend((path, s) for s in self._statements(node))
        return statements

    def _hoists(self, statement, path: tuple) -> list:
        """The casts written before a statement, which its readers then read by name."""
        hoists = []
        for hoist in self.layout.hoists.at.get(statement, []):
            cast = targets.cast(self.ref(hoist.operand), self.spelled.hoists[hoist])
            hoists.append((path, _assign(self.locals.hoists[hoist], cast)))
        return hoists

    def _statements(self, node: Node) -> list:
        if node.kind is Kind.FOR:
            statements = self._for(node)
        elif self.layout.compound(node, self.layout.named):
            statements = [self._if(node)]
        elif node in self.locals.unpacked:
            names = [b.name(n) for n in self.locals.unpacked[node]]
            statements = [_assign_all(_bare_tuple(names), self.expr(node))]
        else:
            statements = [_assign(self._target(node), self.expr(node))]
        statements += [
            _assign(alias, b.name(self._target(node)))
            for alias in self.locals.aliases.get(node, ())
        ]
        if node.note:
            comment = cst.EmptyLine(comment=cst.Comment("# " + node.note))
            statements[0] = statements[0].with_changes(leading_lines=[comment])
        return [self._located(s, node) for s in statements]

    def _target(self, node: Node) -> str:
        """The name a node's statement assigns."""
        return self.locals.targets.get(node, self.py[node])

    def _region_body(self, node: Node, index: int, names: list) -> list:
        """A region's statements, its outputs stored in `names` at its end, nested in the
        blocks they need inside the node's own."""
        region = node.regions[index]
        path = self.layout.path(node)
        inner = self._block(region.nodes) + self._hoists(
            self.layout.end(node, index), path
        )
        stores = [(name, self._output(node, index, k)) for k, name in enumerate(names)]
        reorder = (node, index) in self.spelled.reordered
        inner += [(path, s) for s in _stores(stores, reorder)]
        return _nest(
            [(p[len(path) :], s) for p, s in inner],
            self.ctx.target.device,
            self.layout.unblocked,
        )

    def _output(self, node: Node, region: int, index: int) -> b.Expr:
        """A region's output as its node stores it: cast to the node's dtype for it."""
        operand = node.regions[region].outputs[index]
        cast = self.spelled.outputs.get((node, region, index))
        return targets.cast(self.ref(operand), cast)

    def _for(self, node: Node) -> list:
        """`for i, layer in enumerate(self.stack):`, the carried values assigned before it
        and at the end of its body."""
        (body,) = node.regions
        names = [self.py[carried] for carried in body.inputs[: len(node.inputs)]]
        statements = [
            _assign(name, self.read(node, k))
            for k, (init, name) in enumerate(zip(node.inputs, names))
            if self.py.get(init) != name or (node, k) in self.spelled.reads
        ]
        index, layer = self.locals.loops[node]
        stack = self.spelling.member(node.attrs["stack"])
        target = b.name(layer)
        if index is not None:
            target = cst.Tuple(
                [cst.Element(b.name(index)), cst.Element(b.name(layer))],
                lpar=[],
                rpar=[],
            )
            stack = b.call("enumerate", stack)
        records = self.locals.records.get(node, [])
        statements += [_assign(record, b.list_([])) for record in records]
        first = [
            cst.SimpleStatementLine(
                [cst.Expr(b.method(b.name(record), "append", b.name(name)))]
            )
            for record, name in zip(records, names)
        ]
        forward = node.attrs.get("reverse")
        # an adjoint loop: the layers in reverse, and each one's inputs
        if forward is not None:
            stack = b.call("reversed", b.call("list", stack))
            recorded = body.inputs[len(node.inputs) :]
            first = [
                _assign(self.py[value], b.subscript(b.name(record), b.name(index)))
                for value, record in zip(recorded, self.locals.records[forward])
            ]
        loop_body = cst.IndentedBlock(first + self._region_body(node, 0, names))
        return statements + [cst.For(target=target, iter=stack, body=loop_body)]

    def _if(self, node: Node) -> cst.If:
        name = self._target(node)
        then, otherwise = (self._region_body(node, r, [name]) for r in (0, 1))
        return cst.If(
            self.spelling.scalar(node.attrs["condition"]),
            cst.IndentedBlock(then or [cst.SimpleStatementLine([cst.Pass()])]),
            orelse=cst.Else(cst.IndentedBlock(otherwise)) if otherwise else None,
        )

    def _located(self, statement, node: Node):
        return located(statement, node.span, self.ctx.source_lines)

    def _invoke(self, node: Node, module: b.Expr, args: list) -> b.Expr:
        callee = self.typed.callee[node]
        keys = self.ctx.naming.locals[callee].keys
        kwargs = {
            keys[k]: self.spelling.scalar(v) for k, v in node.attrs["keys"].items()
        }
        method = self.ctx.naming.methods[callee]
        function = _called(node, module, method, self.ctx.plans.function(callee))
        if node.attrs.get("once"):  # a :generate run's call of the prompt alone
            return b.call("sx.once", function, *args, **kwargs)
        return b.call(function, *args, **kwargs)

    def ref(self, operand) -> b.Expr:
        """An operand as it is, without a cast."""
        if isinstance(operand, Scalar) or operand is None:
            return (
                self.spelling.scalar(operand) if operand is not None else b.name("None")
            )
        if operand.kind is Kind.PARAM:
            attrs = operand.attrs
            return self.spelling.member(
                attrs["param"],
                attrs.get("via", ()),
                attrs.get("owner"),
                attrs.get("loop"),
            )
        if operand in self.py:
            return self.spelling.name(self.py[operand])
        return self.expr(operand)

    def read(self, node: Node, index: int) -> b.Expr:
        """An operand as `node` reads it: cast to the dtype the node computes in."""
        cast = self.spelled.reads.get((node, index))
        if isinstance(cast, Hoist):
            return b.name(self.locals.hoists[cast])
        return targets.cast(self.ref(node.inputs[index]), cast)

    def expr(self, node: Node) -> b.Expr:
        if node.kind is Kind.CAST:
            return self.read(node, 0)
        if node.kind is Kind.IF:
            written = scalars.python(
                ScalarOp.IF,
                (node.attrs["condition"], 0, 1),
                lambda a: (
                    self.spelling.scalar(a)
                    if isinstance(a, Scalar)
                    else self._output(node, a, 0)
                ),
            )
            # a choice's call, `self.mlp(x)` in both branches where no cast differs: the
            # instance was chosen when the model was built
            same = written.body.deep_equals(written.orelse)
            return written.body if same and "choice" in node.attrs else written
        if node.kind is Kind.CALL:
            return self._invoke(node, None, [self.ref(i) for i in node.inputs])
        if node.kind is Kind.SUBMODEL:
            loop = node.attrs.get("loop")
            module = (
                b.name(self.locals.loops[loop][1])
                if loop is not None
                else self.spelling.member(node.attrs["target"])
            )
            if "at" in node.attrs:  # (nth STACK I ...)
                module = b.subscript(module, self.spelling.scalar(node.attrs["at"]))
            items = node.attrs.get("sequence")
            if "item" in node.attrs and "choice" not in node.attrs:  # a list's item
                module = b.subscript(module, b.number(node.attrs["item"]))
            called = self._invoke(node, module, [self.ref(i) for i in node.inputs])
            if items == node.attrs.get("item", 0) + 1:
                return _sequential(module.value, called, items) or called
            return called
        if node in self.layout.topk_values:
            # topk's values, where nothing else reads its indices
            indices = self.expr(self.layout.topk_values[node])
            return indices.with_changes(attr=cst.Name("values"))
        op = node.op
        operands = [self.read(node, i) for i in range(len(node.inputs))]
        decided = self.typed.decided[node]
        attrs = node.attrs  # most ops have none: no comprehension run for them
        context = EmitContext(
            self.ctx.target.name,
            decided.compute,
            {k: self.spelling.attr(v) for k, v in attrs.items()} if attrs else {},
            {k: _value(v) for k, v in attrs.items()} if attrs else {},
            tuple(map(is_number, node.inputs)),
            tuple(map(rank_of, node.inputs)),
        )
        value = op.emit(operands, context)
        if node in self.locals.unpacked:
            # topk's indices assigned with its values: the call itself
            value = value.value
        if node in self.spelled.stores:
            value = targets.store(value)
        gathered = self.spelled.gathered.get(node)
        return targets.cast(value, gathered)


def _sequential(module, called: cst.Call, items: int) -> Optional[cst.Call]:
    """`self.down(x)` where the items' calls read `self.down[1](self.down[0](x))`: each
    item's forward on the value before, with no cast between, is nn.Sequential's forward.
    """
    value = called
    for k in reversed(range(items)):
        item = b.subscript(module, b.number(k))
        if not (
            isinstance(value, cst.Call)
            and len(value.args) == 1
            and not value.args[0].keyword
            and value.func.deep_equals(item)
        ):
            return None
        value = value.args[0].value
    return b.call(module, value)


def _value(value):
    """What emission may decide from: a literal's value, never a const's or a key's default."""
    if isinstance(value, Scalar):
        return value.value if value.op is ScalarOp.LIT else SYMBOLIC
    if isinstance(value, tuple):
        return tuple(_value(v) for v in value)
    return value


def _stores(stores: list, reorder: bool) -> list:
    """`x = ...` for each carried value, in an order where none overwrites a name a later
    one still reads (each reads the old values); those left (a swap, or the rest where
    `reorder` is false: a value may draw, and the draws keep their order) as one
    `x, y = ..., ...`. A value already in its variable is not stored again."""
    pending = [
        (name, value)
        for name, value in stores
        if not (isinstance(value, cst.Name) and value.value == name)
    ]
    ordered = []
    while pending:
        free = next(
            (
                store
                for store in (pending if reorder else pending[:1])
                if not any(
                    store[0] in _names(v) for other, v in pending if other != store[0]
                )
            ),
            None,
        )
        if free is None:
            targets = _bare_tuple([b.name(n) for n, _ in pending])
            return ordered + [
                _assign_all(targets, _bare_tuple([v for _, v in pending]))
            ]
        ordered.append(_assign(*free))
        pending.remove(free)
    return ordered


def _names(value: b.Expr) -> set:
    """The names an expression reads (attribute and keyword names too: a superset)."""
    names = _Names()
    value.visit(names)
    return names.found


class _Names(cst.CSTVisitor):
    def __init__(self):
        super().__init__()
        self.found: set = set()

    def visit_Name(self, node: cst.Name) -> None:
        self.found.add(node.value)


def _bare_tuple(items: list) -> cst.Tuple:
    """`a, b`, as an assignment's target or value."""
    return cst.Tuple([cst.Element(i) for i in items], lpar=[], rpar=[])


def _assign(name: str, value: b.Expr) -> cst.SimpleStatementLine:
    return _assign_all(b.name(name), value)


def _assign_all(target, value: b.Expr) -> cst.SimpleStatementLine:
    return cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(target)], value)])


def _kept_numbers(layout: Layout, locals_: Locals, spelling: Spelling) -> list:
    """(path, statement) assigning each number the source names that the method keeps as
    a local, before its first statement."""
    return [
        ((), _assign(locals_.scalars[scalar], spelling.computed(scalar)))
        for _, scalar in layout.scalars
    ]


def _nest(statements: list, device: str, unblocked: set) -> list:
    """Statements with their block paths -> statements with nested `with` blocks (an
    island in `unblocked`: its statements under its comment, no block)."""
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
    return _render(root, device, unblocked)


def _render(items: list, device: str, unblocked: set) -> list:
    rendered = []
    for item in items:
        if isinstance(item, tuple):
            frame, body = item
            inner = _render(body, device, unblocked)
            if frame in unblocked:
                rendered += _commented(inner, _comment(frame))
            else:
                rendered.append(_block(frame, inner, device))
        else:
            rendered.append(item)
    return rendered


def _comment(frame) -> cst.EmptyLine:
    return cst.EmptyLine(comment=cst.Comment("# " + frame.text))


def _commented(statements: list, comment: cst.EmptyLine) -> list:
    """The statements, the first with `comment` above any it has."""
    first, *rest = statements
    return [first.with_changes(leading_lines=[comment, *first.leading_lines]), *rest]


def _block(frame, body: list, device: str) -> cst.With:
    if frame.mode == ISLAND:
        manager = b.call("torch.autocast", b.string(device), enabled=b.name("False"))
    else:
        manager = b.call("sx.bf16_region")
    return cst.With(
        [cst.WithItem(manager)],
        cst.IndentedBlock(body),
        leading_lines=[_comment(frame)],
    )


def located(statement, span, source_lines: Optional[str]):
    """With --source-lines, a trailing `# file.lisp:LINE:COL` comment."""
    if source_lines is None or not isinstance(statement, cst.SimpleStatementLine):
        return statement
    comment = cst.Comment(f"# {source_lines}:{span.line}:{span.col}")
    return statement.with_changes(
        trailing_whitespace=cst.TrailingWhitespace(cst.SimpleWhitespace("  "), comment)
    )


def _called(node: Node, module: b.Expr, method: str, function: bool) -> b.Expr:
    """What a call node calls: a module-level function, a method of the model's own, or a
    sub-model (its forward, or the method of a specialization)."""
    if node.kind is Kind.CALL:
        return b.name(method) if function else b.attr(b.name("self"), method)
    return module if method == "forward" else b.attr(module, method)
