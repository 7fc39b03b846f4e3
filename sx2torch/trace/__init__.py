"""The trace pass: each defun's body -> a Graph of nodes, before any dtype is known.

Names resolve here (locals, arguments, &key arguments, consts, params, sub-models, defuns,
ops); calls are checked against their defun's signature and ops against their registry
signature (trace/arguments.py); special forms are traced by their handlers (trace/forms.py);
nodes are made by the builder (ops/builder.py), which stamps the `with-numerics` frames on
every node traced inside them. A `(gradient Y X)` form is one GRADIENT node, which the
gradient pass, next, expands.
"""

from __future__ import annotations

from typing import Optional

from sx2torch.syntax import scalars
from sx2torch.trace import calls
from sx2torch.trace.arguments import apply
from sx2torch.ops.builder import Builder, is_python_number
from sx2torch.trace.calling import Caller
from sx2torch.errors import SourceError
from sx2torch.errors import suggest as _suggest
from sx2torch.trace.forms import HANDLERS, Layer
from sx2torch.ir import (
    Graph,
    Kind,
    Node,
    Operand,
    Scalar,
    argument,
    numbers_read,
    prune,
    walk,
)
from sx2torch.ops import REGISTRY
from sx2torch.ops.rank import outside_rows
from sx2torch.syntax.read import (
    Boolean,
    Datum,
    Keyword,
    List,
    Number,
    String,
    Symbol,
    Vector,
    shown,
)
from sx2torch.syntax.program import Defun, Model, Program
from sx2torch.syntax.scalars import ScalarOp

HINTS = {  # forms from other Lisps, and what to write instead
    "let*": "'let' binds in order already: (let ((a (f x)) (b (g a))) ...)",
    "setq": "there is no mutation: bind a new name with let, as (let ((h (relu h))) ...)",
    "setf": "there is no mutation: bind a new name with let, as (let ((h (relu h))) ...)",
}


ALIASES = {"**": "pow"}  # consts' spelling, in bodies too


def run(program: Program) -> dict:
    """{(model name, defun name): Graph} for every defun of every model."""
    graphs = {}
    integers: dict = {}
    for model in program.all_models():
        for defun in model.defuns.values():
            tracer = Tracer(program, model, defun)
            graphs[model.name, defun.name] = tracer.trace()
            integers.setdefault(model.name, []).extend(tracer.integers)
    calls.check(program, graphs)
    _Instances(program, integers).visit(program.top, {}, ())
    return graphs


class _Instances:
    """Every sub-model instance, with its consts at the values it is built with: a number
    its model reads as an integer (a slice bound, an axis) must be one there too,
    or the module would fail when it runs (`slice indices must be integers`); the model's
    own forms were checked at the defaults only."""

    def __init__(self, program: Program, integers: dict):
        self.program = program
        self.integers = integers  # model name -> [(Scalar, Span, what)]
        self.seen: set = set()  # (Init's id, its arguments' values) visited

    def visit(self, model: Model, env: dict, chain: tuple) -> None:
        """`chain`: the instances down to this one, outermost first, each (Init, the values
        of its arguments)."""
        env = dict(env)
        for const in model.consts.values():
            value = _value(const.value, env)
            if value is not None:
                env.setdefault(const.name, value)
        made = [p for p in model.params.values() if _made(p, env)]
        # a parameter's sizes are resolve's to check, as the instance builds them
        for scalar, span, what in self.integers.get(model.name, []) if chain else ():
            value = _value(scalar, env)
            if value is not None and not _is_int(value):
                raise self._error(chain, scalar, span, what, value)
        for param in made:
            _check_padding_row(param, env, chain)
            init = param.init
            when = _value(init.args["when"], env) if init.kind == "choice" else None
            for instance in init.built(when) if param.is_module else ():
                self._sub_model(instance, env, chain)

    def _sub_model(self, init, env: dict, chain: tuple) -> None:
        sub = self.program.models[init.model]
        count = _value(init.count, env) if init.kind == "stack" else 1
        # a stack's layers differ only where an argument reads the layer index
        layers = range(count) if init.index and _is_int(count) else [None]
        for i in layers:
            layer = {**env, init.index: i} if i is not None else env
            computed = {k: _value(v, layer) for k, (_, v) in init.args.items()}
            args = {k: v for k, v in computed.items() if v is not None}
            seen = (id(init), tuple(sorted(args.items(), key=lambda kv: kv[0])))
            if seen not in self.seen:  # each instance's arguments once, not each layer
                self.seen.add(seen)
                self.visit(sub, args, (*chain, (init, args)))

    def _error(self, chain: tuple, scalar, span, what, value) -> SourceError:
        """At the outermost argument that passes a non-integer where the key's default is
        an integer, else at the instance."""
        reader, where = (
            chain[-1][0].model,
            f"{what} (line {span.line}, column {span.col})",
        )
        for init, args in chain:
            consts = self.program.models[init.model].consts
            for key, (at, _) in init.args.items():
                if _is_int(consts[key].value.value) and not _is_int(args.get(key, 0)):
                    direct = init is chain[-1][0] and key in _consts(scalar)
                    reads = (
                        f"reads it in {where}"
                        if direct
                        else f"reads a number made from it in {where}, "
                        f"{_shown(value)} here"
                    )
                    return SourceError(
                        at,
                        f"{init.model}'s :{key} must be an integer, got "
                        f"{_shown(args[key])}: {reader} {reads}",
                    )
        return SourceError(
            chain[-1][0].span,
            f"{reader}'s {where} must be an integer, got {_shown(value)} with this "
            "instance's arguments",
        )


