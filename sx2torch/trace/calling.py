"""Calls while tracing: a defun's, a sub-model's forward, a stack's layer's. Their arguments
are checked against the callee's signature; under `gradient` they are traced in place, so
the backward can see into them, else each is one CALL or SUBMODEL node.

`Caller` is the tracer's part that follows calls and gives a defun's values; the tracer
(sx2torch/trace/__init__.py) holds one, given the tracer and the tracer's builder.
"""

from __future__ import annotations

from contextlib import contextmanager

from sx2torch.syntax import scalars
import sx2torch.trace.calls as calls
from sx2torch.syntax import keywords as keyword_args
from sx2torch.ops.builder import Builder
from sx2torch.errors import SourceError, Span
from sx2torch.ir import Kind, Node, Operand, Region, Scalar
from sx2torch.syntax.scalars import ScalarOp
from sx2torch.syntax.echo import echo
from sx2torch.syntax.read import Boolean, Datum, Keyword, List, Number, Symbol, Vector
from sx2torch.trace.forms import head_name, let
from sx2torch.syntax.program import Defun


class _Items:
    """The calls of a sequential's, a module-list's or a choice's items (Caller's part)."""

    def submodel(self, target: str, datum: List, env: dict) -> Operand:
        """`(NAME X ...)` of a sub-model parameter that is no stack: its forward; a
        sequential's items' forwards in order; a choice's as an `if` on its condition.
        """
        t = self.tracer
        init = t.model.params[target].init
        forwards = [t.program.models[i.model].defuns["forward"] for i in init.instances]
        if init.kind == "model":
            return self.invoke(Kind.SUBMODEL, target, forwards[0], datum, env)
        if init.kind == "module-list":
            raise SourceError(
                datum.items[0].span,
                f"'{target}' is a module-list: call one of its items, as (nth {target} 0 x)",
            )
        if init.kind == "sequential":
            return self._sequence(target, forwards, datum, env)
        return self._choice(target, init, forwards, datum, env)

    def _sequence(self, target: str, forwards: list, datum: List, env: dict):
        """nn.Sequential's forward: each item's on the value before, one tensor each."""
        for k, forward in enumerate(forwards):
            if len(forward.args) != 1 or forward.arity != 1:
                raise SourceError(
                    datum.items[0].span,
                    f"item {k} of the sequential '{target}' takes {len(forward.args)} "
                    f"arguments and gives {forward.arity} values: each item of a "
                    "sequential takes one tensor and gives one",
                )
        if len(datum.items) != 2:
            raise SourceError(
                datum.span, f"a sequential takes one tensor, as ({target} x)"
            )
        x = self.tracer.tensor(datum.items[1], env, f"the input of '{target}'")
        for k, forward in enumerate(forwards):
            x = self.called(Kind.SUBMODEL, target, forward, [x], {}, datum, item=k)
            x.attrs["sequence"] = len(forwards)  # emit writes the whole run as one call
        return x

    def _choice(self, target: str, init, forwards: list, datum: List, env: dict):
        """Each item's forward in a branch of an `if` on the choice's condition, which
        chooses as the constructor chose the instance."""
        t = self.tracer
        condition = t.scalar(init.args["condition"], {})
        datum, env = self._arguments_first(datum, env)
        regions = (Region([]), Region([]))
        for k, (region, forward) in enumerate(zip(regions, forwards)):
            with self.builder.region(region):
                inputs, keys = self.arguments(forward, datum, env)
                value = self.called(
                    Kind.SUBMODEL,
                    target,
                    forward,
                    inputs,
                    keys,
                    datum,
                    item=k,
                    choice=True,
                )
            if isinstance(value, tuple):
                raise SourceError(
                    datum.items[0].span,
                    f"the items of the choice '{target}' give several values: a choice's "
                    "forwards give one",
                )
            region.outputs = [value]
        attrs = {"condition": condition, "choice": target}  # emit writes one call
        node = Node(Kind.IF, None, (), attrs, datum.span, datum, self.builder.frames)
        node.regions = regions
        return self.builder.add(node)

    def _arguments_first(self, datum: List, env: dict) -> tuple:
        """`datum` and `env` where each positional argument that computes is traced
        before the branches that both pass it, and passed as a name bound to its value.
        """
        env, items = dict(env), list(datum.items)
        for k, item in enumerate(items[1:], 1):
            if isinstance(item, Keyword):
                break
            if isinstance(item, List):
                name = f" argument {k}"  # no symbol has a space: no name is shadowed
                env[name] = self.tracer.expr(item, env)
                items[k] = Symbol(name, item.span)
        return List(tuple(items), datum.span), env

    def item(self, target: str, index: Scalar, datum: List, env: dict) -> Operand:
        """`(nth LIST I X ...)` of a sequential or module-list: item I's forward, I a
        literal (the items are of different models)."""
        init = self.tracer.model.params[target].init
        at = datum.items[2]
        if index.op is not ScalarOp.LIT or not isinstance(index.value, int):
            raise SourceError(
                at.span,
                f"the items of '{target}' are of different models: nth takes an index "
                "written as an integer here",
            )
        count = len(init.items)
        if not -count <= index.value < count:
            raise SourceError(
                at.span,
                f"index {index.value} is out of range for '{target}', of {count} items",
            )
        k = index.value % count
        forward = self.tracer.program.models[init.items[k].model].defuns["forward"]
        inner = List((datum.items[1], *datum.items[3:]), datum.span)
        inputs, keys = self.arguments(forward, inner, env)
        return self.called(Kind.SUBMODEL, target, forward, inputs, keys, datum, item=k)


