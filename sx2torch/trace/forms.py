"""The special forms' handlers: HANDLERS maps each form's name (syntax/names.py's FORMS, which
resolve reads: a defun may not take one) to its handler, which traces it with the tracer `t`.
Each handler's docstring or first diagnostic gives its syntax."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from sx2torch.syntax import scalars
from sx2torch.syntax.echo import echo
from sx2torch.syntax.forms import match
from sx2torch.errors import SourceError
from sx2torch.ir import (
    ISLAND,
    REGION,
    DType,
    Frame,
    Kind,
    Node,
    Operand,
    Region,
    Scalar,
    argument,
)
from sx2torch.syntax.read import Datum, Keyword, List, Symbol, Vector, shown
from sx2torch.syntax.program import LISTS
from sx2torch.syntax.scalars import ScalarOp


def let(t, datum: List, env: dict, tail=None) -> Operand:
    """`tail(form, env)` traces the last form of the body, where it is not a value."""
    bindings, *_ = match(datum).parts
    env = dict(env)
    for binding in bindings.items:
        target, value = _binding(binding, destructure=True)
        if isinstance(target, Vector):
            operands = t.form(value, env) if isinstance(value, List) else None
            if not (isinstance(operands, tuple) and len(operands) == len(target.items)):
                raise SourceError(
                    value.span,
                    f"expected a for or a call giving {len(target.items)} values to bind to {shown(target)}",
                )
            for symbol, operand in zip(target.items, operands):
                operand.name = operand.name or symbol.name  # a call's values' names
                env[symbol.name] = operand
            continue
        operand = t.expr(value, env)
        if isinstance(operand, Scalar) and operand.op not in scalars.LEAVES:
            if scalars.run_nodes(operand):
                operand = _run_number(t, value, operand, target.name)
            else:
                operand = scalars.bound(operand)
                t.builder.graph.lets.append((target.name, operand))
        _bind(env, target.name, operand)
    *forms, last = datum.items[2:]
    t.body(tuple(forms), env)
    return (tail or t.expr)(last, env)


def _run_number(t, datum: Datum, number: Scalar, name: str) -> Scalar:
    """A number the module computes when it runs (arithmetic on sizes) that a `let`
    names: a statement of its own, `m = n - 2`, read by name, so that each step of a
    chain of lets is one step deep wherever it is read or written."""
    outer, t.builder.datum = t.builder.datum, datum
    try:
        node = t.builder.op("run-number", [number])
    finally:
        t.builder.datum = outer
    node.name = name
    return Scalar.run(node)


def _bind(env: dict, name: str, operand: Operand) -> None:
    if isinstance(operand, Node) and operand.name is None:
        operand.name = name
    elif isinstance(operand, Node) and name not in (operand.name, *operand.aliases):
        operand.aliases += (name,)  # a name bound to another name
    env[name] = operand


def with_numerics(t, datum: List, env: dict) -> Operand:
    options = match(datum).parts[0].items
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
        with t.builder.stamp(frame):
            return t.body(datum.items[2:], env)
    with t.builder.frame(
        frame
    ):  # a last vector [a b] gives several values, as a defun's
        return t.caller.returned(datum.items[2:], env)


def cast(t, datum: List, env: dict) -> Operand:
    value, dtype = match(datum).parts
    operand = t.expr(value, env)
    if dtype.name == "bool" and isinstance(operand, Scalar):
        raise SourceError(value.span, "cast to :bool takes a tensor, got a number")
    outer, t.builder.datum = t.builder.datum, datum
    try:
        if dtype.name in ("f32", "bf16"):
            return t.builder.cast(operand, DType(dtype.name))
        # integers and booleans are ops (the policy never rounds them): int's truncation
        if dtype.name == "bool":
            return t.builder.op("cast-bool", [operand])
        return t.builder.op("int", [operand], bits=Scalar.lit(CASTS[dtype.name]))
    finally:
        t.builder.datum = outer


# the dtypes a cast makes, and an integer's bits
CASTS = {"f32": None, "bf16": None, "i64": 64, "i32": 32, "bool": None}


def gradient_(t, datum: List, env: dict) -> Node:
    """(gradient Y X): a GRADIENT node reading Y and X, for the gradient pass to expand
    (sx2torch/gradient/). Y is traced with its calls in place, so that the pass sees into
    them, and without the marks of the with-numerics forms wrapped directly around the
    form: those mark only the backward, so the node keeps them."""
    y_form, x_form = match(datum).parts
    x = t.name(x_form, env)
    if not isinstance(x, Node):
        raise SourceError(
            x_form.span, f"'{x_form.name}' is a number; gradient needs a tensor"
        )
    marks, t.builder.stamps = t.builder.stamps, ()
    try:
        with t.caller.inlining():
            y = t.expr(y_form, env)
    finally:
        t.builder.stamps = marks
    attrs = {"marks": marks}
    return t.builder.add(
        Node(Kind.GRADIENT, None, (y, x), attrs, datum.span, datum, t.builder.frames)
    )


def _stack(t, datum: List) -> tuple:
    """The stack a `chain` or `nth` form names, and its layers' forward."""
    layers, _ = match(datum).parts
    param = _expect_stack(t, layers)
    forward = t.program.models[param.init.model].defuns["forward"]
    if forward.arity > 1:
        raise SourceError(
            datum.span,
            f"the layers of '{layers.name}' give {forward.arity} values: call them "
            "in a for, (let (([a b] (layer x))) ...)",
        )
    return layers, forward


