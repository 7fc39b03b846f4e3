"""Pass 3, trace: each defun's body -> a Graph of nodes, before any dtype is known.

Names resolve here (locals, arguments, &key arguments, consts, params,
sub-models, defuns, ops); ops are checked against their registry signature;
compile-time arithmetic folds into scalars; `with-numerics` frames are stamped
on every node traced inside them.
"""

from __future__ import annotations

import difflib
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Optional

from sx2torch import gradient, scalars
from sx2torch.errors import SourceError
from sx2torch.echo import echo
from sx2torch.errors import suggest as _suggest
from sx2torch.ir import (
    ISLAND,
    REGION,
    Frame,
    Graph,
    Kind,
    Node,
    Operand,
    Region,
    Scalar,
    reads,
)
from sx2torch.ops import REGISTRY, Op
from sx2torch.read import (
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
from sx2torch.resolve import SPECIAL_FORMS, Defun, Model, Program

TENSOR_KINDS = ("tensor", "matrix", "ids", "bool-tensor", "like")
SCALAR_KINDS = {"int": "an integer", "number": "a number", "bool": "true or false"}
HINTS = {  # forms from other Lisps, and what to write instead
    "let*": "'let' binds in order already: (let ((a (f x)) (b (g a))) ...)",
    "setq": "there is no mutation: bind a new name with let, as (let ((h (relu h))) ...)",
    "setf": "there is no mutation: bind a new name with let, as (let ((h (relu h))) ...)",
    "dropout": "dropout is not supported: a defun is a deterministic dataflow graph, "
    "with no random numbers and no training mode; leave it out, "
    "or apply torch's dropout to the generated module's inputs or outputs",
}


def run(program: Program) -> dict:
    """{(model name, defun name): Graph} for every defun of every model."""
    graphs = {}
    for model in program.all_models():
        for defun in model.defuns.values():
            graphs[model.name, defun.name] = Tracer(program, model, defun).trace()
    return graphs


class Tracer:
    def __init__(self, program: Program, model: Model, defun: Defun):
        self.program = program
        self.model = model
        self.defun = defun
        self.frames: tuple = ()
        self.datum: Optional[Datum] = None  # the form whose nodes are being made
        self.param_reads: dict[tuple, Node] = {}
        # (what, inputs, keys, scope) -> the value of a call traced in place, which a second
        # such call reuses, so a call DAG under `gradient` traces in time linear in its size
        self.inlined: dict = {}
        self.via: (
            tuple
        ) = ()  # (model, sub-model param) pairs down to an inlined sub-model
        self.inline = False
        self.stamps: (
            tuple
        ) = ()  # frames that mark the backward of the gradient being traced
        self.keys = {
            symbol.name: Scalar(
                "key",
                (symbol.name,),
                scalars.evaluate(default, model.lookup_const).value,
            )
            for symbol, default in defun.keys
        }
        self.key_defaults = [
            (symbol.name, scalars.evaluate(default, model.lookup_const))
            for symbol, default in defun.keys
        ]
        self.graph = Graph(
            model.name, defun.name, [], self.key_defaults, defun.doc, span=defun.span
        )
        self.nodes = self.graph.nodes  # where new nodes go: the graph's, or a region's
        self.loops: dict = {}  # a `for`'s layer name -> its FOR node, inside its body

    def trace(self) -> Graph:
        env = {}
        for symbol in self.defun.args:
            node = Node(Kind.INPUT, None, (), {}, symbol.span, symbol, name=symbol.name)
            self.graph.inputs.append(node)
            env[symbol.name] = node
        result = None
        for form in self.defun.body:
            result = self.expr(form, env)
        self.graph.output = result
        self._prune()
        return self.graph

    def _prune(self) -> None:
        """Drop nodes the result does not depend on: a defun has no side effects."""
        live, pending = set(), [self.graph.output]
        while pending:
            node = pending.pop()
            if isinstance(node, Node) and node not in live:
                live.add(node)
                pending.extend(reads(node))
        _keep(self.graph.nodes, live)

    # Node construction, also used by the ops' `expand` definitions.

    def op(self, name: str, inputs: list, **attrs) -> Operand:
        op = REGISTRY[name]
        for spec in op.keys:
            attrs.setdefault(spec.name, _default(spec.default))
        if op.expand:
            result = op.expand(self, inputs, attrs)
            if isinstance(result, Node) and result.label is None:
                result.label = op.word
            return result
        if op.result == "arith" and all(isinstance(i, Scalar) for i in inputs):
            return self._fold(name, inputs)
        frames = self.frames + ((_mark(ISLAND, self.datum),) if op.sensitive else ())
        return self._add(
            Node(
                Kind.OP,
                name,
                tuple(inputs),
                attrs,
                self.datum.span,
                self.datum,
                frames,
            )
        )

    def _add(self, node: Node) -> Node:
        self.nodes.append(node)
        return node

    @contextmanager
    def _region(self, region: Region):
        """Nodes made inside go to `region`."""
        outer, self.nodes = self.nodes, region.nodes
        try:
            yield region
        finally:
            self.nodes = outer

    def _fold(self, name: str, inputs: list) -> Scalar:
        if name in ("-", "neg") and len(inputs) == 1:
            return scalars.negate(inputs[0], self.datum.span)
        return scalars.fold(name, inputs[0], inputs[1], self.datum.span)

    @contextmanager
    def library_island(self):
        """Nodes made inside compute in f32 under either policy (a library mark, 6.8)."""
        with self._frame(_mark(ISLAND, self.datum)):
            yield

    @contextmanager
    def library_region(self):
        """Nodes made inside compute in bf16 under either policy."""
        with self._frame(_mark(REGION, self.datum)):
            yield

    def cast(self, operand: Operand, dtype: str) -> Operand:
        """An explicit conversion to "f32" or "bf16"; a scalar stays a scalar."""
        if isinstance(operand, Scalar):
            return operand
        return self._add(
            Node(
                Kind.CAST,
                None,
                (operand,),
                {"dtype": dtype},
                self.datum.span,
                self.datum,
                self.frames,
            )
        )

    @contextmanager
    def _frame(self, frame: Frame):
        outer = self.frames
        self.frames = outer + (frame,)
        try:
            yield
        finally:
            self.frames = outer

    # Expressions.

    def expr(self, datum: Datum, env: dict) -> Operand:
        if isinstance(datum, (Number, Boolean)):
            return Scalar.lit(datum.value)
        if isinstance(datum, Symbol):
            return self.name(datum, env)
        if isinstance(datum, List):
            value = self.form(datum, env)
            if isinstance(value, tuple):
                raise SourceError(
                    datum.span,
                    f"this for gives {len(value)} values: bind them, as (let (([a b] (for ...))) ...)",
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
        scalar = self.keys.get(name) or self._const(name)
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
        known = [*env, *self.keys, *self.model.consts, *self.model.params]
        raise SourceError(
            symbol.span,
            f"unknown name '{name}': expected an argument, a let local, a const or a param{_suggest(name, known)}",
        )

    def param_read(self, name: str, symbol: Symbol) -> Node:
        key = (self.via, name)
        if key not in self.param_reads:
            attrs = {"param": name}
            if self.via:  # a sub-model's parameter, read where its forward is inlined
                attrs.update(owner=self.model.name, via=self.via)
            node = Node(Kind.PARAM, None, (), attrs, symbol.span, symbol, name=name)
            # In the graph's own nodes, so that a read inside a region serves the reads after it.
            self.graph.nodes.append(node)
            self.param_reads[key] = node
        return self.param_reads[key]

    def _const(self, name: str):
        """A const of the model being traced; inside an inlined sub-model, read through it."""
        scalar = self.model.lookup_const(name)
        if scalar is None or not self.via:
            return scalar
        return Scalar("const", (name, self.via, self.model.name), scalar.value)

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
            return self._invoke(
                Kind.SUBMODEL, layer.stack, forward, datum, env, layer.loop
            )
        if head.name in env or head.name in self.keys or head.name in self.model.consts:
            raise SourceError(head.span, f"'{head.name}' is a value, not a function")
        if head.name in SPECIAL_FORMS:
            return getattr(self, "_" + head.name.replace("-", "_"))(datum, env)
        if head.name in self.model.defuns:
            return self._call(datum, env)
        param = self.model.params.get(head.name)
        if param is not None and param.is_module:
            if param.init.kind == "stack":
                raise SourceError(
                    head.span,
                    f"'{head.name}' is a stack: apply it with (chain {head.name} x)",
                )
            return self._invoke(
                Kind.SUBMODEL,
                head.name,
                self.program.models[param.init.model].defuns["forward"],
                datum,
                env,
            )
        if _is_public_op(head.name):
            return self.apply(REGISTRY[head.name], datum, env)
        public = [name for name in REGISTRY if _is_public_op(name)]
        known = [*public, *SPECIAL_FORMS, *self.model.defuns, *self.model.params]
        hint = f": {HINTS[head.name]}" if head.name in HINTS else None
        raise SourceError(
            head.span,
            f"unknown op or function '{head.name}'{hint or _suggest(head.name, known)}",
        )

    def _let(self, datum: List, env: dict, tail=None) -> Operand:
        """`tail(form, env)` traces the last form of the body, where it is not a value."""
        if len(datum.items) < 3 or not isinstance(datum.items[1], List):
            raise SourceError(datum.span, "expected (let ((NAME EXPR) ...) BODY ...)")
        env = dict(env)
        for binding in datum.items[1].items:
            target, value = _binding(binding, destructure=True)
            if isinstance(target, Vector):
                operands = self.form(value, env) if isinstance(value, List) else None
                if not (
                    isinstance(operands, tuple) and len(operands) == len(target.items)
                ):
                    raise SourceError(
                        value.span,
                        f"expected a for with {len(target.items)} carried values to bind to {shown(target)}",
                    )
                env.update((s.name, o) for s, o in zip(target.items, operands))
                continue
            operand = self.expr(value, env)
            if isinstance(operand, Node) and operand.name is None:
                operand.name = target.name
            env[target.name] = operand
        *forms, last = datum.items[2:]
        self._body(tuple(forms), env)
        return (tail or self.expr)(last, env)

    def _body(self, forms: tuple, env: dict) -> Operand:
        result = None
        for form in forms:
            result = self.expr(form, env)
        return result

    def _with_numerics(self, datum: List, env: dict) -> Operand:
        if len(datum.items) < 3 or not isinstance(datum.items[1], List):
            raise SourceError(
                datum.span,
                "expected (with-numerics (:sensitivity :high) BODY ...) or (with-numerics (:precision :bf16) BODY ...)",
            )
        options = datum.items[1].items
        allowed = {"sensitivity": ("high", ISLAND), "precision": ("bf16", REGION)}
        if (
            len(options) != 2
            or not isinstance(options[0], Keyword)
            or options[0].name not in allowed
        ):
            raise SourceError(
                datum.items[1].span,
                "expected one option, (:sensitivity :high) or (:precision :bf16)",
            )
        key, value = options
        wanted, mode = allowed[key.name]
        if not (isinstance(value, Keyword) and value.name == wanted):
            raise SourceError(
                value.span, f":{key.name} must be :{wanted}, got {shown(value)}"
            )
        frame = Frame(mode, echo(datum, body=False), datum.span)
        if _wraps_gradient(datum):
            with self._stamp(frame):
                return self._body(datum.items[2:], env)
        with self._frame(frame):
            return self._body(datum.items[2:], env)

    @contextmanager
    def _stamp(self, frame: Frame):
        """A with-numerics form whose body is a gradient marks only what the gradient appends."""
        outer = self.stamps
        self.stamps = outer + (frame,)
        try:
            yield
        finally:
            self.stamps = outer

    def _cast(self, datum: List, env: dict) -> Operand:
        if len(datum.items) != 3:
            raise SourceError(
                datum.span,
                "wrong number of arguments: expected (cast X :f32) or (cast X :bf16)",
            )
        value, dtype = datum.items[1:]
        if not (isinstance(dtype, Keyword) and dtype.name in ("f32", "bf16")):
            raise SourceError(
                dtype.span, f"cast takes :f32 or :bf16, got {shown(dtype)}"
            )
        operand = self.expr(value, env)
        outer, self.datum = self.datum, datum
        try:
            return self.cast(operand, dtype.name)
        finally:
            self.datum = outer

    def _gradient(self, datum: List, env: dict) -> Operand:
        return gradient.run(self, datum, env)

    @contextmanager
    def inlining(self):
        """Defun calls traced now are traced in place, so that a gradient can see inside them."""
        outer, self.inline = self.inline, True
        try:
            yield
        finally:
            self.inline = outer

    def _inline_model(
        self, param: str, callee: Defun, inputs: list, keys: dict
    ) -> Operand:
        """A sub-model's forward traced in place: its parameters and consts are read through it."""
        outer = self.model, self.via
        self.via = self.via + ((self.model.name, param),)
        self.model = self.program.models[self.model.params[param].init.model]
        try:
            return self._inline(callee, inputs, keys)
        finally:
            self.model, self.via = outer

    def _inline(self, callee: Defun, inputs: list, keys: dict) -> Operand:
        scope = (self.model.name, self.via, self.frames, self.stamps, id(self.nodes))
        key = (callee.name, tuple(inputs), tuple(sorted(keys.items())), scope)
        if key not in self.inlined:
            self.inlined[key] = self._traced_in_place(callee, inputs, keys)
        return self.inlined[key]

    def _traced_in_place(self, callee: Defun, inputs: list, keys: dict) -> Operand:
        outer_keys = self.keys
        self.keys = {
            symbol.name: keys.get(symbol.name) or scalars.evaluate(default, self._const)
            for symbol, default in callee.keys
        }
        try:
            return self._body(
                callee.body,
                {symbol.name: value for symbol, value in zip(callee.args, inputs)},
            )
        finally:
            self.keys = outer_keys

    def _chain(self, datum: List, env: dict) -> Operand:
        if len(datum.items) < 3 or not isinstance(datum.items[1], Symbol):
            raise SourceError(datum.span, "expected (chain LAYERS X ARG ...)")
        layers = datum.items[1]
        param = self.model.params.get(layers.name)
        if param is None or param.init.kind != "stack":
            raise SourceError(
                layers.span, f"'{layers.name}' is not a stack of sub-models"
            )
        forward = self.program.models[param.init.model].defuns["forward"]
        inner = List(datum.items[1:], datum.span)
        (x, *rest), keys = self._arguments(forward, inner, env)

        def body(loop: Node, carried: list) -> list:
            attrs = {"target": layers.name, "keys": keys, "loop": loop}
            call = Node(
                Kind.SUBMODEL,
                None,
                (carried[0], *rest),
                attrs,
                datum.span,
                datum,
                self.frames,
            )
            return [self._add(call)]

        (result,) = self._loop(datum, layers.name, None, "layer", [(None, x)], body)
        return result

    def _loop(
        self,
        datum: List,
        stack: str,
        index: Optional[str],
        layer: str,
        carried: list,
        body,
    ) -> list:
        """A FOR node over the layers of `stack`, carrying values named and started as in
        `carried` [(name, operand)]; `body(node, carried inputs)` traces one iteration and
        gives the carried values' next values. Returns one ITEM node per carried value.
        """
        inputs = [
            Node(Kind.INPUT, None, (), {}, datum.span, datum, name=name)
            for name, _ in carried
        ]
        region = Region(inputs)
        attrs = {"stack": stack, "index": index, "layer": layer}
        node = Node(
            Kind.FOR,
            None,
            tuple(operand for _, operand in carried),
            attrs,
            datum.span,
            datum,
            self.frames,
            regions=(region,),
        )
        with self._region(region):
            region.outputs = body(node, inputs)
        self._add(node)
        return [
            self._add(
                Node(
                    Kind.ITEM,
                    None,
                    (node,),
                    {"index": k},
                    datum.span,
                    datum,
                    self.frames,
                )
            )
            for k in range(len(carried))
        ]

    def _for(self, datum: List, env: dict) -> Operand:
        """(for (I LAYER STACK) ((NAME INIT) ...) BODY ...): BODY's value is the carried
        value's next one, or a vector of them, [a b], when several are carried."""
        usage = "expected (for (I LAYER STACK) ((NAME INIT) ...) BODY ...)"
        items = datum.items
        if len(items) < 4 or not isinstance(items[1], List):
            raise SourceError(datum.span, usage)
        header = items[1].items
        if len(header) not in (2, 3) or not all(isinstance(h, Symbol) for h in header):
            raise SourceError(
                items[1].span, "expected (I LAYER STACK) or (LAYER STACK)"
            )
        *names, stack = header
        index, layer = (None, *names) if len(names) == 1 else names
        param = self.model.params.get(stack.name)
        if param is None or param.init.kind != "stack":
            raise SourceError(
                stack.span, f"'{stack.name}' is not a stack of sub-models"
            )
        if not isinstance(items[2], List) or not items[2].items:
            raise SourceError(
                items[2].span, "expected the carried values, ((NAME INIT) ...)"
            )
        carried = [
            (symbol.name, self._tensor(value, env, "a carried value"))
            for symbol, value in map(_binding, items[2].items)
        ]

        def body(loop: Node, inputs: list) -> list:
            inner = dict(env)
            inner.update(zip((name for name, _ in carried), inputs))
            inner[layer.name] = Layer(stack.name, loop)
            if index is not None:
                inner[index.name] = Scalar("index", (loop,), 0)
            *forms, last = items[3:]
            self._body(tuple(forms), inner)
            return next_values(last, inner)

        def next_values(last: Datum, inner: dict) -> list:
            if len(carried) == 1:
                return [self._tensor(last, inner, "the next carried value")]
            if _head(last) == "let":
                return self._let(last, inner, tail=next_values)
            if not (isinstance(last, Vector) and len(last.items) == len(carried)):
                raise SourceError(
                    last.span,
                    f"the body must end with a vector of the {len(carried)} carried values' next values",
                )
            return [
                self._tensor(i, inner, "the next carried value") for i in last.items
            ]

        results = self._loop(
            datum, stack.name, index and index.name, layer.name, carried, body
        )
        for (name, _), item in zip(carried, results):
            item.name = name
        return results[0] if len(results) == 1 else tuple(results)

    def _tensor(self, datum: Datum, env: dict, what: str) -> Node:
        operand = self.expr(datum, env)
        if not isinstance(operand, Node):
            raise SourceError(datum.span, f"{what} must be a tensor, got a number")
        return operand

    def _if(self, datum: List, env: dict) -> Operand:
        """(if COND THEN ELSE), COND known when the module runs: both branches are compiled."""
        if len(datum.items) != 4:
            raise SourceError(datum.span, "expected (if CONDITION THEN ELSE)")
        condition = self.expr(datum.items[1], env)
        if not isinstance(condition, Scalar):
            raise SourceError(
                datum.items[1].span,
                "if needs a condition known when the module runs (consts, &key arguments, "
                "the layer index); to choose between tensors elementwise, use (where C X Y)",
            )
        if condition.op == "lit":  # written in the source: nothing a caller can change
            return self.expr(datum.items[2 if condition.value else 3], env)
        regions = (Region([]), Region([]))
        values = []
        for region, branch in zip(regions, datum.items[2:]):
            with self._region(region):
                values.append(self.expr(branch, env))
            region.outputs = [values[-1]]
        if all(isinstance(v, Scalar) for v in values):
            return scalars.choose(condition, *values, datum.span)
        node = Node(
            Kind.IF, None, (), {"condition": condition}, datum.span, datum, self.frames
        )
        node.regions = regions
        return self._add(node)

    def _not(self, datum: List, env: dict) -> Scalar:
        if len(datum.items) != 2:
            raise SourceError(datum.span, "expected (not CONDITION)")
        return scalars.logic("not", [self._scalar(datum.items[1], env)], datum.span)

    def _and(self, datum: List, env: dict) -> Scalar:
        return self._logic("and", datum, env)

    def _or(self, datum: List, env: dict) -> Scalar:
        return self._logic("or", datum, env)

    def _logic(self, op: str, datum: List, env: dict) -> Scalar:
        if len(datum.items) < 3:
            raise SourceError(datum.span, f"expected ({op} CONDITION CONDITION ...)")
        operands = [self._scalar(item, env) for item in datum.items[1:]]
        return scalars.logic(op, operands, datum.span)

    def _in(self, datum: List, env: dict) -> Scalar:
        items = datum.items
        if len(items) != 3 or not isinstance(items[2], Vector):
            raise SourceError(datum.span, "expected (in X [A B ...])")
        options = tuple(self._scalar(item, env) for item in items[2].items)
        return scalars.member(self._scalar(items[1], env), options)

    def _call(self, datum: List, env: dict) -> Operand:
        callee = self.model.defuns[datum.items[0].name]
        return self._invoke(Kind.CALL, callee.name, callee, datum, env)

    def _invoke(
        self, kind: Kind, target: str, callee: Defun, datum: List, env: dict, loop=None
    ) -> Node:
        """A call of a defun, or of a sub-model's forward (of a stack's layer in a loop)."""
        inputs, keys = self._arguments(callee, datum, env)
        if self.inline and kind is Kind.CALL:
            return self._inline(callee, inputs, keys)
        if self.inline and kind is Kind.SUBMODEL:
            return self._inline_model(target, callee, inputs, keys)
        attrs = {"target": target, "keys": keys}
        if loop is not None:
            attrs["loop"] = loop
        return self._add(
            Node(kind, None, tuple(inputs), attrs, datum.span, datum, self.frames)
        )

    def _arguments(self, callee: Defun, datum: List, env: dict) -> tuple:
        positional, keywords = _split(datum.items[1:])
        if len(positional) != len(callee.args):
            usage = " ".join([datum.items[0].name] + [a.name for a in callee.args])
            raise SourceError(
                datum.span,
                f"wrong number of arguments: expected ({usage}), got {len(positional)}",
            )
        inputs = []
        for item in positional:
            operand = self.expr(item, env)
            if isinstance(operand, Scalar):
                raise SourceError(
                    item.span, "pass numbers to a defun as &key arguments"
                )
            inputs.append(operand)
        allowed = {symbol.name for symbol, _ in callee.keys}
        keys = {}
        for key, value in keywords:
            if key.name not in allowed:
                raise _unknown_keyword(key, callee.name, sorted(allowed))
            if key.name in keys:
                raise SourceError(key.span, f":{key.name} given twice")
            keys[key.name] = self._scalar(value, env)
        return inputs, keys

    def _scalar(self, datum: Datum, env: dict) -> Scalar:
        operand = self.expr(datum, env)
        if not isinstance(operand, Scalar):
            raise SourceError(
                datum.span, "expected a number known at compile time, got a tensor"
            )
        return operand

    # Ops.

    def apply(self, op: Op, datum: List, env: dict) -> Operand:
        positional, keywords = _split(datum.items[1:])
        least, most = op.bounds
        if len(positional) < least or (most is not None and len(positional) > most):
            raise SourceError(
                datum.span,
                f"wrong number of arguments: expected {_usage(op)}, got {len(positional)}",
            )
        inputs, attrs = [], {}
        for index, item in enumerate(positional):
            spec = op.args[min(index, len(op.args) - 1)]
            value = self._argument(spec, item, env, f"{op.name}'s {spec.name}")
            if spec.kind in TENSOR_KINDS:
                inputs.append(value)
            elif spec.kind == "tensors":
                inputs.extend(value)
            else:
                attrs[spec.name] = value
        given = {}
        for key, value in keywords:
            spec = op.key(key.name)
            if spec is None:
                raise _unknown_keyword(key, op.name, [k.name for k in op.keys])
            if key.name in given:
                raise SourceError(key.span, f":{key.name} given twice")
            given[key.name] = self._argument(spec, value, env, f":{key.name}")
        for spec in op.keys:
            attrs[spec.name] = given.get(spec.name, _default(spec.default))
        if (
            op.result == "bool"
            and inputs
            and all(isinstance(i, Scalar) for i in inputs)
        ):
            return scalars.compare(op.name, *inputs, datum.span)
        if (
            op.result != "arith"
            and inputs
            and all(isinstance(i, Scalar) for i in inputs)
        ):
            raise SourceError(
                datum.span,
                f"'{op.name}' needs a tensor argument, got only numbers known at compile time",
            )
        outer, self.datum = self.datum, datum
        try:
            return (
                self._fold_left(op, inputs, attrs)
                if op.folds
                else self.op(op.name, inputs, **attrs)
            )
        finally:
            self.datum = outer

    def _fold_left(self, op: Op, inputs: list, attrs: dict) -> Operand:
        result = inputs[0]
        for operand in inputs[1:]:
            result = self.op(op.name, [result, operand], **attrs)
        return result

    def _argument(self, spec, item: Datum, env: dict, what: str):
        value = self._value_of(spec.kind, item, env, what)
        scalars_given = value if isinstance(value, tuple) else (value,)
        if spec.static and any(
            isinstance(s, Scalar) and s.op != "lit" for s in scalars_given
        ):
            literal = "true or false" if spec.kind == "bool" else "numbers"
            raise SourceError(
                item.span,
                f"{what} must be written as {literal}: it decides the result's shape, "
                "and the caller can change a const or a &key argument",
            )
        return value

    def _value_of(self, kind: str, item: Datum, env: dict, what: str):
        if kind in TENSOR_KINDS:
            return self.expr(item, env)
        if kind == "tensors":
            if not isinstance(item, Vector) or not item.items:
                raise SourceError(
                    item.span, f"{what} must be a vector of tensors, such as [x y]"
                )
            return [self.expr(i, env) for i in item.items]
        if kind == "ints":
            if not isinstance(item, Vector):
                raise SourceError(
                    item.span, f"{what} must be a vector of integers, such as [0 -1]"
                )
            return tuple(
                scalars.expect_int(self._scalar(i, env), i.span, f"each of {what}")
                for i in item.items
            )
        if kind == "out":
            if not (isinstance(item, Keyword) and item.name == "f32"):
                raise SourceError(item.span, f"{what} must be :f32, got {shown(item)}")
            return "f32"
        if kind == "reduction":
            if not (isinstance(item, Keyword) and item.name in ("mean", "sum", "none")):
                raise SourceError(
                    item.span, f"{what} must be :mean, :sum or :none, got {shown(item)}"
                )
            return item.name
        if kind in SCALAR_KINDS and isinstance(item, (String, Vector, Keyword)):
            raise SourceError(
                item.span,
                f"{what} must be {SCALAR_KINDS[kind]} known at compile time "
                f"(a literal, a const or a &key argument), got {shown(item)}",
            )
        value = self._scalar(item, env)
        if kind == "int":
            return scalars.expect_int(value, item.span, what)
        if kind == "bool" and not isinstance(value.value, bool):
            raise SourceError(item.span, f"{what} must be true or false")
        if kind == "number" and (isinstance(value.value, (bool, str))):
            raise SourceError(item.span, f"{what} must be a number")
        return value


def _wraps_gradient(datum: List) -> bool:
    """`(with-numerics OPTIONS (gradient ...))`, possibly through more with-numerics forms."""
    body = datum.items[2:]
    if len(body) != 1 or not isinstance(body[0], List) or not body[0].items:
        return False
    head = body[0].items[0]
    if not isinstance(head, Symbol):
        return False
    return head.name == "gradient" or (
        head.name == "with-numerics"
        and len(body[0].items) > 2
        and _wraps_gradient(body[0])
    )


def _mark(mode: str, datum: Datum) -> Frame:
    """The frame of a library op's mark: its whole form is the comment."""
    return Frame(mode, echo(datum), datum.span, library=True)


@dataclass(frozen=True)
class Layer:
    """What a `for` binds its layer's name to: called, it runs the layer's forward."""

    stack: str
    loop: Node


def _binding(datum: Datum, destructure: bool = False) -> tuple:
    """(NAME EXPR), or ([NAME ...] EXPR) where several values are bound at once."""
    names = (Symbol, Vector) if destructure else Symbol
    if not (
        isinstance(datum, List)
        and len(datum.items) == 2
        and isinstance(datum.items[0], names)
        and all(isinstance(i, Symbol) for i in getattr(datum.items[0], "items", ()))
    ):
        raise SourceError(datum.span, "expected a binding (NAME EXPR)")
    return tuple(datum.items)


def _head(datum: Datum) -> Optional[str]:
    if isinstance(datum, List) and datum.items and isinstance(datum.items[0], Symbol):
        return datum.items[0].name
    return None


def _keep(nodes: list, live: set) -> None:
    """Drop the nodes that are not live, in regions too."""
    nodes[:] = [n for n in nodes if n in live]
    for node in nodes:
        for region in node.regions:
            _keep(region.nodes, live)


def _is_public_op(name: str) -> bool:
    return name in REGISTRY and not REGISTRY[name].internal


def _unknown_keyword(key: Keyword, owner: str, known: list) -> SourceError:
    close = difflib.get_close_matches(key.name, known, n=1, cutoff=0.75)
    hint = f": did you mean :{close[0]}?" if close else ""
    listed = ", ".join(f":{k}" for k in known) or "none"
    return SourceError(
        key.span, f"unknown keyword :{key.name} for '{owner}'{hint} (known: {listed})"
    )


def _split(items: tuple) -> tuple:
    """Positional arguments, then `:key value` pairs."""
    for index, item in enumerate(items):
        if isinstance(item, Keyword):
            rest = items[index:]
            for at in range(0, len(rest), 2):
                if not isinstance(rest[at], Keyword):
                    raise SourceError(
                        rest[at].span,
                        "expected a keyword: positional arguments come before keywords",
                    )
                if at + 1 == len(rest):
                    raise SourceError(
                        rest[at].span, f"keyword :{rest[at].name} without a value"
                    )
            return items[:index], list(zip(rest[::2], rest[1::2]))
    return items, []


def _default(value):
    if value is None or isinstance(value, bool):
        return Scalar.lit(value) if isinstance(value, bool) else None
    if isinstance(value, tuple):
        return tuple(Scalar.lit(v) for v in value)
    return Scalar.lit(value)


def _usage(op: Op) -> str:
    args = " ".join(a.name.upper() for a in op.args)
    if op.bounds[1] is None:
        args += " ..."
    keys = " ".join(f":{k.name}" for k in op.keys)
    return f"({op.name} {args}{' &key ' + keys if keys else ''})"