class Caller(_Items):
    """Follows the calls of the defun `tracer` traces, making their nodes with `builder`.
    From the tracer it takes `expr`, `body`, `tensor`, `scalar` and `const`, and the scope it
    traces in (`model`, `via`, `loop`, `keys`), which a callee traced in place changes while
    it is traced."""

    def __init__(self, tracer, builder: Builder, defun: tuple):
        self.tracer = tracer
        self.builder = builder
        # (what, inputs, keys, scope) -> the value of a call traced in place, which a second
        # such call reuses, so a call DAG under `gradient` traces in time linear in its size
        self.inlined: dict = {}
        self.inline = False
        # (model, defun) of the defuns being traced, in place or not
        self.path = [defun]

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
        t = self.tracer
        outer = t.model, t.via
        t.via = t.via + ((t.model.name, param),)
        t.model = t.program.models[t.model.params[param].init.model]
        try:
            return self._inline(callee, inputs, keys, span)
        finally:
            t.model, t.via = outer

    def _inline_layer(
        self, loop: Node, stack: str, callee: Defun, inputs: list, keys: dict, span
    ) -> Operand:
        """A loop's layer's forward traced in place: its parameters are read through the
        loop's layer."""
        t = self.tracer
        outer = t.model, t.via, t.loop
        t.model = t.program.models[t.model.params[stack].init.model]
        t.via, t.loop = (), loop
        try:
            return self._inline(callee, inputs, keys, span)
        finally:
            t.model, t.via, t.loop = outer

    def _inline(self, callee: Defun, inputs: list, keys: dict, span: Span) -> Operand:
        t, b = self.tracer, self.builder
        scope = (t.model.name, t.via, t.loop, b.frames, b.stamps, b.block)
        key = (callee.name, tuple(inputs), tuple(sorted(keys.items())), scope)
        if key not in self.inlined:
            defun = (t.model.name, callee.name)
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
        t = self.tracer
        outer_keys = t.keys
        t.keys = {
            symbol.name: keys.get(symbol.name) or scalars.evaluate(default, t.const)
            for symbol, default in callee.keys
        }
        try:
            return self.returned(
                callee.body,
                {symbol.name: value for symbol, value in zip(callee.args, inputs)},
            )
        finally:
            t.keys = outer_keys

    def returned(self, forms: tuple, env: dict):
        """A defun's value: its last form's, or a tuple of tensors where that is a vector
        `[A B]`, possibly at the end of a `let` or a `with-numerics`."""
        t = self.tracer
        *before, last = forms
        t.body(tuple(before), env)
        if isinstance(last, Vector):
            if len(last.items) < 2:
                raise SourceError(
                    last.span, "a defun returns a vector of two or more values"
                )
            return tuple(t.tensor(i, env, "a returned value") for i in last.items)
        if head_name(last) == "let":
            return let(t, last, env, lambda d, e: self.returned((d,), e))
        if head_name(last) == "with-numerics":  # whose own last vector gives several
            return t.form(last, env)
        return t.expr(last, env)

    def call(self, datum: List, env: dict) -> Operand:
        callee = self.tracer.model.defuns[datum.items[0].name]
        return self.invoke(Kind.CALL, callee.name, callee, datum, env)

    def invoke(
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
        item=None,
        choice=False,
    ) -> Operand:
        """A call of a defun, or of a sub-model's forward (of a stack's layer in a loop, of
        a list's or a choice's item `item`), its arguments traced: in place under
        `gradient`, else a node."""
        span = calls.head(datum)
        if self.inline and kind is Kind.CALL:
            return self._inline(callee, inputs, keys, span)
        if self.inline and item is not None:
            raise SourceError(
                span,
                f"gradient through an item of '{target}', a list or choice of sub-models, "
                "is not supported yet",
            )
        if self.inline and loop is None:
            return self._inline_model(target, callee, inputs, keys, span)
        if self.inline:
            return self._inline_layer(loop, target, callee, inputs, keys, span)
        attrs = {"target": target, "keys": keys}
        if loop is not None:
            attrs["loop"] = loop
        if item is not None:
            attrs["item"] = item
        if choice:  # the instance itself, not an item of a list it holds
            attrs["choice"] = True
        b = self.builder
        node = b.add(
            Node(kind, None, tuple(inputs), attrs, datum.span, datum, b.frames)
        )
        return node if callee.arity == 1 else tuple(b.items(node, callee.arity))

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
            operand = self.tracer.expr(item, env)
            if isinstance(operand, Scalar):
                raise SourceError(
                    item.span, "pass numbers to a defun as &key arguments"
                )
            inputs.append(operand)
        keys = {key: self.tracer.scalar(value, env) for key, value in keywords.items()}
        defaults = {symbol.name: default for symbol, default in callee.keys}
        for key, value in keys.items():
            listed = _lists(defaults[key])
            if listed is not None and listed != isinstance(value.value, tuple):
                what = "a list" if listed else "not a list"
                raise SourceError(
                    keywords[key].span,
                    f"{callee.name}'s :{key} is {what} (its default is "
                    f"{echo(defaults[key])}), got {echo(keywords[key])}",
                )
        return inputs, keys


def _lists(default: Datum):
    """Whether a &key's default is a list, where its form says so (not a const's name)."""
    if isinstance(default, Vector):
        return True
    if isinstance(default, (Number, Boolean, Keyword)):
        return False
    return None