def _expect_stack(t, named: Symbol):
    """The stack parameter `named` names."""
    param = t.model.params.get(named.name)
    if param is not None and param.init.kind in LISTS:
        call = f"({named.name} x), or " if param.init.kind == "sequential" else ""
        raise SourceError(
            named.span,
            f"'{named.name}' is a {param.init.kind} of different models, not a stack: "
            f"call {call}one item, as (nth {named.name} 0 x)",
        )
    if param is None or param.init.kind != "stack":
        raise SourceError(named.span, f"'{named.name}' is not a stack of sub-models")
    return param


def chain(t, datum: List, env: dict) -> Operand:
    layers, forward = _stack(t, datum)
    inner = List(datum.items[1:], datum.span)
    (x, *rest), keys = t.caller.arguments(forward, inner, env)

    def body(loop: Node, carried: list) -> list:
        inputs = [carried[0], *rest]
        return [
            t.caller.called(
                Kind.SUBMODEL, layers.name, forward, inputs, keys, datum, loop
            )
        ]

    (result,) = loop(t, datum, layers.name, None, "layer", [(None, x)], body)
    return result


def nth(t, datum: List, env: dict) -> Operand:
    """(nth STACK I X ...): the forward of STACK's layer I, I known when the module runs;
    of a sequential's or module-list's item I, I written as an integer."""
    named = datum.items[1]
    param = t.model.params.get(named.name) if isinstance(named, Symbol) else None
    if param is not None and param.init.kind in LISTS:
        return t.caller.item(named.name, t.scalar(datum.items[2], env), datum, env)
    layers, forward = _stack(t, datum)
    index = t.scalar(datum.items[2], env)
    inner = List((layers, *datum.items[3:]), datum.span)
    inputs, keys = t.caller.arguments(forward, inner, env)
    attrs = {"target": layers.name, "keys": keys, "at": index}
    return t.builder.add(
        Node(
            Kind.SUBMODEL,
            None,
            tuple(inputs),
            attrs,
            datum.span,
            datum,
            t.builder.frames,
        )
    )


