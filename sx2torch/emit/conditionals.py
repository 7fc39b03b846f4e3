"""A statement whose whole value is a conditional expression, written as `if` statements
where the expression nests or does not fit its line (docs/LANGUAGE.md, "Conditions and
loops"): `return A if c else B` becomes `if c: return A` then `return B`, and
`x = A if c else B` an if/else that assigns `x` in each branch (`elif` for a conditional in
the else branch; a branch that would give `x` back, `x` itself or None under `x is None`,
left out, the test negated where it is the then branch). Black would split such a line into
a block of `(`, `if`, `else` lines, which a reader has to untangle.

Only the spelling changes: a conditional expression evaluates its condition and then one
branch, as the statements do, and the flags it reads are Python values on the module, so
torch.compile sees the same choices. The rule reads the written code alone, at its depth
in the module: one-line conditionals, and those inside a larger expression, stay as they
are."""

from __future__ import annotations

import libcst as cst

import sx2torch.build as b

INDENT = 4  # an indented block's width, as libcst writes it and black keeps it


def statements(module: cst.Module) -> cst.Module:
    """The module with each such statement written as `if` statements. Only statements
    are walked, never into an expression: a long chain of operands nests deeper than a
    visitor of every node may recurse."""
    return module.with_changes(body=_block(module.body, 0))


def _block(body, depth: int) -> list:
    """A block's statements at `depth` blocks in, rewritten."""
    found = []
    for statement in body:
        if isinstance(statement, cst.SimpleStatementLine):
            found += _written(statement, depth * INDENT) or [statement]
        else:
            found.append(_compound(statement, depth))
    return found


def _compound(statement, depth: int):
    """A compound statement (`def`, `class`, `with`, `for`, `if`) with its blocks'
    statements rewritten; an `else` or `elif` sits at the depth of its `if`."""
    changes = {}
    if isinstance(statement.body, cst.IndentedBlock):
        inner = _block(statement.body.body, depth + 1)
        changes["body"] = statement.body.with_changes(body=inner)
    if getattr(statement, "orelse", None) is not None:
        changes["orelse"] = _compound(statement.orelse, depth)
    return statement.with_changes(**changes)


def _written(line: cst.SimpleStatementLine, indent: int):
    """The `if` statements for a line's one statement, or None where it stays as it is."""
    if len(line.body) != 1:
        return None
    (statement,) = line.body
    value = getattr(statement, "value", None)
    if not isinstance(statement, (cst.Return, cst.Assign)) or not _conditional(value):
        return None
    returns = isinstance(statement, cst.Return)
    if not (returns and _nests(value) or _too_long(line, indent)):
        return None
    comment = line.trailing_whitespace  # `# file.lisp:LINE:COL`, on each line written

    def simple(small: cst.BaseSmallStatement) -> cst.SimpleStatementLine:
        return cst.SimpleStatementLine([small], trailing_whitespace=comment)

    written = (
        _returns(value, simple)
        if returns
        else _assigns(statement.targets, value, simple)
    )
    first, *rest = written
    return [first.with_changes(leading_lines=line.leading_lines), *rest]


def _conditional(value) -> bool:
    return isinstance(value, cst.IfExp)


def _nests(value: cst.IfExp) -> bool:
    """Whether a branch's value is a conditional itself."""
    return _conditional(value.body) or _conditional(value.orelse)


def _too_long(line: cst.SimpleStatementLine, indent: int) -> bool:
    bare = line.with_changes(
        leading_lines=[], trailing_whitespace=cst.TrailingWhitespace()
    )
    text = cst.Module([]).code_for_node(bare).rstrip("\n")
    return indent + len(text) > b.LINE_LENGTH


def _unwrapped(value: cst.BaseExpression) -> cst.BaseExpression:
    """A branch's conditional without the parentheses it needed inside the other."""
    return value.with_changes(lpar=[], rpar=[]) if _conditional(value) else value


def _returns(value: cst.BaseExpression, simple) -> list:
    """`if c: return A` (its own statements where A is a conditional), then B's."""
    value = _unwrapped(value)
    if not _conditional(value):
        return [simple(cst.Return(value))]
    then = cst.IndentedBlock(_returns(value.body, simple))
    return [cst.If(value.test, then), *_returns(value.orelse, simple)]


def _assigns(targets, value: cst.BaseExpression, simple) -> list:
    """`x = A`, or the `if` statement that assigns `x` in each branch."""
    value = _unwrapped(value)
    if not _conditional(value):
        return [simple(cst.Assign(targets, value))]
    return [_assigning_if(targets, value, simple)]


def _assigning_if(targets, value: cst.IfExp, simple) -> cst.If:
    """`if c: x = A`, an `elif` for a conditional B, else `x = B` unless B is `x`; where A
    is `x`, `if not c: x = B`."""
    otherwise = _unwrapped(value.orelse)
    if _keeps(targets, value.body, value.test, cst.Is) and not _conditional(otherwise):
        return cst.If(
            _negated(value.test),
            cst.IndentedBlock(_assigns(targets, otherwise, simple)),
        )
    then = cst.IndentedBlock(_assigns(targets, value.body, simple))
    if _conditional(otherwise):
        orelse = _assigning_if(targets, otherwise, simple)
    elif _keeps(targets, otherwise, value.test, cst.IsNot):
        orelse = None
    else:
        orelse = cst.Else(cst.IndentedBlock(_assigns(targets, otherwise, simple)))
    return cst.If(value.test, then, orelse=orelse)


NEGATED = {
    cst.Is: cst.IsNot,
    cst.IsNot: cst.Is,
    cst.Equal: cst.NotEqual,
    cst.NotEqual: cst.Equal,
    cst.In: cst.NotIn,
    cst.NotIn: cst.In,
}


def _negated(test: cst.BaseExpression) -> cst.BaseExpression:
    """`x is not None` for `x is None`, `a` for `not a`, else `not test`. An order is not
    turned around: `not a < b` is not `a >= b` for a NaN."""
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return test.expression.with_changes(lpar=[], rpar=[])
    if (
        isinstance(test, cst.Comparison)
        and len(test.comparisons) == 1
        and not test.lpar
    ):
        (target,) = test.comparisons
        flipped = NEGATED.get(type(target.operator))
        if flipped is not None:
            return test.with_changes(
                comparisons=[target.with_changes(operator=flipped())]
            )
    return cst.UnaryOperation(cst.Not(), b.at_least(test, b.NOT))


def _keeps(targets, value: cst.BaseExpression, test, none_when) -> bool:
    """Whether `targets = value` leaves the target as it is, where the branch runs: the
    target itself, or None where `test` is `target is None` (`none_when`: `Is`) for the
    then branch, `target is not None` (`IsNot`) for the else branch."""
    if len(targets) != 1:
        return False
    target = targets[0].target
    if value.deep_equals(target):
        return True
    none = cst.Name("None")
    return (
        value.deep_equals(none)
        and isinstance(test, cst.Comparison)
        and test.left.deep_equals(target)
        and len(test.comparisons) == 1
        and isinstance(test.comparisons[0].operator, none_when)
        and test.comparisons[0].comparator.deep_equals(none)
    )
