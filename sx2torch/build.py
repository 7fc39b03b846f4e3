"""Small constructors for libcst expressions that parenthesize by precedence, spaced as
black spaces them, so that a statement that fits on its line is already black's (see
sx2torch/format.py)."""

from __future__ import annotations

import keyword

import libcst as cst
from libcst._nodes.internal import CodegenState

Expr = cst.BaseExpression

BINARY = {
    "+": (cst.Add, 12),
    "-": (cst.Subtract, 12),
    "*": (cst.Multiply, 13),
    "/": (cst.Divide, 13),
    "//": (cst.FloorDivide, 13),
    "%": (cst.Modulo, 13),
    "@": (cst.MatrixMultiply, 13),
    "**": (cst.Power, 15),
}
# a binary operator's class -> its level: `precedence` looks one up per operand written
LEVEL = {kind: level for kind, level in BINARY.values()}
COMPARE = {
    "<": cst.LessThan,
    "<=": cst.LessThanEqual,
    ">": cst.GreaterThan,
    ">=": cst.GreaterThanEqual,
    "==": cst.Equal,
    "in": cst.In,
}
LINE_LENGTH = 88  # black's width in its default mode, the one used
ATOM = 20
NO_SPACE = cst.SimpleWhitespace("")
SPACE = cst.SimpleWhitespace(" ")
KEYWORD_EQUAL = cst.AssignEqual(whitespace_before=NO_SPACE, whitespace_after=NO_SPACE)
# One instance of each operator, spaced as black spaces it: libcst's nodes are immutable,
# so every expression shares them (a node's defaults make and validate new ones each time)
OPERATOR = {op: kind(SPACE, SPACE) for op, (kind, _) in BINARY.items()}
HUGGED_POWER = cst.Power(NO_SPACE, NO_SPACE)  # `x**2`
UNARY = 14
COMPARISON = 7
NOT, AND, OR, CONDITIONAL = 4, 3, 2, 1


# the nodes most operands are, always atoms: found by their type at once, not by five
# isinstance checks against libcst's abstract classes
ATOMS = frozenset({cst.Name, cst.Call, cst.Attribute, cst.Float, cst.Integer})


def precedence(node: Expr) -> int:
    if type(node) in ATOMS:
        return ATOM
    if isinstance(node, cst.BinaryOperation) and not node.lpar:
        return LEVEL[type(node.operator)]
    if isinstance(node, cst.UnaryOperation) and not node.lpar:
        return NOT if isinstance(node.operator, cst.Not) else UNARY
    if isinstance(node, cst.BooleanOperation) and not node.lpar:
        return AND if isinstance(node.operator, cst.And) else OR
    if isinstance(node, cst.IfExp) and not node.lpar:
        return CONDITIONAL
    if isinstance(node, cst.Comparison) and not node.lpar:
        return COMPARISON
    return ATOM


def parens(node: Expr) -> Expr:
    return node.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


def at_least(node: Expr, level: int) -> Expr:
    return node if precedence(node) >= level else parens(node)


def name(identifier: str) -> cst.Name:
    return cst.Name(identifier)


def attr(obj: Expr, *names: str) -> Expr:
    # `16.t` reads as `16.` `t`; black writes a float's attribute `(1.5).t` too
    numeral = isinstance(obj, (cst.Integer, cst.Float))
    node = parens(obj) if numeral else at_least(obj, ATOM)
    for part in names:
        node = cst.Attribute(node, cst.Name(part))
    return node


def member(obj: Expr, key: str, store: str | None = None) -> Expr:
    """`obj.key`; a member whose key is a Python keyword is read with `getattr(obj, "key")`,
    one whose key is nn.Module's own attribute (`type`, `to`) from its store:
    `obj._parameters["type"]`."""
    if store is None:
        return attr(obj, key)
    if keyword.iskeyword(key):
        return call("getattr", obj, string(key))
    return subscript(attr(obj, f"_{store}"), string(key))


def dotted(path: str) -> Expr:
    head, *rest = path.split(".")
    return attr(cst.Name(head), *rest) if rest else cst.Name(head)


def call(func: Expr | str, *args: Expr, **kwargs: Expr) -> cst.Call:
    func = dotted(func) if isinstance(func, str) else func
    arguments = [a if isinstance(a, cst.Arg) else _arg(a) for a in args]
    arguments += [
        _arg(v, keyword=cst.Name(k), equal=KEYWORD_EQUAL) for k, v in kwargs.items()
    ]
    return cst.Call(
        func, arguments, whitespace_after_func=NO_SPACE, whitespace_before_args=NO_SPACE
    )


