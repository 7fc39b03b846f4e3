"""An op applied in source, `(OP ARG ... :key VALUE ...)`: its arguments checked against the
op's registry signature and traced, then its nodes made."""

from __future__ import annotations

from sx2torch.syntax import keywords as keyword_args
from sx2torch.syntax import scalars
from sx2torch.ops.builder import default
from sx2torch.errors import SourceError
from sx2torch.ir import Operand, Scalar
from sx2torch.syntax.scalars import ScalarOp
from sx2torch.ops import ArgKind, Op
from sx2torch.ops.einsum import check_equation
from sx2torch.ops.rank import ELLIPSIS
from sx2torch.syntax.read import Datum, Keyword, List, String, Symbol, Vector, shown

SCALAR_KINDS = {
    ArgKind.INT: "an integer",
    ArgKind.ROW: "an integer",
    ArgKind.NUMBER: "a number",
    ArgKind.BOOL: "true or false",
}

CHOICES = {  # the keyword-valued kinds, and the keywords each takes
    ArgKind.OUT: ("f32",),
    ArgKind.REDUCTION: ("mean", "sum", "none"),
    ArgKind.APPROXIMATE: ("none", "tanh"),
    ArgKind.MODE: ("nearest", "bilinear"),
    ArgKind.KERNEL_DTYPE: ("f32", "input"),
}
PADDINGS = ("same", "valid")


def apply(t, op: Op, datum: List, env: dict) -> Operand:
    if op.numbers and not op.keys:  # a keyword is a value: (= kind :sliding)
        positional, keywords = datum.items[1:], {}
    else:
        positional, keywords = keyword_args.split(
            datum.items[1:], keyword_args.call(op.name, [k.name for k in op.keys])
        )
    least, most = op.bounds
    if len(positional) < least or (most is not None and len(positional) > most):
        raise SourceError(
            datum.span,
            f"wrong number of arguments: expected {_usage(op)}, got {len(positional)}",
        )
    inputs, attrs = [], {}
    for index, item in enumerate(positional):
        spec = op.args[min(index, len(op.args) - 1)]
        value = _argument(
            t, spec, item, env, f"{op.name}'s {spec.name}", op.numbers is not None
        )
        if spec.kind.is_tensor:
            inputs.append(value)
        elif spec.kind is ArgKind.TENSORS:
            inputs.extend(value)
        else:
            attrs[spec.name] = value
    given = {
        key: _argument(t, op.key(key), value, env, f":{key}")
        for key, value in keywords.items()
    }
    for spec in op.keys:
        attrs[spec.name] = given.get(spec.name, default(spec.default))
    only_numbers = inputs and all(isinstance(i, Scalar) for i in inputs)
    for item in positional if not only_numbers else ():
        keyword = _keyword(t, item, env)
        if keyword is not None:
            what = (
                f"'{item.name}' is the keyword :{keyword.value}"
                if isinstance(item, Symbol)
                else f":{keyword.value} is a keyword"
            )
            raise SourceError(item.span, f"{what}, not a number or a tensor")
    if only_numbers and op.numbers is None:
        raise SourceError(
            datum.span,
            f"'{op.name}' needs a tensor argument, got only numbers known at compile time",
        )
    outer, t.builder.datum = t.builder.datum, datum
    try:
        return (
            _fold_left(t, op, inputs, attrs)
            if op.folds
            else t.builder.op(op.name, inputs, **attrs)
        )
    finally:
        t.builder.datum = outer


def _keyword(t, datum: Datum, env: dict):
    """A keyword, or a const or &key argument whose value is one, as a Scalar; else None."""
    if isinstance(datum, Keyword):
        return Scalar.lit(datum.name)
    if not isinstance(datum, Symbol) or datum.name in env:
        return None
    if t.defun.shared and datum.name not in t.keys:
        return None
    scalar = t.keys.get(datum.name) or t.const(datum.name)
    return scalar if scalar is not None and isinstance(scalar.value, str) else None


def _fold_left(t, op: Op, inputs: list, attrs: dict) -> Operand:
    if len(inputs) == 1:  # (- x)
        return t.builder.op(op.name, inputs, **attrs)
    result = inputs[0]
    for operand in inputs[1:]:
        result = t.builder.op(op.name, [result, operand], **attrs)
    return result


