"""A defparam's initializer: a tensor initializer of the registry (ops/initializers.py),
a composite one (concat, repeat, pow, tensor), a sub-model instance or a stack of them;
its sizes checked against the limits with the consts at their defaults."""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

from sx2torch.errors import SourceError
from sx2torch.limits import MAX_ELEMENTS, MAX_LAYERS
from sx2torch.ops.initializers import (
    FORMULA_ARITHMETIC,
    FORMULA_FUNCTIONS,
    FORMULAS,
    INITIALIZERS,
    sizes,
)
from sx2torch.ops.rank import known, outside_rows
from sx2torch.resolve.values import (
    built_from,
    evaluate,
    evaluate_or_none,
    expect_symbol,
    form_head,
    read_keywords,
    shape,
)
from sx2torch.syntax import scalars
from sx2torch.syntax.forms import Part, Shape, match
from sx2torch.syntax.program import (
    LISTS,
    MODULE_KINDS,
    Const,
    Init,
    Model,
    WeightNorm,
)
from sx2torch.syntax.read import Datum, Keyword, List, Number, Symbol, Vector, shown
from sx2torch.syntax.scalars import Scalar, ScalarOp


def check_size(init: Init, datum: Datum) -> None:
    if init.kind == "stack" and init.count.value > MAX_LAYERS:
        raise SourceError(
            datum.span,
            f"a stack has at most {MAX_LAYERS:,} layers, got {init.count.value:,}",
        )
    if init.kind in MODULE_KINDS:
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
    if head in LISTS and not _instance_like(datum):
        return _list(model, datum)
    if head == "if" and not _instance_like(datum):
        return _choice(model, datum)
    if head == "weight-norm" and not _instance_like(datum):
        return _weight_norm(model, datum)
    instance = head in FORMULAS and _instance_like(datum)
    if head in COMPOSITE and not instance:
        return COMPOSITE[head](model, datum)
    if head not in INITIALIZERS or instance:
        return Init("model", _instance_args(model, datum), model=head, span=datum.span)
    positional, defaults = INITIALIZERS[head].positional, INITIALIZERS[head].keys
    parts = tuple(Part(key.upper()) for key in positional)
    form = match(datum, Shape(parts, keys=dict.fromkeys(defaults)))
    args = {}
    for key, item in zip(positional, form.parts):
        if key == "shape":
            args[key] = shape(built_from(model, item), item, model.names)
        else:
            args[key] = evaluate(model, item)
    keywords = form.keys
    for key, item in keywords.items():
        args[key] = evaluate(model, item)
        if key not in INITIALIZERS[head].rows:
            scalars.expect_some(args[key], item.span)
    for key, default in defaults.items():
        if default is not None:  # an optional key (normal's :padding-idx) left out
            args.setdefault(key, Scalar.lit(default))
    for key in INITIALIZERS[head].counts:
        scalars.expect_int(args[key], datum.items[1].span, f"{head}'s size")
    _check_ranges(head, args, keywords, datum)
    args.update(INITIALIZERS[head].derived(args))
    return Init(head, args)


def _instance_like(datum: List) -> bool:
    """`(outer :k 2)`, `(log)`: keyword arguments alone, an instance of a model of that
    name (a formula's arguments are initializers and numbers)."""
    return len(datum.items) == 1 or isinstance(datum.items[1], Keyword)


def _stack(model: Model, datum: List) -> Init:
    """`(stack N (MODEL :k v ...))`, or `(stack (i N) ...)` whose instances read the layer
    index `i`."""
    match(datum)
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
        "stack",
        inner.args,
        inner.model,
        count,
        inner.span,
        index and index.name,
        weight_norm=inner.weight_norm,
    )


def _instance(model: Model, datum: Datum, what: str) -> Init:
    inner = initializer(model, datum)
    if inner.kind != "model":
        raise SourceError(
            datum.span, f"{what} takes sub-model instances, such as (block :d d)"
        )
    return inner