def _arg(value: Expr, **fields) -> cst.Arg:
    """An argument, its whitespace shared (see OPERATOR)."""
    return cst.Arg(
        value, whitespace_after_star=NO_SPACE, whitespace_after_arg=NO_SPACE, **fields
    )


def star(value: Expr) -> cst.Arg:
    """`*value`, an argument of a call."""
    return _arg(value, star="*")


def method(obj: Expr, method_name: str, *args: Expr, **kwargs: Expr) -> cst.Call:
    return call(attr(obj, method_name), *args, **kwargs)


def binop(left: Expr, op: str, right: Expr) -> Expr:
    level = BINARY[op][1]
    # right-associative, and binds tighter than a unary minus on its left
    if op == "**":
        left, right = at_least(left, ATOM), at_least(right, UNARY)
    else:
        left, right = at_least(left, level), at_least(right, level + 1)
        left, right = _unmixed(left, op), _unmixed(right, op)
    if op == "**" and _simple_power_operand(left) and _simple_power_operand(right):
        return cst.BinaryOperation(left, HUGGED_POWER, right)
    return cst.BinaryOperation(left, OPERATOR[op], right)


def _unmixed(operand: Expr, op: str) -> Expr:
    """`(a @ b) * c`, `(x * r) @ w`: `@` beside `*`, `/` or `**` binds alike or tighter
    by rules a reader must recall, so the operand is parenthesized."""
    if op not in ("@", "*", "/") or not isinstance(operand, cst.BinaryOperation):
        return operand
    if operand.lpar:
        return operand
    inner = isinstance(operand.operator, cst.MatrixMultiply)
    other = isinstance(operand.operator, (cst.Multiply, cst.Divide, cst.Power))
    return (
        parens(operand) if (op == "@" and other) or (op != "@" and inner) else operand
    )


def _simple_power_operand(node: Expr) -> bool:
    """Black hugs `**` between operands that are each a name, a number or an attribute
    chain, after at most one unary operator."""
    if isinstance(node, cst.UnaryOperation) and not node.lpar:
        if isinstance(node.operator, cst.Not):
            return False
        node = node.expression
    while isinstance(node, cst.Attribute) and not node.lpar:
        node = node.value
    return not node.lpar and isinstance(
        node, (cst.Name, cst.Integer, cst.Float, cst.Imaginary)
    )


def chain(op: str, operands: list) -> Expr:
    """`a op b op c ...`, a left fold, written without recursion however long it is."""
    result = operands[0]
    for operand in operands[1:]:
        result = binop(result, op, operand)
    return _flat(result) if isinstance(result, cst.BinaryOperation) else result


class _FlatBinaryOperation(cst.BinaryOperation):
    """A left-deep chain whose code is written by a loop down its left operands: libcst's own
    codegen recurses once per operation and exhausts Python's stack at a few hundred."""

    def _codegen_impl(self, state) -> None:
        spine = [self]
        while (
            isinstance(spine[-1].left, cst.BinaryOperation) and not spine[-1].left.lpar
        ):
            spine.append(spine[-1].left)
        with self._parenthesize(state):
            spine[-1].left._codegen(state)
            for node in reversed(spine):
                node.operator._codegen(state)
                node.right._codegen(state)


def _flat(node: cst.BinaryOperation) -> Expr:
    return _FlatBinaryOperation(
        node.left, node.operator, node.right, node.lpar, node.rpar
    )


def compare(left: Expr, op: str, right: Expr) -> Expr:
    return cst.Comparison(
        at_least(left, COMPARISON + 1),
        [cst.ComparisonTarget(COMPARE[op](), at_least(right, COMPARISON + 1))],
    )


def neg(operand: Expr) -> Expr:
    return cst.UnaryOperation(cst.Minus(), at_least(operand, UNARY))


def number(value: int | float | bool | str | tuple | None) -> Expr:
    """A scalar's literal; a keyword scalar (a const `(defconst mode :fast)`) is its name as
    a string, a list const a tuple of them (an immutable default: `depths=(3, 3, 9, 3)`).
    """
    if isinstance(value, tuple):
        return tuple_([number(v) for v in value])
    if isinstance(value, str):
        return string(value)
    if isinstance(value, bool):
        return cst.Name("True" if value else "False")
    if value is None:  # a model's &key whose default is `none`
        return cst.Name("None")
    if value < 0 or (isinstance(value, float) and str(value).startswith("-")):
        return neg(number(-value))
    if isinstance(value, int):
        return cst.Integer(str(value))
    if value == float("inf"):
        return dotted("torch.inf")
    return cst.Float(repr(value).replace("e+", "e"))  # black drops an exponent's plus