def loop(
    t,
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
    inputs = [argument(name, datum.span, datum) for name, _ in carried]
    region = Region(inputs)
    attrs = {"stack": stack, "index": index, "layer": layer}
    node = Node(
        Kind.FOR,
        None,
        tuple(operand for _, operand in carried),
        attrs,
        datum.span,
        datum,
        t.builder.frames,
        regions=(region,),
    )
    with t.builder.region(region):
        region.outputs = body(node, inputs)
    t.builder.add(node)
    return t.builder.items(node, len(carried))


def for_(t, datum: List, env: dict) -> Operand:
    """(for (I LAYER STACK) ((NAME INIT) ...) BODY ...): BODY's value is the carried
    value's next one, or a vector of them, [a b], when several are carried."""
    items = datum.items
    header = match(datum).parts[0].items
    if len(header) not in (2, 3) or not all(isinstance(h, Symbol) for h in header):
        raise SourceError(items[1].span, "expected (I LAYER STACK) or (LAYER STACK)")
    *names, stack = header
    index, layer = (None, *names) if len(names) == 1 else names
    _expect_stack(t, stack)
    if not items[2].items:
        raise SourceError(
            items[2].span, "expected the carried values, ((NAME INIT) ...)"
        )
    # a value may start as `none`, Python's None, where the first layer does not read it
    # and each gives a tensor: T5's position bias, which block 0 computes
    carried = [
        (
            symbol.name,
            None if _is_none(value, env) else t.tensor(value, env, "a carried value"),
        )
        for symbol, value in map(_binding, items[2].items)
    ]
    if all(operand is None for _, operand in carried):
        raise SourceError(items[2].span, "a loop carries a tensor: not only none")

    def body(loop: Node, inputs: list) -> list:
        inner = dict(env)
        inner.update(zip((name for name, _ in carried), inputs))
        inner[layer.name] = Layer(stack.name, loop)
        if index is not None:
            inner[index.name] = Scalar(ScalarOp.INDEX, (loop,), 0)
        *forms, last = items[3:]
        t.body(tuple(forms), inner)
        return next_values(last, inner)

    def next_values(last: Datum, inner: dict) -> list:
        if len(carried) == 1:
            return [t.tensor(last, inner, "the next carried value")]
        if head_name(last) == "let":
            return let(t, last, inner, tail=next_values)
        if not (isinstance(last, Vector) and len(last.items) == len(carried)):
            raise SourceError(
                last.span,
                f"the body must end with a vector of the {len(carried)} carried values' next values",
            )
        return [t.tensor(i, inner, "the next carried value") for i in last.items]

    results = loop(
        t, datum, stack.name, index and index.name, layer.name, carried, body
    )
    for (name, _), item in zip(carried, results):
        item.name = name
    return results[0] if len(results) == 1 else tuple(results)


def if_(t, datum: List, env: dict) -> Operand:
    """(if COND THEN ELSE), COND known when the module runs: both branches are compiled."""
    match(datum)
    condition = scalars.expect_some(t.expr(datum.items[1], env), datum.items[1].span)
    if not isinstance(condition, Scalar):
        raise SourceError(
            datum.items[1].span,
            "if needs a condition known when the module runs (consts, &key arguments, "
            "the layer index); to choose between tensors elementwise, use (where C X Y)",
        )
    # written in the source: nothing a caller can change
    if condition.op is ScalarOp.LIT:
        return t.expr(datum.items[2 if condition.value else 3], env)
    regions = (Region([]), Region([]))
    values = []
    for region, branch in zip(regions, datum.items[2:]):
        with t.builder.region(region):
            values.append(None if _is_none(branch, env) else t.expr(branch, env))
        region.outputs = [values[-1]]
    if None in values and not any(isinstance(v, Node) for v in values):
        raise SourceError(datum.span, "an if with a none branch chooses a tensor")
    if all(isinstance(v, Scalar) for v in values):
        return scalars.choose(condition, *values, datum.span)
    node = Node(
        Kind.IF, None, (), {"condition": condition}, datum.span, datum, t.builder.frames
    )
    node.regions = regions
    return t.builder.add(node)


def _is_none(datum: Datum, env: dict) -> bool:
    """`none` as a branch of `if`: no tensor, Python's None, for an argument that a layer
    without the parameter reading it never reads (the real code's `ve=None`)."""
    return isinstance(datum, Symbol) and datum.name == "none" and "none" not in env


def not_(t, datum: List, env: dict) -> Scalar:
    match(datum)
    return scalars.logic("not", [t.scalar(datum.items[1], env)], datum.span)


def and_(t, datum: List, env: dict) -> Scalar:
    return _logic(t, "and", datum, env)


def or_(t, datum: List, env: dict) -> Scalar:
    return _logic(t, "or", datum, env)


def _logic(t, op: str, datum: List, env: dict) -> Scalar:
    match(datum)
    operands = [t.scalar(item, env) for item in datum.items[1:]]
    return scalars.logic(op, operands, datum.span)


def in_(t, datum: List, env: dict) -> Scalar:
    x, choices = match(datum).parts
    if isinstance(choices, Vector):
        options = tuple(t.scalar(item, env) for item in choices.items)
    else:  # a list const or &key, as `(in layer-idx mlp-only-layers)`
        options = t.scalar(choices, env)
        if not isinstance(options.value, tuple):
            raise SourceError(
                choices.span, "expected (in X [A B ...]) or (in X LIST), LIST a list"
            )
    return scalars.member(t.scalar(x, env), options)


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


def head_name(datum: Datum) -> Optional[str]:
    if isinstance(datum, List) and datum.items and isinstance(datum.items[0], Symbol):
        return datum.items[0].name
    return None


HANDLERS = {
    "let": let,
    "with-numerics": with_numerics,
    "cast": cast,
    "gradient": gradient_,
    "chain": chain,
    "nth": nth,
    "for": for_,
    "if": if_,
    "and": and_,
    "or": or_,
    "not": not_,
    "in": in_,
}