def _list(model: Model, datum: List) -> Init:
    """`(sequential (A ...) (B ...))`, `(module-list (A ...) (B ...))`: instances of
    different models under the keys `0.`, `1.`, ..., as torch's nn.Sequential and
    nn.ModuleList hold them."""
    match(datum)
    head = datum.items[0].name
    items = tuple(_instance(model, item, head) for item in datum.items[1:])
    return Init(head, {}, span=datum.span, items=items)


def _choice(model: Model, datum: List) -> Init:
    """`(if C (A ...) (B ...))`: an instance of A where the consts meet C, else one of B,
    under the one key: DeepSeek-V3's dense MLP on the first layers and MoE on the others.
    """
    condition, then, else_ = match(datum).parts
    when = evaluate(model, condition)
    if not isinstance(when.value, bool):
        raise SourceError(
            condition.span,
            "a choice of sub-models takes a condition on the consts, such as "
            "(< layer-idx first-k-dense-replace)",
        )
    items = tuple(_instance(model, item, "a choice") for item in (then, else_))
    # the condition as written, which a call of the choice traces as an `if`'s
    args = {"when": when, "condition": condition}
    return Init("choice", args, span=datum.span, items=items)


def _weight_norm(model: Model, datum: List) -> Init:
    """`(weight-norm (Conv1d ...) :name weight :dim 2)`: the instance with its parameter
    NAME (weight by default) under torch's weight-norm parametrization, as
    `nn.utils.parametrizations.weight_norm(conv, name="weight", dim=2)` makes
    Wav2Vec2's positional convolution; :dim is torch's, 0 by default. resolve/checks.py
    checks NAME and DIM against the instance's model once every model is read."""
    form = match(datum)
    instance = _instance(model, form.parts[0], "weight-norm")
    if instance.weight_norm is not None:
        raise SourceError(form.parts[0].span, "an instance takes one weight-norm")
    name = form.keys.get("name") or Symbol("weight", span=datum.span)
    dim = form.keys.get("dim")
    value = Scalar.lit(0) if dim is None else evaluate(model, dim)
    scalars.expect_int(value, (dim or datum).span, "weight-norm's :dim")
    return replace(instance, weight_norm=WeightNorm(name, value, datum.span))


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
    """`(concat [INIT ...] :axis A)`: parts end to end along axis A (0 by default, a
    literal), as `torch.cat`; its size there is the sum of theirs, kept in terms of the
    consts."""
    options = match(datum).keys
    items = datum.items[1]
    axis = 0
    if "axis" in options:
        given = options["axis"]
        if not (isinstance(given, Number) and isinstance(given.value, int)):
            raise SourceError(
                given.span, "concat's :axis must be written as an integer"
            )
        axis = given.value
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
        if not 0 <= axis < len(shape):
            raise SourceError(
                item.span,
                f"concat's parts must have an axis {axis}, got a {part.kind} of shape "
                f"{shape}",
            )
        first = [s.value for s in sizes(parts[0])] if parts else shape
        if _but(shape, axis) != _but(first, axis):
            which = "the first" if axis == 0 else f"axis {axis}'s"
            raise SourceError(
                item.span,
                f"concat's parts must agree in all sizes but {which}, got a {part.kind} of shape {shape} after one of shape {first}",
            )
        parts.append(part)
    shape = list(sizes(parts[0]))
    for part in parts[1:]:
        shape[axis] = scalars.fold(
            ScalarOp.ADD, shape[axis], sizes(part)[axis], datum.span
        )
    return Init("concat", {"parts": tuple(parts), "axis": axis, "shape": tuple(shape)})


def _but(shape: list, axis: int) -> list:
    return shape[:axis] + shape[axis + 1 :]


