"""Compile-time scalars: literals, consts and &key arguments, and arithmetic on them.

A scalar's operation is a `ScalarOp`; this module alone says what each computes (`compute`)
and how the dumps show it (`text`); sx2torch/emit/scalars.py writes it as Python.
"""

from __future__ import annotations

import functools
import math
import operator
from dataclasses import dataclass
from enum import Enum
from typing import Callable, Optional, Union

from sx2torch.errors import SourceError, suggest
from sx2torch.syntax.read import Boolean, Datum, Keyword, List, Number, Symbol, Vector


class ScalarOp(str, Enum):
    """What a compile-time scalar is: a leaf, or an operation named as Python writes it."""

    LIT = "lit"  # args (value,)
    CONST = "const"  # (name, ...): a model's const, read through the sub-models named after it
    KEY = "key"  # (name,): a defun's &key argument
    LAYER = "layer"  # (name,): a stack's layer index, `i` of (stack (i n) ...)
    INDEX = "index"  # (loop,): a loop node's index
    # (node,): a Python number the module computes when it runs, the value of an op whose
    # entry is a `python_number` (`(size x :axis 1)`, `x.shape[1]`): read where torch takes
    # an int, and in arithmetic, which is then written as Python's (`x.shape[1] - 1`)
    RUN = "run"
    ADD = "+"  # the arithmetic: two or more operands, folded left
    SUB = "-"
    MUL = "*"
    DIV = "/"
    FLOORDIV = "//"
    POW = "**"
    MOD = "%"
    EQ = "=="  # the comparisons and `and`, `or`: two operands
    LT = "<"
    LE = "<="
    GT = ">"
    GE = ">="
    AND = "and"
    OR = "or"
    NOT = "not"  # one operand
    NEG = "neg"
    IN = "in"  # (value, options): options a tuple of scalars, or a list scalar
    IF = "if"  # (condition, then, otherwise)
    # functions of one number, written as Python's (int) and math's: a const's is computed
    # where the module is built, so that a caller's value changes it
    INT = "int"
    FLOOR = "floor"
    CEIL = "ceil"
    LOG = "log"
    EXP = "exp"
    # math.sqrt: the bias initializer's bound, 1 / math.sqrt(fan_in), as torch computes it
    # (a const's `sqrt` is `d ** 0.5`, which differs from it for some fan-ins)
    SQRT = "sqrt"
    LIST = "list"  # the elements: a vector some of whose elements are not literals
    AT = "at"  # (list, index): an element of a list, `depths[i]`
    LEN = "len"  # (list,): its length, `len(depths)`

    __str__ = str.__str__
    __format__ = str.__format__


LEAVES = frozenset(
    {
        ScalarOp.LIT,
        ScalarOp.CONST,
        ScalarOp.KEY,
        ScalarOp.LAYER,
        ScalarOp.INDEX,
        ScalarOp.RUN,
    }
)
# A run-time number's stand-in value, for the checks that read a scalar's value (it is an
# integer); nothing is folded from it, since a scalar that reads one is never a literal.
RUN_VALUE = 1
# What the operations of two or more operands compute, folded left.
BINARY: dict[ScalarOp, Callable] = {
    ScalarOp.ADD: operator.add,
    ScalarOp.SUB: operator.sub,
    ScalarOp.MUL: operator.mul,
    ScalarOp.DIV: operator.truediv,
    ScalarOp.FLOORDIV: operator.floordiv,
    ScalarOp.POW: operator.pow,
    ScalarOp.MOD: operator.mod,
    ScalarOp.EQ: operator.eq,
    ScalarOp.LT: operator.lt,
    ScalarOp.LE: operator.le,
    ScalarOp.GT: operator.gt,
    ScalarOp.GE: operator.ge,
    ScalarOp.AND: lambda a, b: a and b,
    ScalarOp.OR: lambda a, b: a or b,
}
# What the functions of one number compute on a const (int, floor and ceil give integers).
UNARY: dict[ScalarOp, Callable] = {
    ScalarOp.INT: int,
    ScalarOp.FLOOR: math.floor,
    ScalarOp.CEIL: math.ceil,
    ScalarOp.LOG: math.log,
    ScalarOp.EXP: math.exp,
    ScalarOp.SQRT: math.sqrt,
}
# The functions a defconst may apply to numbers: those a const's value can stay.
CONST_FUNCTIONS = frozenset(("int", "floor", "ceil", "log", "exp", "sqrt"))
# The functions whose value on a literal is written as the source wrote it,
# `math.sqrt(5)` where the source has `(sqrt 5)`, not the 17 digits it folds to.
WRITTEN = frozenset(("log", "exp", "sqrt"))
# The source's words for them.
ARITHMETIC: dict[str, ScalarOp] = {
    "+": ScalarOp.ADD,
    "-": ScalarOp.SUB,
    "*": ScalarOp.MUL,
    "/": ScalarOp.DIV,
    "//": ScalarOp.FLOORDIV,
    "**": ScalarOp.POW,
    "mod": ScalarOp.MOD,
}
COMPARISONS: dict[str, ScalarOp] = {
    "=": ScalarOp.EQ,
    "<": ScalarOp.LT,
    "<=": ScalarOp.LE,
    ">": ScalarOp.GT,
    ">=": ScalarOp.GE,
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
    "int": int,
    "floor": math.floor,
    "ceil": math.ceil,
}


