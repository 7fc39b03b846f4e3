"""The typed graph IR: what `trace` builds, `gradient` extends and `policy` types.

A defun is a dataflow graph of nodes in trace order. A node's inputs are other
nodes or compile-time scalars; its static attributes (axes, shapes) are scalars
too, kept as expressions so the emitter can write them in terms of the
constructor's arguments.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from sx2torch.errors import Span

ISLAND = "island"  # (with-numerics (:sensitivity :high) ...): f32
REGION = "region"  # (with-numerics (:precision :bf16) ...): bf16


@dataclass(frozen=True)
class Scalar:
    """A compile-time number: a literal, a const, a defun's &key argument, or arithmetic.

    `value` is its value with every const and key at its default; `op` is "lit",
    "const", "key" or a Python operator, `args` the literal, the name or operands
    (two or more: a left fold, `(+ k 1 1)` is Scalar("+", (k, 1, 1))).
    """

    op: str
    args: tuple
    value: Union[int, float, bool, str]

    @staticmethod
    def lit(value: Union[int, float, bool, str]) -> "Scalar":
        return Scalar("lit", (value,), value)


@dataclass(frozen=True)
class Frame:
    """One `with-numerics` form (or a library mark) around the nodes traced in it."""

    mode: str
    form: object  # the datum, echoed in comments
    library: bool = False


@dataclass(eq=False)
class Node:
    op: str
    inputs: tuple
    attrs: dict
    span: Span
    form: object
    frames: tuple = ()
    name: Union[str, None] = None
    note: Union[str, None] = None  # a comment for the statement that computes this node
    label: Union[str, None] = (
        None  # the library op a node computes the result of, for its name
    )

    @property
    def mode(self) -> Union[str, None]:
        return self.frames[-1].mode if self.frames else None

    def __repr__(self) -> str:
        return f"<{self.op} {self.name or ''} @{self.span.line}:{self.span.col}>"


Operand = Union[Node, Scalar]


@dataclass(eq=False)
class Graph:
    """One defun, traced once, before any dtype is known."""

    model: str
    name: str
    inputs: list
    keys: list  # [(name, Scalar default)]
    doc: Union[str, None]
    nodes: list = field(default_factory=list)
    output: Union[Operand, None] = None
    span: Union[Span, None] = None


SPECIAL_OPS = ("input", "param", "call", "submodel", "chain", "cast")


def verify(graph: Graph, known_ops) -> None:
    """Check a graph's invariants (tests run it after trace and gradient): every input of a
    node is made before it, every op is known, and the output is one of the graph's values.
    """
    made = set(graph.inputs)
    for node in graph.nodes:
        assert node.op in SPECIAL_OPS or node.op in known_ops, f"unknown op {node.op!r}"
        for operand in node.inputs:
            assert (
                isinstance(operand, Scalar) or operand in made
            ), f"{node!r} reads {operand!r} before it is made"
        made.add(node)
    output = graph.output
    assert (
        output is None or isinstance(output, Scalar) or output in made
    ), f"the output {output!r} is not made"