def _repeat(model: Model, datum: List) -> Init:
    """`(repeat N INIT)`: a 1-D initializer N times over, as `torch.tensor([0.5, 1.0]).repeat(n)`."""
    match(datum)
    count = scalars.expect_int(
        evaluate(model, datum.items[1]), datum.items[1].span, "repeat's count"
    )
    if count.value < 0:
        raise SourceError(
            datum.items[1].span,
            f"repeat's count must not be negative, got {count.value}",
        )
    part = initializer(model, datum.items[2])
    if part.kind in MODULE_KINDS or len(sizes(part)) != 1:
        raise SourceError(datum.items[2].span, "repeat takes a 1-D tensor initializer")
    size = scalars.fold(ScalarOp.MUL, count, sizes(part)[0], datum.span)
    return Init("repeat", {"count": count, "part": part, "shape": (size,)})


def _pow(model: Model, datum: List) -> Init:
    """`(pow BASE INIT)`: a number raised to each value of a tensor initializer, as
    `(1 / 1024) ** torch.linspace(0, 1, n)` (rotary frequencies)."""
    match(datum)
    base = evaluate(model, datum.items[1])
    if isinstance(base.value, (bool, str)):
        raise SourceError(datum.items[1].span, "pow's base must be a number")
    part = initializer(model, datum.items[2])
    if part.kind in MODULE_KINDS:
        raise SourceError(datum.items[2].span, "pow takes a tensor initializer")
    return Init("pow", {"base": base, "part": part, "shape": sizes(part)})


def _tensor(model: Model, datum: List) -> Init:
    """`(tensor [0.5 1.0])`: a 1-D tensor of those values, as floats."""
    match(datum)
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


def _arange(model: Model, datum: List) -> Init:
    """`(arange START END)`: START, START + 1, ..., END - 1 as floats, Mamba's
    `torch.arange(1, d_state + 1, dtype=torch.float32)`; its size END - START in terms
    of the consts."""
    match(datum, Shape((Part("START"), Part("END"))))
    start, end = (
        scalars.expect_int(evaluate(model, item), item.span, "arange's bound")
        for item in datum.items[1:]
    )
    size = scalars.fold(ScalarOp.SUB, end, start, datum.span)
    if size.value < 0:
        raise SourceError(
            datum.span,
            f"arange's END must not be below its START, got {start.value} and {end.value}",
        )
    return Init("arange", {"start": start, "end": end, "size": size})


def _tensor_part(model: Model, datum: Datum, what: str) -> Init:
    part = initializer(model, datum)
    if part.kind in MODULE_KINDS:
        raise SourceError(datum.span, f"{what} takes tensor initializers")
    return part


def _function(model: Model, datum: List) -> Init:
    """`(log INIT)`, `(sin INIT)`, ...: the function of each value, `torch.log(...)`."""
    head = datum.items[0].name
    match(datum, Shape((Part("INIT"),)))
    part = _tensor_part(model, datum.items[1], head)
    return Init(head, {"part": part, "shape": sizes(part)})


def _arithmetic(model: Model, datum: List) -> Init:
    """`(* INIT INIT)`, `(* INIT 2.0)`, `(- 1.0 INIT)`: the values of two initializers of
    one shape, or of one and a number, combined elementwise as torch's operator does."""
    head = datum.items[0].name
    match(datum, Shape((Part("A"), Part("B")), example=f"({head} (arange 0 n) 2.0)"))
    operands = [
        _tensor_part(model, item, head) if _is_formula(item) else evaluate(model, item)
        for item in datum.items[1:]
    ]
    parts = [o for o in operands if isinstance(o, Init)]
    if not parts:
        raise SourceError(
            datum.span, f"{head} of numbers alone is a number, not a tensor"
        )
    shapes = [[s.value for s in sizes(p)] for p in parts]
    if shapes[-1] != shapes[0]:
        raise SourceError(
            datum.span,
            f"{head}'s initializers must have one shape, got {shapes[0]} and {shapes[1]}",
        )
    for operand, item in zip(operands, datum.items[1:]):
        if isinstance(operand, Scalar) and isinstance(
            operand.value, (bool, str, tuple)
        ):
            raise SourceError(item.span, f"{head} takes numbers, got {shown(item)}")
    left, right = operands
    return Init(
        "arithmetic",
        {"op": head, "left": left, "right": right, "shape": sizes(parts[0])},
    )