@dataclass(frozen=True)
class Scalar:
    """A compile-time number: a literal, a const, a defun's &key argument, or arithmetic.

    `value` is its value with every const and key at its default; `args` the literal, the
    name or the operands (`(+ k 1 1)` is Scalar(ADD, (k, 1, 1))).
    """

    op: ScalarOp
    args: tuple
    # a list const's value is a tuple of numbers, booleans or keywords
    value: Union[int, float, bool, str, tuple]

    def __post_init__(self):
        object.__setattr__(self, "op", ScalarOp(self.op))  # an unknown one is refused
        # its operands' hashes are kept, so a number a chain of lets nests a thousand deep
        # is hashed in one step, not one call per level
        object.__setattr__(self, "_hash", hash((self.op, self.args, self.value)))
        # whether it reads a number known only when the module runs: a walk for those
        # numbers passes by the operands that read none (a chain of a const's lets)
        runs = self.op is ScalarOp.RUN or any(a.runs for a in operands_of(self))
        object.__setattr__(self, "runs", runs)
        object.__setattr__(self, "bound", False)  # see `bound`

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other) -> bool:
        """Equal operations of equal operands, compared with a stack of its own."""
        if not isinstance(other, Scalar):
            return NotImplemented
        pending = [(self, other)]
        while pending:
            a, b = pending.pop()
            if a is b:
                continue
            if isinstance(a, Scalar) and isinstance(b, Scalar):
                if a._hash != b._hash or a.op is not b.op or a.value != b.value:
                    return False
                a, b = a.args, b.args
            if not (isinstance(a, tuple) and isinstance(b, tuple)):
                if a != b:
                    return False
            elif len(a) != len(b):
                return False
            else:
                pending.extend(zip(a, b))
        return True

    @staticmethod
    def lit(value: Union[int, float, bool, str]) -> "Scalar":
        return Scalar(ScalarOp.LIT, (value,), value)

    @staticmethod
    def run(node) -> "Scalar":
        """The Python number `node` gives when the module runs (ScalarOp.RUN)."""
        return Scalar(ScalarOp.RUN, (node,), RUN_VALUE)


def bound(scalar: Scalar) -> Scalar:
    """The number a `let` binds: an equal copy that a fold reads as one operand (`(+ a 2)`
    of a let's `a = (+ n 1)` is a + 2, not n + 1 + 2), so that the plan may write it by
    its name, and a chain of lets nests where the plan can cut it."""
    copy = Scalar(scalar.op, scalar.args, scalar.value)
    object.__setattr__(copy, "bound", True)
    return copy


def operands_of(scalar: Scalar) -> tuple:
    """The scalars a scalar's operation reads, the items of a tuple operand (`in`'s
    options) among them; a leaf reads none."""
    if scalar.op in LEAVES:
        return ()
    return tuple(
        a
        for arg in scalar.args
        for a in (arg if isinstance(arg, tuple) else (arg,))
        if isinstance(a, Scalar)
    )


def _every(scalar: Scalar, of) -> tuple:
    return operands_of(scalar)


# an operand's result not computed yet, as `walk_up`'s `needs` sees it
PENDING = object()


