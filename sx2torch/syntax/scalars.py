"""Compile-time scalars: literals, consts and &key arguments, and arithmetic on them."""

from __future__ import annotations

import math
import operator
from typing import Callable, Optional

from sx2torch.errors import SourceError, suggest
from sx2torch.ir import Scalar
from sx2torch.syntax.read import Boolean, Datum, Keyword, List, Number, Symbol, Vector

ARITHMETIC: dict[str, tuple[str, Callable]] = {
    "+": ("+", operator.add),
    "-": ("-", operator.sub),
    "*": ("*", operator.mul),
    "/": ("/", operator.truediv),
    "//": ("//", operator.floordiv),
    "**": ("**", operator.pow),
    "mod": ("%", operator.mod),
}

# Functions of one number, folded on literals as Python computes them (in f64).
FUNCTIONS: dict[str, Callable] = {
    "exp": math.exp,
    "log": math.log,
    "sqrt": math.sqrt,
    "rsqrt": lambda v: 1.0 / math.sqrt(v),
    "tanh": math.tanh,
    "sigmoid": lambda v: 1.0 / (1.0 + math.exp(-v)),
    "sin": math.sin,
    "cos": math.cos,
    "erf": math.erf,
    "abs": abs,
}

COMPARISONS: dict[str, tuple[str, Callable]] = {
    "=": ("==", operator.eq),
    "<": ("<", operator.lt),
    "<=": ("<=", operator.le),
    ">": (">", operator.gt),
    ">=": (">=", operator.ge),
}

Lookup = Callable[[str], Optional[Scalar]]
# Operands of one chain of compile-time arithmetic: Python's compiler refuses about 3000.
MAX_OPERANDS = 2000


def _made(python_op: str, args: tuple, value) -> Scalar:
    """A scalar that folds to a literal when every leaf is one: only the source decides."""
    if all(_literal(a) for a in args):
        return Scalar.lit(value)
    return Scalar(python_op, args, value)


def _literal(arg) -> bool:
    if isinstance(arg, tuple):
        return all(_literal(a) for a in arg)
    return arg.op == "lit"


def compare(op: str, left: Scalar, right: Scalar, span) -> Scalar:
    """A comparison of numbers known when the module runs: a condition for `if`."""
    python_op, function = COMPARISONS[op]
    for operand in (left, right):
        if not _is_number(operand.value):
            raise SourceError(
                span, f"'{op}' compares numbers, got {_shown(operand.value)}"
            )
    return _made(python_op, (left, right), function(left.value, right.value))


def logic(op: str, operands: list, span) -> Scalar:
    """`and`, `or` (n-ary, folded left) and `not` of conditions."""
    for operand in operands:
        if not isinstance(operand.value, bool):
            raise SourceError(
                span, f"'{op}' takes conditions, got {_shown(operand.value)}"
            )
    if op == "not":
        return _made("not", (operands[0],), not operands[0].value)
    result = operands[0]
    for operand in operands[1:]:
        value = (
            (result.value and operand.value)
            if op == "and"
            else (result.value or operand.value)
        )
        result = _made(op, (result, operand), value)
    return result


def member(value: Scalar, options: tuple) -> Scalar:
    return _made("in", (value, options), value.value in [o.value for o in options])


def choose(condition: Scalar, then: Scalar, otherwise: Scalar, span) -> Scalar:
    """`(if c a b)` of numbers: typed by its branches, which must agree."""
    if _is_number(then.value) != _is_number(otherwise.value):
        raise SourceError(span, "the branches of this if give a number and a condition")
    value = then.value if condition.value else otherwise.value
    return Scalar("if", (condition, then, otherwise), value)


def fold(python_op: str, left: Scalar, right: Scalar, span) -> Scalar:
    """Arithmetic on two scalars, evaluated now with every const at its default."""
    for operand in (left, right):
        if not _is_number(operand.value):
            raise SourceError(
                span, f"arithmetic needs numbers, got {_shown(operand.value)}"
            )
    function = next(f for op, f in ARITHMETIC.values() if op == python_op)
    if python_op == "**" and _too_big(left.value, right.value):
        raise SourceError(
            span, "number out of range (with the consts at their defaults)"
        )
    try:
        value = function(left.value, right.value)
    except ZeroDivisionError:
        raise SourceError(
            span, "division by zero (with the consts at their defaults)"
        ) from None
    except OverflowError:
        value = float("inf")
    if not _in_range(value):
        raise SourceError(
            span, "number out of range (with the consts at their defaults)"
        )
    if left.op == right.op == "lit":
        return Scalar.lit(value)
    return Scalar(python_op, _operands(python_op, left, right, span), value)


def _operands(python_op: str, left: Scalar, right: Scalar, span) -> tuple:
    """A left fold `(+ k 1 1 ...)` is one flat Scalar("+", (k, 1, 1, ...)), so that nothing that
    reads scalars recurses once per operand."""
    if left.op != python_op:
        return left, right
    if len(left.args) >= MAX_OPERANDS:
        raise SourceError(
            span, f"compile-time arithmetic takes at most {MAX_OPERANDS} operands"
        )
    return left.args + (right,)


