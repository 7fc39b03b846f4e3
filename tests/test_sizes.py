"""No class over 250 lines and no function over 60 in sx2torch/ (issue 19), tables excepted.

A table is a function whose body, its docstring aside, is one `return` or assignment of a
literal display (a dict, list, tuple or set), or a class whose body, its docstring aside, is
only assignments: data laid out, not code to follow. A class's or function's lines run from
its `def`/`class` line (decorators not counted) to its last line.
"""

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "sx2torch"
LIMITS = {ast.ClassDef: 250, ast.FunctionDef: 60, ast.AsyncFunctionDef: 60}
DISPLAYS = (ast.Dict, ast.List, ast.Tuple, ast.Set)


def _body(node) -> list:
    """The statements of a definition, its docstring left out."""
    body = node.body
    first = body[0]
    docstring = (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    )
    return body[1:] if docstring else body


def is_table(node) -> bool:
    body = _body(node)
    if isinstance(node, ast.ClassDef):
        return all(isinstance(s, (ast.Assign, ast.AnnAssign)) for s in body)
    if len(body) != 1:
        return False
    (statement,) = body
    return isinstance(
        statement, (ast.Return, ast.Assign, ast.AnnAssign)
    ) and isinstance(statement.value, DISPLAYS)


def sizes(path: pathlib.Path):
    """(qualified name, kind, lines) of every class and function in a module."""

    def visit(node, prefix: str):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, tuple(LIMITS)):
                name = prefix + child.name
                yield child, name, child.end_lineno - child.lineno + 1
                yield from visit(child, name + ".")
            else:
                yield from visit(child, prefix)

    yield from visit(ast.parse(path.read_text()), "")


def violations() -> list:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(PACKAGE.parent)
        for node, name, lines in sizes(path):
            limit = LIMITS[type(node)]
            if lines > limit and not is_table(node):
                kind = "class" if isinstance(node, ast.ClassDef) else "function"
                found.append(
                    f"{where}:{node.lineno}: {kind} {name} has {lines} lines (at most {limit})"
                )
    return found


def test_no_class_or_function_over_its_limit():
    assert violations() == []


def test_a_table_is_told_from_code():
    tree = ast.parse(
        "def table():\n    'Doc.'\n    return {1: 2}\n"
        "def code():\n    x = {1: 2}\n    return x\n"
        "class Fields:\n    a = 1\n    b: int = 2\n"
        "class Methods:\n    a = 1\n    def f(self):\n        pass\n"
    )
    assert [is_table(n) for n in tree.body] == [True, False, True, False]


if __name__ == "__main__":  # the largest classes and functions, for a report
    every = [s for p in sorted(PACKAGE.rglob("*.py")) for s in sizes(p)]
    for kind in (ast.ClassDef, ast.FunctionDef):
        ranked = sorted(
            (s for s in every if isinstance(s[0], kind)), key=lambda s: -s[2]
        )
        for node, name, lines in ranked[:3]:
            print(f"{kind.__name__[:-3].lower():8} {lines:4}  {name}")
    print("\n".join(violations()) or "no violations")