def walk_up(root: Scalar, result: Callable, needs: Callable = _every, done=None):
    """`result(scalar, of)` of `root`, each scalar's computed after those of the operands
    it `needs(scalar, of)` (by default all of them; `of` gives PENDING for one not yet
    computed), which `of(operand)` then gives. The walk keeps a stack of its own, not
    Python's: a number that a chain of a thousand lets builds is read as any other. A
    scalar the tree holds twice is visited once; `done` (id -> result) may be shared by
    the walks over numbers that share operands, each then visited once in all."""
    done = {} if done is None else done

    def of(operand: Scalar):
        return done[id(operand)]

    def so_far(operand: Scalar):
        return done.get(id(operand), PENDING)

    stack = [root]
    while stack:
        scalar = stack[-1]
        if id(scalar) in done:
            stack.pop()
            continue
        pending = [s for s in needs(scalar, so_far) if id(s) not in done]
        if pending:
            stack.extend(reversed(pending))
            continue
        done[id(scalar)] = result(scalar, of)
        stack.pop()
    return done[id(root)]


def scalars_in(value) -> list:
    """The scalars in a value: itself, or the items of a tuple or list, or the values of
    a dict (a call's keys), however nested."""
    found, pending = [], [value]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            item = tuple(item.values())
        if isinstance(item, (tuple, list)):
            pending.extend(reversed(item))
        elif isinstance(item, Scalar):
            found.append(item)
    return found


def run_nodes(value) -> list:
    """The nodes whose run-time numbers a scalar (or a tuple of them) reads, in order."""
    return [
        n for s in scalars_in(value) if s.runs for n in walk_up(s, _run_nodes, _running)
    ]


def _running(scalar: Scalar, of) -> tuple:
    return tuple(a for a in operands_of(scalar) if a.runs)


def _run_nodes(scalar: Scalar, of) -> list:
    if scalar.op is ScalarOp.RUN:
        return [scalar.args[0]]
    return [n for operand in _running(scalar, of) for n in of(operand)]


def compute(scalar: Scalar, env: dict):
    """A scalar's value with the consts, keys and layer indices of `env` (defaults for the
    rest)."""
    return walk_up(scalar, lambda s, of: _computed(s, of, env), _needed)


def _needed(scalar: Scalar, of) -> tuple:
    """The operands a value is computed from: an `if`'s condition, then the branch it
    takes alone (the other may divide by zero, or index out of range)."""
    if scalar.op is not ScalarOp.IF:
        return operands_of(scalar)
    condition, then, otherwise = scalar.args
    if of(condition) is PENDING:
        return (condition,)
    return (then if of(condition) else otherwise,)


def _computed(scalar: Scalar, of, env: dict):
    op, args = scalar.op, scalar.args
    if op is ScalarOp.LIT:
        return scalar.value
    if op in LEAVES:
        return env.get(args[0], scalar.value)
    if op is ScalarOp.NEG:
        return -of(args[0])
    if op is ScalarOp.NOT:
        return not of(args[0])
    if op in UNARY:
        return UNARY[op](of(args[0]))
    if op is ScalarOp.IN:
        options = args[1]
        return of(args[0]) in (
            list(of(options)) if isinstance(options, Scalar) else map(of, options)
        )
    if op is ScalarOp.IF:
        condition, then, otherwise = args
        return of(then if of(condition) else otherwise)
    if op is ScalarOp.LIST:
        return tuple(of(a) for a in args)
    if op is ScalarOp.AT:
        return of(args[0])[of(args[1])]
    if op is ScalarOp.LEN:
        return len(of(args[0]))
    return functools.reduce(BINARY[op], (of(a) for a in args))


def text(scalar: Scalar, leaf) -> str:
    """A scalar as the dumps show it, its leaves (but literals) written by `leaf`."""
    return walk_up(scalar, lambda s, of: _text(s, of, leaf))


def _text(scalar: Scalar, of, leaf) -> str:
    op, args = scalar.op, scalar.args
    if op is ScalarOp.LIT:
        return (
            _shown(scalar.value)
            if isinstance(scalar.value, tuple) or scalar.value is None
            else repr(scalar.value)
        )
    if op in LEAVES:
        return leaf(scalar)
    shown = [of(a) if isinstance(a, Scalar) else a for a in args]
    if op is ScalarOp.NEG:
        return f"-({shown[0]})"
    if op is ScalarOp.NOT:
        return f"(not {shown[0]})"
    if op is ScalarOp.IN and isinstance(args[1], Scalar):
        return f"({shown[0]} in {shown[1]})"
    if op in UNARY:
        return f"{op}({shown[0]})"
    if op is ScalarOp.IN:
        return f"({shown[0]} in [{' '.join(of(o) for o in args[1])}])"
    if op is ScalarOp.LIST:
        return f"[{' '.join(shown)}]"
    if op is ScalarOp.AT:
        return f"{shown[0]}[{shown[1]}]"
    if op is ScalarOp.LEN:
        return f"len({shown[0]})"
    if op is ScalarOp.IF:
        condition, then, otherwise = shown
        return f"({then} if {condition} else {otherwise})"
    return "(" + f" {op} ".join(shown) + ")"