def _argument(t, spec, item: Datum, env: dict, what: str, numbers=False):
    """`numbers`: the op folds compile-time values, so a keyword, or a const or key whose
    value is one, is one of them, as `(= (at layer-types i) :sliding)` compares an element
    of a list of keywords (`apply` refuses it beside a tensor)."""
    if numbers and spec.kind.is_tensor:
        keyword = _keyword(t, item, env)
        if keyword is not None:
            return keyword
    # an op that folds compile-time numbers (`at` of a list const) takes no run-time one
    value = _value_of(t, spec.kind, item, env, what, run=not numbers)
    if spec.kind is not ArgKind.ROW:
        scalars.expect_some(value, item.span)
    scalars_given = value if isinstance(value, tuple) else (value,)
    if spec.static and any(
        isinstance(s, Scalar) and s.op is not ScalarOp.LIT for s in scalars_given
    ):
        if scalars.run_nodes(scalars_given):
            raise SourceError(
                item.span,
                f"{what} must be written as numbers: it decides the result's shape, "
                "and a size is known only when the module runs",
            )
        literal = "true or false" if spec.kind is ArgKind.BOOL else "numbers"
        raise SourceError(
            item.span,
            f"{what} must be written as {literal}: it decides the result's shape, "
            "and the caller can change a const or a &key argument",
        )
    return value


def _value_of(t, kind: str, item: Datum, env: dict, what: str, run: bool = True):
    if kind.is_tensor:
        return t.expr(item, env)
    if kind is ArgKind.TENSORS:
        if not isinstance(item, Vector) or not item.items:
            raise SourceError(
                item.span, f"{what} must be a vector of tensors, such as [x y]"
            )
        return [t.expr(i, env) for i in item.items]
    if kind is ArgKind.SHAPE and isinstance(item, Vector) and _leads(item):
        rest = Vector(item.items[1:], item.span)
        return (ELLIPSIS, *_value_of(t, ArgKind.INTS, rest, env, what, run))
    if kind in (ArgKind.INTS, ArgKind.SHAPE):
        if not isinstance(item, Vector):
            raise SourceError(
                item.span, f"{what} must be a vector of integers, such as [0 -1]"
            )
        for i in item.items:
            if isinstance(i, Symbol) and i.name == "...":
                raise SourceError(
                    i.span,
                    "`...` stands only first in a reshape's sizes, for the input's axes "
                    "but the last",
                )
        return tuple(
            t.integer(t.scalar(i, env, run=run), i.span, f"each of {what}")
            for i in item.items
        )
    if kind in (ArgKind.SIZES, ArgKind.PADDING):
        return _sizes(t, kind, item, env, what)
    if kind is ArgKind.EQUATION:
        if not isinstance(item, String):
            raise SourceError(
                item.span, f'{what} must be a string, such as "ij,jk->ik"'
            )
        problem = check_equation(item.value)
        if problem:
            raise SourceError(item.span, problem)
        return item.value.replace(" ", "")
    if kind in CHOICES:
        if not (isinstance(item, Keyword) and item.name in CHOICES[kind]):
            *rest, last = (f":{c}" for c in CHOICES[kind])
            options = f"{', '.join(rest)} or {last}" if rest else last
            raise SourceError(item.span, f"{what} must be {options}, got {shown(item)}")
        return item.name
    if kind in SCALAR_KINDS and isinstance(item, (String, Vector, Keyword)):
        raise SourceError(
            item.span,
            f"{what} must be {SCALAR_KINDS[kind]} known at compile time "
            f"(a literal, a const or a &key argument), got {shown(item)}",
        )
    # torch takes an int that the module computes where it takes one written in the file
    value = t.scalar(item, env, run=run and kind is ArgKind.INT)
    if kind is ArgKind.INT or (kind is ArgKind.ROW and value.value is not None):
        return t.integer(value, item.span, what)
    if kind is ArgKind.BOOL and not isinstance(value.value, bool):
        raise SourceError(item.span, f"{what} must be true or false")
    if kind is ArgKind.NUMBER and (isinstance(value.value, (bool, str))):
        raise SourceError(item.span, f"{what} must be a number")
    return value


def _leads(vector: Vector) -> bool:
    """Whether a vector starts with `...` (and only there: elsewhere it is an unknown name)."""
    first = vector.items[0] if vector.items else None
    return isinstance(first, Symbol) and first.name == "..."


def _sizes(t, kind: ArgKind, item: Datum, env: dict, what: str):
    """An integer, a vector of integers (one per spatial axis), or padding's :same, :valid."""
    if kind is ArgKind.PADDING and isinstance(item, Keyword):
        if item.name not in PADDINGS:
            raise SourceError(
                item.span,
                f"{what} must be an integer, a vector of integers, :same or :valid, "
                f"got {shown(item)}",
            )
        return item.name
    if isinstance(item, Vector):
        return _value_of(t, ArgKind.INTS, item, env, what)
    return _value_of(t, ArgKind.INT, item, env, what)


def _usage(op: Op) -> str:
    args = " ".join(a.name.upper() for a in op.args)
    if op.bounds[1] is None:
        args += " ..."
    keys = " ".join(f":{k.name}" for k in op.keys)
    return f"({op.name} {args}{' &key ' + keys if keys else ''})"