def _is_formula(datum: Datum) -> bool:
    """Whether `datum` makes a tensor: an initializer, or arithmetic or a function with one
    among its operands (`(- 0.0 inc)` and `(log 10000)` are numbers, `(- 1.0 (arange 0 n))`
    a tensor)."""
    if not (
        isinstance(datum, List) and datum.items and isinstance(datum.items[0], Symbol)
    ):
        return False
    head = datum.items[0].name
    if head in FORMULA_ARITHMETIC or head in FORMULA_FUNCTIONS:
        return any(_is_formula(item) for item in datum.items[1:])
    return head in INITIALIZERS


def _outer(model: Model, datum: List) -> Init:
    """`(outer A B)` of two 1-D initializers: the table of their products,
    `torch.outer(a, b)`, as a sinusoidal table's positions times its frequencies."""
    match(datum, Shape((Part("A"), Part("B"))))
    left, right = (_tensor_part(model, item, "outer") for item in datum.items[1:])
    for part, item in zip((left, right), datum.items[1:]):
        if len(sizes(part)) != 1:
            raise SourceError(item.span, "outer takes 1-D initializers")
    return Init(
        "outer",
        {"left": left, "right": right, "shape": (sizes(left)[0], sizes(right)[0])},
    )


# The initializers with a form of their own (sx2torch/ops/initializers.py emits them).
COMPOSITE = {
    "concat": _concat,
    "repeat": _repeat,
    "pow": _pow,
    "tensor": _tensor,
    **{name: _function for name in FORMULA_FUNCTIONS},
    **{op: _arithmetic for op in FORMULA_ARITHMETIC},
    "arange": _arange,
    "outer": _outer,
}


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
    if head == "normal":
        _check_padding_row(args, keywords, datum)
    if head == "normal" and args["std"].value < 0:
        raise SourceError(
            keywords["std"].span,
            f":std must not be negative, got {args['std'].value}",
        )
    if head == "fan-in-uniform" and not args["fan-in"].value > 0:
        raise SourceError(
            keywords.get("fan-in", datum).span,
            f":fan-in must be positive, got {args['fan-in'].value}",
        )
    if head == "uniform" and args["low"].value > args["high"].value:
        low, high = args["low"].value, args["high"].value
        raise SourceError(
            keywords.get("low", keywords.get("high")).span,
            f":low must not be greater than :high, got :low {low} and :high {high}",
        )


def _instance_args(model: Model, datum: List) -> dict:
    """`(MODEL A B :k v ...)` -> {0: (span, A), 1: (span, B), k: (span, v)}: the arguments
    before the keywords are the model's keys in its lambda list's order, which
    resolve/checks.py names once every model is read."""
    items = datum.items[1:]
    first = next(
        (i for i, item in enumerate(items) if isinstance(item, Keyword)), len(items)
    )
    args = {
        i: (item.span, evaluate_or_none(model, item))
        for i, item in enumerate(items[:first])
    }
    items = items[first:]
    every_key = {item.name: None for item in items[::2] if isinstance(item, Keyword)}
    pairs = read_keywords(items, every_key, "a sub-model instance")
    keys = {item.name: item.span for item in items[::2]}
    args.update(
        (key, (keys[key], evaluate_or_none(model, value)))
        for key, value in pairs.items()
    )
    return args


def _check_padding_row(args: dict, keywords: dict, datum: List) -> None:
    """:padding-idx, the row zeroed after the draw: an integer (or a const whose default
    is none) among the first axis's rows where both are literals, as torch's embedding
    refuses another."""
    row = args.get("padding-idx")
    if row is None or row.value is None:
        return
    span = keywords["padding-idx"].span
    scalars.expect_int(row, span, ":padding-idx")
    if not args["shape"]:
        raise SourceError(span, ":padding-idx zeroes a row: the shape has no rows")
    rows = args["shape"][0]
    problem = outside_rows(known(row), known(rows))
    if problem:
        raise SourceError(span, problem)