Lookup = Callable[[str], Optional[Scalar]]
# Operands of one chain of compile-time arithmetic: Python's compiler refuses about 3000.
MAX_OPERANDS = 2000


def _made(op: ScalarOp, args: tuple, value) -> Scalar:
    """A scalar that folds to a literal when every leaf is one: only the source decides."""
    if all(map(_literal, scalars_in(args))):
        return Scalar.lit(value)
    return Scalar(op, args, value)


def compare(op: str, operands: list, span) -> Scalar:
    """A comparison of numbers known when the module runs, or `=` of two keywords (a
    layer's type, `(= (at layer-types i) :sliding)`): a condition for `if`."""
    comparison, (left, right) = COMPARISONS[op], operands
    keywords = isinstance(left.value, str) and isinstance(right.value, str)
    for operand in (left, right) if not (keywords and op == "=") else ():
        if not _is_number(operand.value):
            raise SourceError(
                span,
                f"'{op}' compares numbers (or '=' two keywords), got "
                f"{_shown(operand.value)}",
            )
    value = BINARY[comparison](left.value, right.value)
    return _made(comparison, (left, right), value)


def logic(op: str, operands: list, span) -> Scalar:
    """`and`, `or` (n-ary, folded left) and `not` of conditions."""
    for operand in operands:
        if not isinstance(operand.value, bool):
            raise SourceError(
                span, f"'{op}' takes conditions, got {_shown(operand.value)}"
            )
    if op == "not":
        return _made(ScalarOp.NOT, (operands[0],), not operands[0].value)
    combine, result = ScalarOp(op), operands[0]
    for operand in operands[1:]:
        value = BINARY[combine](result.value, operand.value)
        result = _made(combine, (result, operand), value)
    return result


def member(value: Scalar, options) -> Scalar:
    """`(in X [A B ...])`, the options a tuple of scalars, or `(in X LIST)` of a list."""
    if isinstance(options, Scalar):
        return _made(ScalarOp.IN, (value, options), value.value in options.value)
    return _made(
        ScalarOp.IN, (value, options), value.value in [o.value for o in options]
    )


def vector(items: list, span) -> Scalar:
    """A list of numbers, booleans or keywords, `[3 3 9 3]`, `[:full :sliding]`: a literal
    where each element is one, else a LIST of them (`[d (* 2 d)]`)."""
    for item in items:
        if isinstance(item.value, tuple):
            raise SourceError(
                span, "a list's elements are numbers, booleans or keywords, not lists"
            )
        expect_some(item, span)
    value = tuple(item.value for item in items)
    if all(item.op is ScalarOp.LIT for item in items):
        return Scalar.lit(value)
    return Scalar(ScalarOp.LIST, tuple(items), value)


def element(operands: list, span) -> Scalar:
    """`(at LIST I)` of a list const or &key: its element I (from the end where I < 0, as
    Python's), I an integer known when the module is built; out of range at the defaults
    is a diagnostic here, and with an instance's arguments when it is built."""
    items, index = operands
    if not isinstance(items.value, tuple):
        raise SourceError(
            span,
            f"'at' of numbers reads an element of a list, got {_shown(items.value)}",
        )
    expect_int(index, span, "the index of 'at'")
    count = len(items.value)
    if not -count <= index.value < count:
        raise SourceError(
            span,
            f"index {index.value} is out of range for the list {_shown(items.value)} of "
            f"{count} elements (with the consts at their defaults)",
        )
    return _made(ScalarOp.AT, (items, index), items.value[index.value])


def length(operands: list, span) -> Scalar:
    """`(len LIST)`: how many elements a list const or &key has."""
    (items,) = operands
    if not isinstance(items.value, tuple):
        raise SourceError(
            span, f"'len' of numbers needs a list, got {_shown(items.value)}"
        )
    return _made(ScalarOp.LEN, (items,), len(items.value))


