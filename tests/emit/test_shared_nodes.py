"""The emitter's immutable leaf nodes are shared: one operator node of each kind with its
whitespace, one Name node per local read and one node per literal in a method, one node
per unary function called. libcst's defaults made (and validated) new ones for every node,
a fifth of a long expression's emission."""

from __future__ import annotations

import libcst as cst

import sx2torch.build as b
from sx2torch.compiler import Options, Unit, run

SOURCE = (
    "(defun forward (x)\n  (+ x (* 2.0 x) (sin x) x (* 2.0 x) (sin x)))\n"
    "(defrun train :precision :bf16)\n"
)


class _Found(cst.CSTVisitor):
    def __init__(self):
        super().__init__()
        self.operators: dict = {}  # type -> ids
        self.names: dict = {}  # identifier -> ids
        self.whitespace: set = set()  # ids of the calls' and arguments' whitespace
        self.floats: set = set()  # ids of the literals' nodes
        self.functions: set = set()  # ids of the `torch.sin` nodes called

    def visit_BinaryOperation(self, node) -> None:
        self.operators.setdefault(type(node.operator), set()).add(id(node.operator))

    def visit_Float(self, node) -> None:
        self.floats.add(id(node))

    def visit_Name(self, node) -> None:
        self.names.setdefault(node.value, set()).add(id(node))

    def visit_Call(self, node) -> None:
        if isinstance(node.func, cst.Attribute) and node.func.attr.value == "sin":
            self.functions.add(id(node.func))
        self.whitespace |= {
            id(node.whitespace_after_func),
            id(node.whitespace_before_args),
        }
        for arg in node.args:
            self.whitespace |= {
                id(arg.whitespace_after_star),
                id(arg.whitespace_after_arg),
            }


def test_operators_whitespace_and_names_are_shared(monkeypatch):
    trees: list = []
    code = b.code

    def kept(tree):
        trees.append(tree)
        return code(tree)

    monkeypatch.setattr(b, "code", kept)
    run(Unit(SOURCE, "m.lisp", Options()), until="emit")
    found = _Found()
    trees[0].visit(found)
    assert found.operators == {
        cst.Add: {id(b.OPERATOR["+"])},
        cst.Multiply: {id(b.OPERATOR["*"])},
    }
    assert found.whitespace == {id(b.NO_SPACE)}
    assert len(found.functions) == 1  # torch.sin, one node for both calls
    assert len(found.floats) == 1  # 2.0, one node for both products
    # x: the argument and its six reads in forward's body, one node for the reads
    assert len(found.names["x"]) == 2