def literal(value) -> Expr:
    """A Python value of the module's data (the tensor-parallel plan, a training run's
    settings: dicts, lists, tuples, strings, numbers) as black writes it, strings
    double-quoted, where `repr` quotes them singly."""
    if isinstance(value, dict):
        return cst.Dict(
            [cst.DictElement(literal(k), literal(v)) for k, v in value.items()]
        )
    if isinstance(value, list):
        return list_([literal(v) for v in value])
    if isinstance(value, tuple):
        return tuple_([literal(v) for v in value])
    return number(value)


def string(value: str) -> cst.SimpleString:
    return cst.SimpleString(_quote(value))


def docstring(value: str) -> cst.SimpleString:
    """A docstring whose value is exactly `value` after black: triple-quoted where that is plainly
    safe, else an escaped one-line literal. Black strips a docstring's surrounding spaces,
    re-indents its lines and pads a quote at either end, so those are escaped: no newline,
    no space or quote at either end is left literal."""
    plain = all(c.isprintable() and c != "\\" for c in value) and '"""' not in value
    if plain and value.strip() == value and not (value[:1] == '"' or value[-1:] == '"'):
        return cst.SimpleString('"""' + value + '"""')
    body = _quote(value)[1:-1]
    if body.endswith('\\"'):
        body = body[:-2] + "\\x22"
    start = len(body) - len(body.lstrip(" "))
    end = max(start, len(body.rstrip(" ")))
    body = "\\x20" * start + body[start:end] + "\\x20" * (len(body) - end)
    return cst.SimpleString('"' + body + '"')


def _quote(value: str) -> str:
    """A double-quoted Python literal whose value is exactly `value`."""
    return '"' + "".join(_quote_char(c) for c in value) + '"'


def _quote_char(c: str) -> str:
    if c in '"\\':
        return "\\" + c
    return c if c.isprintable() else c.encode("unicode_escape").decode()


def tuple_(items: list[Expr]) -> Expr:
    return cst.Tuple([cst.Element(i) for i in items])


def list_(items: list[Expr]) -> cst.List:
    return cst.List([cst.Element(i) for i in items])


def slice_(
    lower: Expr | None, upper: Expr | None, step: Expr | None = None
) -> cst.Slice:
    """`lower:upper` (`lower:upper:step`); black spaces the colons like a binary operator
    where any bound is more than a name, a number or a unary operator on one."""
    if all(_trivial_bound(bound) for bound in (lower, upper, step)):
        return cst.Slice(lower, upper, step)

    def colon(before, after) -> cst.Colon:
        return cst.Colon(
            whitespace_before=SPACE if before is not None else NO_SPACE,
            whitespace_after=SPACE if after is not None else NO_SPACE,
        )

    if step is None:
        return cst.Slice(lower, upper, first_colon=colon(lower, upper))
    return cst.Slice(
        lower,
        upper,
        step,
        first_colon=colon(lower, upper),
        second_colon=colon(upper, step),
    )


def _trivial_bound(node: Expr | None) -> bool:
    while isinstance(node, cst.UnaryOperation) and not isinstance(
        node.operator, cst.Not
    ):
        node = node.expression
    return node is None or isinstance(
        node, (cst.Name, cst.Integer, cst.Float, cst.Imaginary, cst.SimpleString)
    )


def subscript(obj: Expr, index: Expr) -> cst.Subscript:
    return cst.Subscript(at_least(obj, ATOM), [cst.SubscriptElement(cst.Index(index))])


def code(node: cst.CSTNode) -> str:
    """`node`'s code, as libcst's `Module.code` writes it (four-space indents, `\\n`)."""
    state = _CodegenState(default_indent="    ", default_newline="\n")
    node._codegen(state)
    return "".join(state.tokens)


class _NoPosition:
    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc) -> bool:
        return False


_NO_POSITION = _NoPosition()


class _CodegenState(CodegenState):
    """libcst's codegen records each node's position through a generator-based context
    manager, a third of its time on a module of thousands of lines; nothing here reads
    positions."""

    __slots__ = ()

    def record_syntactic_position(self, node, *, start_node=None, end_node=None):
        return _NO_POSITION