def choose(condition: Scalar, then: Scalar, otherwise: Scalar, span) -> Scalar:
    """`(if c a b)` of numbers: typed by its branches, which must agree."""
    if _is_number(then.value) != _is_number(otherwise.value):
        raise SourceError(span, "the branches of this if give a number and a condition")
    value = then.value if condition.value else otherwise.value
    return Scalar(ScalarOp.IF, (condition, then, otherwise), value)


def fold(
    op: ScalarOp, left: Scalar, right: Scalar, span, literal: bool = True
) -> Scalar:
    """Arithmetic on two scalars, evaluated now with every const at its default; of two
    literals, a literal (`literal`), else the operation with that value."""
    for operand in (left, right):
        if not _is_number(operand.value):
            raise SourceError(
                span, f"arithmetic needs numbers, got {_shown(operand.value)}"
            )
    if op is ScalarOp.POW and _too_big(left.value, right.value):
        raise SourceError(
            span, "number out of range (with the consts at their defaults)"
        )
    try:
        value = BINARY[op](left.value, right.value)
    except ZeroDivisionError:
        if run_nodes(
            (left, right)
        ):  # by a size's stand-in: Python raises it when it runs
            return Scalar(op, _operands(op, left, right, span), RUN_VALUE)
        raise SourceError(
            span, "division by zero (with the consts at their defaults)"
        ) from None
    except OverflowError:
        value = float("inf")
    if isinstance(value, complex):  # Python's power of a negative base to a fraction
        raise SourceError(
            span,
            f"{_shown(left.value)} ** {_shown(right.value)} is not a real number "
            "(with the consts at their defaults)",
        )
    if not _in_range(value):
        raise SourceError(
            span, "number out of range (with the consts at their defaults)"
        )
    if literal and left.op is right.op is ScalarOp.LIT:
        return Scalar.lit(value)
    return Scalar(op, _operands(op, left, right, span), value)


def spelled(datum: Datum) -> Optional[Scalar]:
    """Arithmetic of literals as the source spells it, `(/ 2.0 3.141592653589793)` the
    division with the value it folds to, where a function WRITTEN reads it; None where
    `datum` is no such arithmetic."""
    if isinstance(datum, Number):
        return Scalar.lit(datum.value)
    if not (isinstance(datum, List) and datum.items and head_in(datum, ARITHMETIC)):
        return None
    parts = [spelled(item) for item in datum.items[1:]]
    if len(parts) < 2 or None in parts:
        return None
    result = parts[0]
    for part in parts[1:]:
        result = fold(ARITHMETIC[datum.items[0].name], result, part, datum.span, False)
    return result


def _literal(scalar: Scalar) -> bool:
    """Whether a number is made of literals alone."""
    return walk_up(scalar, _of_literals)


def _of_literals(scalar: Scalar, of) -> bool:
    if scalar.op is ScalarOp.LIT:
        return True
    return scalar.op in BINARY and all(of(a) for a in scalar.args)


def _operands(op: ScalarOp, left: Scalar, right: Scalar, span) -> tuple:
    """A left fold `(+ k 1 1 ...)` is one flat Scalar(ADD, (k, 1, 1, ...)), so that nothing
    that reads scalars recurses once per operand; a let's number stays one operand."""
    if left.op is not op or left.bound:
        return left, right
    if len(left.args) >= MAX_OPERANDS:
        raise SourceError(
            span, f"compile-time arithmetic takes at most {MAX_OPERANDS} operands"
        )
    return left.args + (right,)


