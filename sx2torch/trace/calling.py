"""Calls while tracing: a defun's, a sub-model's forward, a stack's layer's. Their arguments
are checked against the callee's signature; under `gradient` they are traced in place, so
the backward can see into them, else each is one CALL or SUBMODEL node.

`Caller` is the part of the tracer that follows calls and gives a defun's values; the tracer
(sx2torch/trace/__init__.py) gives it `expr`, `body`, `tensor`, `scalar` and `_const`.
"""

from __future__ import annotations

from contextlib import contextmanager

from sx2torch.syntax import scalars
from sx2torch.trace import calls
from sx2torch.syntax import keywords as keyword_args
from sx2torch.trace.builder import Builder
from sx2torch.errors import SourceError, Span
from sx2torch.ir import Graph, Kind, Node, Operand, Scalar
from sx2torch.syntax.read import List, Vector
from sx2torch.trace.forms import head_name, let
from sx2torch.syntax.program import Defun


class Caller(Builder):
    def __init__(self, graph: Graph, defun: tuple):
        super().__init__(graph)
        # (what, inputs, keys, scope) -> the value of a call traced in place, which a second
        # such call reuses, so a call DAG under `gradient` traces in time linear in its size
        self.inlined: dict = {}
        # (model, sub-model param) pairs down to an inlined sub-model
        self.via: tuple = ()
        self.inline = False
        self.loop = None  # the FOR whose layer's forward is traced in place, if any
        self.path = [
            defun
        ]  # (model, defun) of the defuns being traced, in place or not

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
            self.block,
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
            return self.returned(
                callee.body,
                {symbol.name: value for symbol, value in zip(callee.args, inputs)},
            )
        finally:
            self.keys = outer_keys

    def returned(self, forms: tuple, env: dict):
        """A defun's value: its last form's, or a tuple of tensors where that is a vector
        `[A B]`, possibly at the end of a `let`."""
        *before, last = forms
        self.body(tuple(before), env)
        if isinstance(last, Vector):
            if len(last.items) < 2:
                raise SourceError(
                    last.span, "a defun returns a vector of two or more values"
                )
            return tuple(self.tensor(i, env, "a returned value") for i in last.items)
        if head_name(last) == "let":
            return let(self, last, env, lambda d, e: self.returned((d,), e))
        return self.expr(last, env)

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
        node = self.add(
            Node(kind, None, tuple(inputs), attrs, datum.span, datum, self.frames)
        )
        return node if callee.arity == 1 else tuple(self.items(node, callee.arity))

    def arguments(self, callee: Defun, datum: List, env: dict) -> tuple:
        allowed = sorted(symbol.name for symbol, _ in callee.keys)
        positional, keywords = keyword_args.split(
            datum.items[1:], keyword_args.call(callee.name, allowed)
        )
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
        keys = {key: self.scalar(value, env) for key, value in keywords.items()}
        return inputs, keys
