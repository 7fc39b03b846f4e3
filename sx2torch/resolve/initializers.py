"""A defparam's initializer: a tensor initializer of the registry (ops/initializers.py),
a composite one (concat, repeat, pow, tensor), a sub-model instance or a stack of them;
its sizes checked against the limits with the consts at their defaults."""

from __future__ import annotations

from typing import Optional

from sx2torch.errors import SourceError
from sx2torch.limits import MAX_ELEMENTS, MAX_LAYERS
from sx2torch.ops.initializers import INITIALIZERS, sizes
from sx2torch.resolve.values import (
    arity,
    built_from,
    evaluate,
    expect_symbol,
    form_head,
    read_keywords,
    shape,
)
from sx2torch.syntax import scalars
from sx2torch.syntax.program import Const, Init, Model
from sx2torch.syntax.read import Datum, Keyword, List, Symbol, Vector, shown
from sx2torch.syntax.scalars import Scalar, ScalarOp


def check_size(init: Init, datum: Datum) -> None:
    if init.kind == "stack" and init.count.value > MAX_LAYERS:
        raise SourceError(
            datum.span,
            f"a stack has at most {MAX_LAYERS:,} layers, got {init.count.value:,}",
        )
    if init.kind in ("model", "stack"):
        return
    elements = 1
    for size in sizes(init):
        elements *= size.value
    if elements > MAX_ELEMENTS:
        raise SourceError(
            datum.span,
            f"a parameter has at most {MAX_ELEMENTS:,} elements, got {elements:,}",
        )


def initializer(model: Model, datum: Datum) -> Init:
    head = form_head(datum, "an initializer such as (normal [d d])")
    if head == "stack":
        return _stack(model, datum)
    if head in COMPOSITE:
        return COMPOSITE[head](model, datum)
    if head not in INITIALIZERS:
        return Init("model", _instance_args(model, datum), model=head, span=datum.span)
    positional, defaults = INITIALIZERS[head].positional, INITIALIZERS[head].keys
    n = len(positional)
    items = datum.items[1:]
    if len(items) < n or any(isinstance(i, Keyword) for i in items[:n]):
        raise SourceError(
            datum.span,
            f"wrong number of arguments: expected ({head} {' '.join(p.upper() for p in positional)}{' &key ...' if defaults else ''})",
        )
    args = {}
    for key, item in zip(positional, items[:n]):
        if key == "shape":
            args[key] = shape(built_from(model, item), item, model.names)
        else:
            args[key] = evaluate(model, item)
    keywords = read_keywords(items[n:], defaults, head)
    for key, item in keywords.items():
        args[key] = evaluate(model, item)
    for key, default in defaults.items():
        args.setdefault(key, Scalar.lit(default))
    for key in INITIALIZERS[head].counts:
        scalars.expect_int(args[key], items[0].span, f"{head}'s size")
    _check_ranges(head, args, keywords, datum)
    return Init(head, args)


def _stack(model: Model, datum: List) -> Init:
    """`(stack N (MODEL :k v ...))`, or `(stack (i N) ...)` whose instances read the layer
    index `i`."""
    arity(datum, 2, 2, "(stack N (MODEL :k v ...))")
    size, index = datum.items[1], None
    if isinstance(size, List) and len(size.items) == 2:  # (stack (i N) ...)
        index = expect_symbol(size.items[0], "the layer index's name")
        size = size.items[1]
    count = scalars.expect_int(
        evaluate(model, size),
        size.span,
        "a stack size",
    )
    if count.value < 0:
        raise SourceError(
            datum.items[1].span,
            f"a stack size must not be negative, got {count.value}",
        )
    inner = initializer(_with_index(model, index), datum.items[2])
    if inner.kind != "model":
        raise SourceError(
            datum.items[2].span,
            "stack takes a sub-model instance, such as (block :d d)",
        )
    return Init(
        "stack", inner.args, inner.model, count, inner.span, index and index.name
    )


def _with_index(model: Model, index: Optional[Symbol]) -> Model:
    """`model`, where a stack's instance arguments may read its layer index (0 when checked)."""
    if index is None:
        return model
    seen = Model(model.name, model.span, None, dict(model.consts), model.params)
    seen.consts[index.name] = Const(
        index.name, Scalar(ScalarOp.LAYER, (index.name,), 0), index.span
    )
    return seen