def _check_padding_row(param, env: dict, chain: tuple) -> None:
    """A drawn table's :padding-idx among its rows at the values an instance passes (at
    the defaults, the top level's), as torch's nn.Embedding requires of its padding_idx.
    """
    row = None if param.is_module else param.init.args.get("padding-idx")
    index = None if row is None else _value(row, env)
    if index is None:
        return
    at, shape = chain[-1][0].span if chain else param.span, param.init.args["shape"]
    if not shape:
        raise SourceError(
            at, f"parameter '{param.name}' has :padding-idx {index}, but no rows"
        )
    problem = outside_rows(index, _value(shape[0], env))
    if problem:
        raise SourceError(at, f"parameter '{param.name}': {problem}")


def _value(scalar: Scalar, env: dict):
    """`scalar` at `env`'s values; None where it is no number there (a division by a zero
    passed to a key, say), which torch's own error reports when the module is built."""
    try:
        return scalars.compute(scalar, env)
    except (ArithmeticError, LookupError, TypeError, ValueError):
        return None


def _made(param, env: dict) -> bool:
    """Whether the instance has the parameter: its `:when` holds, or cannot be told."""
    made = None if param.when is None else _value(param.when, env)
    return made is None or bool(made)


def _consts(scalar: Scalar) -> set:
    """The names of the consts `scalar` reads."""
    if scalar.op is ScalarOp.CONST:
        return {scalar.args[0]}
    if scalar.op is ScalarOp.LIT or scalar.op in scalars.LEAVES:
        return set()
    return {
        name
        for arg in scalar.args
        for a in (arg if isinstance(arg, tuple) else (arg,))
        if isinstance(a, Scalar)
        for name in _consts(a)
    }


