"""Pass 3, trace: each defun's body -> a Graph of nodes, before any dtype is known.

Names resolve here (locals, arguments, &key arguments, consts, params, sub-models, defuns,
ops); calls are checked against their defun's signature and ops against their registry
signature (sx2torch/arguments.py); special forms are traced by their handlers
(sx2torch/forms.py); nodes are made by the builder (sx2torch/builder.py), which stamps the
`with-numerics` frames on every node traced inside them.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Optional

from sx2torch import calls, scalars
from sx2torch.arguments import apply, split, unknown_keyword
from sx2torch.builder import Builder
from sx2torch.errors import SourceError, Span
from sx2torch.errors import suggest as _suggest
from sx2torch.forms import FORMS, Layer
from sx2torch.ir import Graph, Kind, Node, Operand, Scalar, reads
from sx2torch.ops import REGISTRY
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
from sx2torch.resolve import Defun, Model, Program

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
    calls.check(program, graphs)
    return graphs


class Tracer(Builder):
    """Traces one defun: names, calls (traced in place under `gradient`), forms and ops."""

    def __init__(self, program: Program, model: Model, defun: Defun):
        self.program = program
        self.model = model
        self.defun = defun
        self.param_reads: dict[tuple, Node] = {}
        # (what, inputs, keys, scope) -> the value of a call traced in place, which a second
        # such call reuses, so a call DAG under `gradient` traces in time linear in its size
        self.inlined: dict = {}
        self.via: (
            tuple
        ) = ()  # (model, sub-model param) pairs down to an inlined sub-model
        self.inline = False
        self.loop = None  # the FOR whose layer's forward is traced in place, if any
        self.path = [
            (model.name, defun.name)
        ]  # the defuns being traced, in place or not
        self.keys = {
            symbol.name: Scalar(
                "key",
                (symbol.name,),
                scalars.evaluate(default, model.lookup_const).value,
            )
            for symbol, default in defun.keys
        }
        key_defaults = [
            (symbol.name, scalars.evaluate(default, model.lookup_const))
            for symbol, default in defun.keys
        ]
        super().__init__(
            Graph(model.name, defun.name, [], key_defaults, defun.doc, span=defun.span)
        )

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
        member = self._member(symbol)
        if member is not None:
            return member
        known = [*env, *self.keys, *self.model.consts, *self.model.params]
        raise SourceError(
            symbol.span,
            f"unknown name '{name}': expected an argument, a let local, a const or a param{_suggest(name, known)}",
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
            block = self.loop.regions[0].nodes if self.loop else self.graph.nodes
            block.append(node)
            self.param_reads[key] = node
        return self.param_reads[key]

    def _member(self, symbol: Symbol) -> Optional[Node]:
        """`sub.weight`: a parameter of the sub-model instance `sub`, read as it is stored, as
        the real code's `F.embedding(ids, self.lm_head.weight)` reads a tied weight."""
        sub, _, name = symbol.name.partition(".")
        param = self.model.params.get(sub)
        if not (param and param.init.kind == "model"):
            return None
        inner = self.program.models[param.init.model].params.get(name)
        if inner is None or inner.is_module:
            return None
        outer = self.model, self.via
        self.via = self.via + ((self.model.name, sub),)
        self.model = self.program.models[param.init.model]
        try:
            return self.param_read(name, symbol)
        finally:
            self.model, self.via = outer

    def _const(self, name: str):
        """A const of the model being traced; inside an inlined sub-model, read through it."""
        scalar = self.model.lookup_const(name)
        if scalar is None or not (self.via or self.loop):
            return scalar
        through = (self.loop,) if self.loop else ()
        return Scalar(
            "const", (name, self.via, self.model.name, *through), scalar.value
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
            return self._invoke(
                Kind.SUBMODEL, layer.stack, forward, datum, env, layer.loop
            )
        if head.name in env or head.name in self.keys or head.name in self.model.consts:
            raise SourceError(head.span, f"'{head.name}' is a value, not a function")
        if head.name in FORMS:
            return FORMS[head.name](self, datum, env)
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
            return apply(self, REGISTRY[head.name], datum, env)
        public = [name for name in REGISTRY if _is_public_op(name)]
        known = [*public, *FORMS, *self.model.defuns, *self.model.params]
        hint = f": {HINTS[head.name]}" if head.name in HINTS else None
        raise SourceError(
            head.span,
            f"unknown op or function '{head.name}'{hint or _suggest(head.name, known)}",
        )

    def body(self, forms: tuple, env: dict) -> Operand:
        result = None
        for form in forms:
            result = self.expr(form, env)
        return result

    @contextmanager
    def inlining(self):
        """Defun calls traced now are traced in place, so that a gradient can see inside them."""
        outer, self.inline = self.inline, True
        try:
            yield
        finally:
            self.inline = outer

    def _inline_model(
        self, param: str, callee: Defun, inputs: list, keys: dict, span: Span
    ) -> Operand:
        """A sub-model's forward traced in place: its parameters and consts are read through it."""
        outer = self.model, self.via
        self.via = self.via + ((self.model.name, param),)
        self.model = self.program.models[self.model.params[param].init.model]
        try:
            return self._inline(callee, inputs, keys, span)
        finally:
            self.model, self.via = outer

    def _inline_layer(
        self, loop: Node, stack: str, callee: Defun, inputs: list, keys: dict, span
    ) -> Operand:
        """A loop's layer's forward traced in place: its parameters are read through the
        loop's layer."""
        outer = self.model, self.via, self.loop
        self.model = self.program.models[self.model.params[stack].init.model]
        self.via, self.loop = (), loop
        try:
            return self._inline(callee, inputs, keys, span)
        finally:
            self.model, self.via, self.loop = outer

    def _inline(self, callee: Defun, inputs: list, keys: dict, span: Span) -> Operand:
        scope = (
            self.model.name,
            self.via,
            self.loop,
            self.frames,
            self.stamps,
            id(self.nodes),
        )
        key = (callee.name, tuple(inputs), tuple(sorted(keys.items())), scope)
        if key not in self.inlined:
            defun = (self.model.name, callee.name)
            if defun in self.path:
                raise calls.recursion(self.path, defun, span)
            if len(self.path) >= calls.MAX_CALL_DEPTH:
                raise calls.too_deep(span)
            self.path.append(defun)
            try:
                self.inlined[key] = self._traced_in_place(callee, inputs, keys)
            finally:
                self.path.pop()
        return self.inlined[key]

    def _traced_in_place(self, callee: Defun, inputs: list, keys: dict) -> Operand:
        outer_keys = self.keys
        self.keys = {
            symbol.name: keys.get(symbol.name) or scalars.evaluate(default, self._const)
            for symbol, default in callee.keys
        }
        try:
            return self.body(
                callee.body,
                {symbol.name: value for symbol, value in zip(callee.args, inputs)},
            )
        finally:
            self.keys = outer_keys

    def _call(self, datum: List, env: dict) -> Operand:
        callee = self.model.defuns[datum.items[0].name]
        return self._invoke(Kind.CALL, callee.name, callee, datum, env)

    def _invoke(
        self, kind: Kind, target: str, callee: Defun, datum: List, env: dict, loop=None
    ) -> Operand:
        inputs, keys = self.arguments(callee, datum, env)
        return self.called(kind, target, callee, inputs, keys, datum, loop)

    def called(
        self,
        kind: Kind,
        target: str,
        callee: Defun,
        inputs: list,
        keys: dict,
        datum,
        loop=None,
    ) -> Operand:
        """A call of a defun, or of a sub-model's forward (of a stack's layer in a loop),
        its arguments traced: in place under `gradient`, else a node."""
        span = calls.head(datum)
        if self.inline and kind is Kind.CALL:
            return self._inline(callee, inputs, keys, span)
        if self.inline and loop is None:
            return self._inline_model(target, callee, inputs, keys, span)
        if self.inline:
            return self._inline_layer(loop, target, callee, inputs, keys, span)
        attrs = {"target": target, "keys": keys}
        if loop is not None:
            attrs["loop"] = loop
        return self.add(
            Node(kind, None, tuple(inputs), attrs, datum.span, datum, self.frames)
        )

    def arguments(self, callee: Defun, datum: List, env: dict) -> tuple:
        positional, keywords = split(datum.items[1:])
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
                raise unknown_keyword(key, callee.name, sorted(allowed))
            if key.name in keys:
                raise SourceError(key.span, f":{key.name} given twice")
            keys[key.name] = self.scalar(value, env)
        return inputs, keys

    def scalar(self, datum: Datum, env: dict) -> Scalar:
        operand = self.expr(datum, env)
        if not isinstance(operand, Scalar):
            raise SourceError(
                datum.span, "expected a number known at compile time, got a tensor"
            )
        return operand

    def tensor(self, datum: Datum, env: dict, what: str) -> Node:
        operand = self.expr(datum, env)
        if not isinstance(operand, Node):
            raise SourceError(datum.span, f"{what} must be a tensor, got a number")
        return operand


def _keep(nodes: list, live: set) -> None:
    """Drop the nodes that are not live, in regions too."""
    nodes[:] = [n for n in nodes if n in live]
    for node in nodes:
        for region in node.regions:
            _keep(region.nodes, live)


def _is_public_op(name: str) -> bool:
    return name in REGISTRY and not REGISTRY[name].internal