def function(name: str, operands: list, span) -> Scalar:
    """An op of the library applied to numbers alone: `(log 2.0)`, `(pow d 0.5)`, `(sqrt d)`.
    A literal's is folded; a const's is a power, the one function Python's operators write.
    """
    if name == "pow":
        return fold("**", *operands, span)
    (operand,) = operands
    if operand.op != "lit" and name == "sqrt":
        return fold("**", operand, Scalar.lit(0.5), span)
    if operand.op != "lit":
        raise SourceError(
            span,
            f"'{name}' of a const is not known when the file compiles: "
            "write it with + - * / ** on the const, or on a tensor",
        )
    if not _is_number(operand.value):
        raise SourceError(span, f"'{name}' needs a number, got {_shown(operand.value)}")
    try:
        value = FUNCTIONS[name](operand.value)
    except (ValueError, OverflowError, ZeroDivisionError):
        raise SourceError(
            span, f"'{name}' is not defined at {operand.value!r}"
        ) from None
    return Scalar.lit(value)


def negate(operand: Scalar, span) -> Scalar:
    if not _is_number(operand.value):
        raise SourceError(
            span, f"arithmetic needs numbers, got {_shown(operand.value)}"
        )
    if not _in_range(-operand.value):
        raise SourceError(
            span, "number out of range (with the consts at their defaults)"
        )
    return Scalar("neg", (operand,), -operand.value)


def evaluate(datum: Datum, lookup: Lookup, known=None) -> Scalar:
    """A datum that must be known when the file compiles; `known`, when given, gives every
    name defined where it is read (called only for an error: a set of every name made for
    each const read made many consts quadratic), so that an undefined name is reported as such.
    """
    if isinstance(datum, (Number, Boolean)):
        return Scalar.lit(datum.value)
    if isinstance(datum, Keyword):
        return Scalar.lit(datum.name)
    if isinstance(datum, Symbol):
        found = lookup(datum.name)
        if found is None:
            raise _not_constant(datum, known)
        return found
    if head_is(datum, "in") and len(datum.items) == 3:
        options = datum.items[2]
        if isinstance(options, Vector):
            return member(
                evaluate(datum.items[1], lookup, known),
                tuple(evaluate(item, lookup, known) for item in options.items),
            )
    if isinstance(datum, List) and datum.items and isinstance(datum.items[0], Symbol):
        head = datum.items[0].name
        operands = [evaluate(item, lookup, known) for item in datum.items[1:]]
        if head in ARITHMETIC and operands:
            if head == "-" and len(operands) == 1:
                return negate(operands[0], datum.span)
            if len(operands) < 2:
                raise SourceError(datum.span, f"'{head}' needs at least two arguments")
            result = operands[0]
            for operand in operands[1:]:
                result = fold(ARITHMETIC[head][0], result, operand, datum.span)
            return result
        if head in COMPARISONS and len(operands) == 2:
            return compare(head, *operands, datum.span)
        if head == "if" and len(operands) == 3:
            return choose(*operands, datum.span)
        if head in ("and", "or", "not") and operands:
            return logic(head, operands, datum.span)
    raise SourceError(
        datum.span,
        "expected a number known at compile time (a literal, a const, or arithmetic on them)",
    )


def head_is(datum: Datum, name: str) -> bool:
    """Whether `datum` is a list `(name ...)`."""
    return (
        isinstance(datum, List)
        and bool(datum.items)
        and isinstance(datum.items[0], Symbol)
        and datum.items[0].name == name
    )


def _not_constant(symbol: Symbol, known) -> SourceError:
    name = symbol.name
    number_like = not name[0].isalpha() or name.lower() in ("nan", "inf", "infinity")
    known = None if known is None else known()
    if known is None or name in known or number_like:
        return SourceError(
            symbol.span,
            f"'{name}' is not a constant: expected a number known at compile time",
        )
    return SourceError(
        symbol.span,
        f"unknown name '{name}': expected a const defined above{suggest(name, known)}",
    )


def expect_int(scalar: Scalar, span, what: str) -> Scalar:
    if not isinstance(scalar.value, int) or isinstance(scalar.value, bool):
        raise SourceError(
            span, f"{what} must be an integer, got {_shown(scalar.value)}"
        )
    return scalar


def _too_big(base, exponent) -> bool:
    """Whether an integer power would leave 64 bits: known from the sizes of its operands,
    before computing it (`(** 3 9223372036854775807)` would take memory without end)."""
    if not isinstance(base, int) or not isinstance(exponent, int) or exponent < 0:
        return False
    return abs(base) > 1 and exponent * (abs(base).bit_length() - 1) > 64


def _in_range(value) -> bool:
    """Finite, and an integer within torch's 64 bits."""
    if isinstance(value, int):
        return -(2**63) <= value < 2**63
    return value - value == 0.0


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _shown(value: object) -> str:
    """A scalar's value as the source writes it: `:fp16`, `true`, `1.5`."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return ":" + value
    return repr(value)