def _shown(value) -> str:
    """A number as the source writes it (`true`, `24.0`)."""
    return str(value).lower()


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class Tracer:
    """Traces one defun: names, forms and ops; its `builder` makes the nodes, its `caller`
    follows calls (traced in place under `gradient`). The scope it traces names in (`model`,
    `via`, `loop`, `keys`) changes while a callee is traced in place."""

    def __init__(self, program: Program, model: Model, defun: Defun):
        self.program = program
        self.model = model
        self.defun = defun
        self.param_reads: dict[tuple, Node] = {}
        self.keys = {
            symbol.name: Scalar(
                ScalarOp.KEY,
                (symbol.name,),
                scalars.evaluate(default, model.lookup_const).value,
            )
            for symbol, default in defun.keys
        }
        key_defaults = [
            (symbol.name, scalars.evaluate(default, model.lookup_const))
            for symbol, default in defun.keys
        ]
        # (model, sub-model param) pairs down to an inlined sub-model
        self.via: tuple = ()
        self.loop = None  # the FOR whose layer's forward is traced in place, if any
        self.builder = Builder(
            Graph(model.name, defun.name, [], key_defaults, defun.doc, span=defun.span),
            program,
        )
        self.caller = Caller(self, self.builder, (model.name, defun.name))
        # (Scalar, Span, what): numbers on the model's consts read as integers (_Instances)
        self.integers: list = []

    def trace(self) -> Graph:
        graph = self.builder.graph
        env = {}
        for symbol in self.defun.args:
            node = argument(symbol.name, symbol.span, symbol)
            graph.inputs.append(node)
            env[symbol.name] = node
        graph.output = self.caller.returned(self.defun.body, env)
        # an unused gradient is still checked: its pass prunes what it does not need
        gradients = [n for n in walk(graph.nodes) if n.kind is Kind.GRADIENT]
        prune(graph, gradients)
        return graph

    def expr(self, datum: Datum, env: dict) -> Operand:
        if isinstance(datum, (Number, Boolean)):
            return Scalar.lit(datum.value)
        if isinstance(datum, Symbol):
            return self.name(datum, env)
        if isinstance(datum, List):
            value = self.form(datum, env)
            if isinstance(value, tuple):
                head = datum.items[0].name
                what = "this for" if head == "for" else f"this call of '{head}'"
                raise SourceError(
                    datum.span,
                    f"{what} gives {len(value)} values: bind them, as (let (([a b] ({head} ...))) ...)",
                )
            return value
        what = {Keyword: "a keyword", String: "a string", Vector: "a vector"}[
            type(datum)
        ]
        raise SourceError(datum.span, f"{what} is not a value here")

    def name(self, symbol: Symbol, env: dict) -> Operand:
        name = symbol.name
        if isinstance(env.get(name), Layer):
            raise SourceError(
                symbol.span, f"'{name}' is a layer: call it, as ({name} x)"
            )
        if name in env:
            return env[name]
        if self.defun.shared and name not in self.keys:
            raise self._out_of_reach(symbol)
        scalar = self.keys.get(name) or self.const(name)
        if scalar is not None:
            if isinstance(scalar.value, str):
                raise SourceError(
                    symbol.span,
                    f"'{name}' is the keyword :{scalar.value}, not a number or a tensor",
                )
            return scalar
        param = self.model.params.get(name)
        if param is not None:
            if param.is_module:
                raise SourceError(
                    symbol.span, f"'{name}' is a sub-model: call it, as ({name} x)"
                )
            return self.param_read(name, symbol)
        if name in self.model.defuns or _is_public_op(name):
            raise SourceError(
                symbol.span, f"'{name}' is a function: call it, as ({name} ...)"
            )
        member = self._member(symbol)
        if member is not None:
            return member
        known = [*env, *self.keys, *self.model.consts, *self.model.params]
        raise SourceError(
            symbol.span,
            f"unknown name '{name}': expected an argument, a let local, a const or a param{_suggest(name, known)}",
        )

    def _out_of_reach(self, symbol: Symbol) -> SourceError:
        return SourceError(
            symbol.span,
            f"'{symbol.name}' is out of reach in '{self.defun.name}': a top-level defun "
            f"called from model '{self.model.name}' sees only its arguments, its let "
            "locals and other top-level defuns; pass it as an argument",
        )

    def param_read(self, name: str, symbol: Symbol) -> Node:
        key = (self.loop, self.via, name)
        if key not in self.param_reads:
            attrs = {"param": name}
            if self.model.params[name].when is not None:
                attrs["conditional"] = True  # made on some instances: cast where read
            if self.via or self.loop:  # a sub-model's, where its forward is inlined
                attrs.update(owner=self.model.name, via=self.via)
            if self.loop:  # read through the loop's layer
                attrs["loop"] = self.loop
            node = Node(Kind.PARAM, None, (), attrs, symbol.span, symbol, name=name)
            # In the outermost block it can be read in, so that a read inside a region
            # serves the reads after it.
            block = (
                self.loop.regions[0].nodes if self.loop else self.builder.graph.nodes
            )
            block.append(node)
            self.builder.shape(node)
            self.param_reads[key] = node
        return self.param_reads[key]

    def _member(self, symbol: Symbol) -> Optional[Node]:
        """`sub.weight`, `a.b.weight`: a parameter of a sub-model instance at any depth, read
        as it is stored, as the real code's `F.embedding(ids, self.lm_head.weight)` reads a
        tied weight."""
        if "." not in symbol.name:
            return None
        steps = self.program.member(self.model, symbol.name)
        if steps is None:
            return None
        *subs, (owner, name) = steps
        outer = self.model, self.via
        self.via = self.via + tuple((model.name, sub) for model, sub in subs)
        self.model = owner
        try:
            return self.param_read(name, symbol)
        finally:
            self.model, self.via = outer

    def const(self, name: str):
        """A const of the model being traced; inside an inlined sub-model, read through it."""
        scalar = self.model.lookup_const(name)
        if scalar is None or not (self.via or self.loop):
            return scalar
        through = (self.loop,) if self.loop else ()
        return Scalar(
            ScalarOp.CONST, (name, self.via, self.model.name, *through), scalar.value
        )

    def form(self, datum: List, env: dict) -> Operand:
        if not datum.items:
            raise SourceError(datum.span, "an empty list is not a value")
        head = datum.items[0]
        if not isinstance(head, Symbol):
            raise SourceError(
                head.span, f"expected an op or function name, got {shown(head)}"
            )
        layer = env.get(head.name)
        if isinstance(layer, Layer):
            param = self.model.params[layer.stack]
            forward = self.program.models[param.init.model].defuns["forward"]
            return self.caller.invoke(
                Kind.SUBMODEL, layer.stack, forward, datum, env, layer.loop
            )
        if head.name in env or head.name in self.keys or head.name in self.model.consts:
            raise SourceError(head.span, f"'{head.name}' is a value, not a function")
        if head.name in HANDLERS:
            return HANDLERS[head.name](self, datum, env)
        if head.name in self.model.defuns:
            return self.caller.call(datum, env)
        param = self.model.params.get(head.name)
        if param is not None and self.defun.shared:
            raise self._out_of_reach(head)
        if param is not None and param.is_module:
            if param.init.kind == "stack":
                raise SourceError(
                    head.span,
                    f"'{head.name}' is a stack: apply it with (chain {head.name} x)",
                )
            return self.caller.submodel(head.name, datum, env)
        if _is_public_op(head.name) or head.name in ALIASES:
            return apply(self, REGISTRY[ALIASES.get(head.name, head.name)], datum, env)
        public = [name for name in REGISTRY if _is_public_op(name)]
        known = [*public, *HANDLERS, *self.model.defuns, *self.model.params]
        hint = f": {HINTS[head.name]}" if head.name in HINTS else self._owner(head.name)
        raise SourceError(
            head.span,
            f"unknown op or function '{head.name}'{hint or _suggest(head.name, known)}",
        )

    def _owner(self, name: str) -> Optional[str]:
        """Where a defun of another model is, and how to share it."""
        owner = next(
            (m for m in self.program.models.values() if name in m.defuns), None
        )
        if owner is None:
            return None
        return (
            f": it is a defun of model '{owner.name}', out of reach in "
            f"'{self.model.name}'; a defun written at the top level is seen by every model"
        )

    def body(self, forms: tuple, env: dict) -> Operand:
        result = None
        for form in forms:
            result = self.expr(form, env)
        return result

    def scalar(self, datum: Datum, env: dict, run: bool = False) -> Scalar:
        """A number known when the file compiles; with `run`, where torch takes an int (a
        slice's bound, a reshape's size), one known when the module runs too, `(size x)`.
        """
        if isinstance(datum, Vector):  # a list, passed to a list &key: `:sizes [3 4]`
            items = [self.scalar(item, env) for item in datum.items]
            return scalars.vector(items, datum.span)
        if isinstance(datum, Keyword):  # a keyword element, as `(in t [:full])`'s
            return Scalar.lit(datum.name)
        return _known(self.expr(datum, env), datum.span, run)

    def integer(self, scalar: Scalar, span, what: str) -> Scalar:
        """`scalar`, an integer at the defaults; on the consts, checked per instance too."""
        scalars.expect_int(scalar, span, what)
        if not (self.via or self.loop) and _on_consts(scalar):
            self.integers.append((scalar, span, what))
        return scalar

    def tensor(self, datum: Datum, env: dict, what: str) -> Node:
        operand = self.expr(datum, env)
        if not isinstance(operand, Node):
            raise SourceError(datum.span, f"{what} must be a tensor, got a number")
        return operand