def function(name: str, operands: list, span) -> Scalar:
    """An op of the library applied to numbers alone: `(log 2.0)`, `(pow d 0.5)`, `(sqrt d)`,
    `(int (* factor head-dim))`. A literal's is folded, but for the functions WRITTEN as
    the source spells them; a const's stays an operation (a caller may change the const),
    computed where the module is built; a const's sqrt is a power, as it was written
    before the functions of consts came.
    """
    if name == "pow":
        return fold(ScalarOp.POW, *operands, span)
    (operand,) = operands
    if not _is_number(operand.value):
        raise SourceError(span, f"'{name}' needs a number, got {_shown(operand.value)}")
    if not _literal(operand) and name == "sqrt":
        return fold(ScalarOp.POW, operand, Scalar.lit(0.5), span)
    try:
        value = FUNCTIONS[name](operand.value)
    except (ValueError, OverflowError, ZeroDivisionError):
        raise SourceError(
            span,
            f"'{name}' is not defined at {operand.value!r}"
            + (
                ""
                if operand.op is ScalarOp.LIT
                else " (with the consts at their defaults)"
            ),
        ) from None
    if not _in_range(value):
        raise SourceError(
            span, "number out of range (with the consts at their defaults)"
        )
    if _literal(operand) and name not in WRITTEN:
        return Scalar.lit(value)
    if name not in CONST_FUNCTIONS:
        raise SourceError(
            span,
            f"'{name}' of a const is not known when the file compiles: write it with "
            "+ - * / ** int floor ceil log exp sqrt on the const, or on a tensor",
        )
    return Scalar(ScalarOp(name), (operand,), value)


def arithmetic(op: ScalarOp, operands: list, span) -> Scalar:
    """An arithmetic op of the library on two numbers, or a negation (`-` of one)."""
    if op is ScalarOp.NEG or len(operands) == 1:
        return negate(operands[0], span)
    return fold(op, *operands, span)


def negate(operand: Scalar, span) -> Scalar:
    if not _is_number(operand.value):
        raise SourceError(
            span, f"arithmetic needs numbers, got {_shown(operand.value)}"
        )
    if not _in_range(-operand.value):
        raise SourceError(
            span, "number out of range (with the consts at their defaults)"
        )
    return Scalar(ScalarOp.NEG, (operand,), -operand.value)


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
    if isinstance(datum, Vector):
        return vector(
            [evaluate(item, lookup, known) for item in datum.items], datum.span
        )
    if head_is(datum, "in") and len(datum.items) == 3:
        options = datum.items[2]
        value = evaluate(datum.items[1], lookup, known)
        if isinstance(options, Vector):
            return member(
                value, tuple(evaluate(item, lookup, known) for item in options.items)
            )
        return member(
            value, _list(evaluate(options, lookup, known), options.span, "in")
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
                result = fold(ARITHMETIC[head], result, operand, datum.span)
            return result
        if head in COMPARISONS and len(operands) == 2:
            return compare(head, operands, datum.span)
        if head == "if" and len(operands) == 3:
            return choose(*operands, datum.span)
        if head in CONST_FUNCTIONS and len(operands) == 1:
            if head in WRITTEN:  # `math.sqrt(2.0 / 3.0)`, as the source spells it
                operands = [spelled(datum.items[1]) or operands[0]]
            return function(head, operands, datum.span)
        if head in ("and", "or", "not") and operands:
            return logic(head, operands, datum.span)
        if head == "at" and len(operands) == 2:
            return element(operands, datum.span)
        if head == "len" and len(operands) == 1:
            return length(operands, datum.span)
    raise SourceError(
        datum.span,
        "expected a number known at compile time (a literal, a const, or arithmetic on them)",
    )


def head_in(datum: List, names) -> bool:
    """Whether the list `datum`'s head is a symbol among `names`."""
    return isinstance(datum.items[0], Symbol) and datum.items[0].name in names


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
        if run_nodes(scalar):  # its value is a size's stand-in's
            raise SourceError(
                span,
                f"{what} must be an integer, got a number computed from a size that "
                "may not be one: divide sizes with //",
            )
        raise SourceError(
            span, f"{what} must be an integer, got {_shown(scalar.value)}"
        )
    return scalar


def expect_some(value, span):
    """`value`, unless it is a number whose value is none (a model's &key whose default is
    `none`): only a key that takes none reads one (take's :padding-idx), never an
    operand, a size or a condition."""
    if isinstance(value, Scalar) and value.value is None:
        raise SourceError(
            span,
            "this number is none (a &key whose default is none): only a key that takes "
            "none reads it, as take's :padding-idx",
        )
    return value


def _list(scalar: Scalar, span, what: str) -> Scalar:
    if not isinstance(scalar.value, tuple):
        raise SourceError(
            span, f"'{what}' takes a vector or a list, got {_shown(scalar.value)}"
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
    """A scalar's value as the source writes it: `:fp16`, `true`, `1.5`, `[3 3 9 3]`."""
    if isinstance(value, tuple):
        return f"[{' '.join(_shown(v) for v in value)}]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return ":" + value
    return "none" if value is None else repr(value)