def _concat(model: Model, datum: List) -> Init:
    """`(concat [INIT ...])`: parts end to end along their first axis, as `torch.cat`; its
    size there is the sum of theirs, kept in terms of the consts."""
    arity(datum, 1, 1, "(concat [INIT ...])")
    items = datum.items[1]
    if not isinstance(items, Vector) or not items.items:
        raise SourceError(
            items.span,
            "concat takes a vector of initializers, such as (concat [(zeros [1]) (full [3] -1.5)])",
        )
    parts = []
    for item in items.items:
        head = form_head(item, "an initializer such as (zeros [n])")
        if head not in INITIALIZERS:
            raise SourceError(
                item.span,
                f"concat's parts are tensor initializers such as (zeros [n]), got '{head}'",
            )
        part = initializer(model, item)
        shape = [s.value for s in sizes(part)]
        if not shape:
            raise SourceError(
                item.span, f"concat's parts must have an axis, got a 0-D {part.kind}"
            )
        first = [s.value for s in sizes(parts[0])] if parts else shape
        if shape[1:] != first[1:]:
            raise SourceError(
                item.span,
                f"concat's parts must agree in all sizes but the first, got a {part.kind} of shape {shape} after one of shape {first}",
            )
        parts.append(part)
    size = sizes(parts[0])[0]
    for part in parts[1:]:
        size = scalars.fold(ScalarOp.ADD, size, sizes(part)[0], datum.span)
    return Init(
        "concat", {"parts": tuple(parts), "shape": (size, *sizes(parts[0])[1:])}
    )


def _repeat(model: Model, datum: List) -> Init:
    """`(repeat N INIT)`: a 1-D initializer N times over, as `torch.tensor([0.5, 1.0]).repeat(n)`."""
    arity(datum, 2, 2, "(repeat N INIT)")
    count = scalars.expect_int(
        evaluate(model, datum.items[1]), datum.items[1].span, "repeat's count"
    )
    if count.value < 0:
        raise SourceError(
            datum.items[1].span,
            f"repeat's count must not be negative, got {count.value}",
        )
    part = initializer(model, datum.items[2])
    if part.kind in ("model", "stack") or len(sizes(part)) != 1:
        raise SourceError(datum.items[2].span, "repeat takes a 1-D tensor initializer")
    size = scalars.fold(ScalarOp.MUL, count, sizes(part)[0], datum.span)
    return Init("repeat", {"count": count, "part": part, "shape": (size,)})


def _pow(model: Model, datum: List) -> Init:
    """`(pow BASE INIT)`: a number raised to each value of a tensor initializer, as
    `(1 / 1024) ** torch.linspace(0, 1, n)` (rotary frequencies)."""
    arity(datum, 2, 2, "(pow BASE INIT)")
    base = evaluate(model, datum.items[1])
    if isinstance(base.value, (bool, str)):
        raise SourceError(datum.items[1].span, "pow's base must be a number")
    part = initializer(model, datum.items[2])
    if part.kind in ("model", "stack"):
        raise SourceError(datum.items[2].span, "pow takes a tensor initializer")
    return Init("pow", {"base": base, "part": part, "shape": sizes(part)})


def _tensor(model: Model, datum: List) -> Init:
    """`(tensor [0.5 1.0])`: a 1-D tensor of those values, as floats."""
    arity(datum, 1, 1, "(tensor [VALUE ...])")
    items = datum.items[1]
    if not isinstance(items, Vector) or not items.items:
        raise SourceError(
            items.span, "tensor takes a vector of numbers, such as (tensor [0.5 1.0])"
        )
    values = tuple(evaluate(model, item) for item in items.items)
    for value, item in zip(values, items.items):
        if isinstance(value.value, (bool, str)):
            raise SourceError(
                item.span, f"tensor's values must be numbers, got {shown(item)}"
            )
    return Init("tensor", {"values": values, "shape": (Scalar.lit(len(values)),)})


# The initializers with a form of their own (sx2torch/ops/initializers.py emits them).
COMPOSITE = {"concat": _concat, "repeat": _repeat, "pow": _pow, "tensor": _tensor}


def _check_ranges(head: str, args: dict, keywords: dict, datum: List) -> None:
    """What torch would refuse when the module is built, with the consts at their defaults."""
    for key, value in args.items():
        if isinstance(value, Scalar) and isinstance(value.value, (bool, str)):
            where = keywords[key] if key in keywords else datum.items[2]
            raise SourceError(
                where.span,
                f"{head}'s {key} must be a number, got {shown(where)}",
            )
    for key in INITIALIZERS[head].counts:
        if args[key].value < 0:
            raise SourceError(
                datum.items[1].span,
                f"{head}'s size must not be negative, got {args[key].value}",
            )
    if head == "normal" and args["std"].value < 0:
        raise SourceError(
            keywords["std"].span,
            f":std must not be negative, got {args['std'].value}",
        )
    if head == "uniform" and args["low"].value > args["high"].value:
        low, high = args["low"].value, args["high"].value
        raise SourceError(
            keywords.get("low", keywords.get("high")).span,
            f":low must not be greater than :high, got :low {low} and :high {high}",
        )


def _instance_args(model: Model, datum: List) -> dict:
    """`(MODEL :k v ...)` -> {k: (span, Scalar)}; the keys are checked once every model is read."""
    items = datum.items[1:]
    if items and not isinstance(items[0], Keyword):
        raise SourceError(
            items[0].span,
            "a sub-model takes only keyword arguments, such as (block :d d)",
        )
    every_key = {item.name: None for item in items[::2] if isinstance(item, Keyword)}
    pairs = read_keywords(items, every_key, "a sub-model instance")
    keys = {item.name: item.span for item in items[::2]}
    return {key: (keys[key], evaluate(model, value)) for key, value in pairs.items()}