def _on_consts(scalar: Scalar) -> bool:
    """Whether `scalar` reads a const of its model and nothing else but literals (not a
    defun's key or a layer index, which the instance does not set)."""
    return scalars.walk_up(scalar, _reads_consts)


def _reads_consts(scalar: Scalar, of) -> bool:
    if scalar.op is ScalarOp.CONST:
        return len(scalar.args) == 1
    operands = scalars.operands_of(scalar)  # none of a leaf
    return any(of(a) for a in operands) and all(
        a.op is ScalarOp.LIT or of(a) for a in operands
    )


def _is_public_op(name: str) -> bool:
    return name in REGISTRY and not REGISTRY[name].internal


def _known(operand, span, run: bool = False) -> Scalar:
    """`operand` as a number known when the file compiles; with `run`, a Python number
    known when the module runs may be one too (ScalarOp.RUN). A tensor, or such a number
    where only a compile-time one can serve, is a diagnostic."""
    if is_python_number(operand):
        if run:
            return Scalar.run(operand)
        raise SourceError(span, _runs(f"({operand.op.name} ...)"))
    if not isinstance(operand, Scalar):
        raise SourceError(span, "expected a number known at compile time, got a tensor")
    if not run and scalars.run_nodes(operand):
        first = _origin(scalars.run_nodes(operand)[0])
        raise SourceError(span, _runs(f"a number computed from ({first.op.name} ...)"))
    return operand


def _origin(node: Node) -> Node:
    """The op whose number a run-time number is computed from, through the lets that name
    its steps (each reads the one before as a number): `(size ...)`."""
    while numbers_read(node):
        node = numbers_read(node)[0]
    return node


def _runs(what: str) -> str:
    return (
        f"expected a number known at compile time, got {what}, a Python integer "
        "known only when the module runs (it may be a slice's bound, a "
        "reshape's size, a pad's width, arange's bounds: where torch takes an int)"
    )
