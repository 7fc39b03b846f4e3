"""The node builder: how a graph's nodes are made, with the `with-numerics` frames they sit
in. An op's definition through other ops (`expand`) and its derivative rule (`grad`) make
their nodes with it, through `op`, `cast`, `library_island` and `library_region`; so the
trace pass builds a defun's nodes with it, and the gradient pass (gradient/writer.py) a
backward's: the layer both stand on, beside the registry whose rules write with it."""

from __future__ import annotations

import itertools
from contextlib import contextmanager
from typing import Optional

from sx2torch.syntax import scalars
from sx2torch.syntax.echo import echo
from sx2torch.ir import (
    ISLAND,
    REGION,
    Frame,
    Expansion,
    Graph,
    Kind,
    Node,
    Operand,
    Region,
    Scalar,
)
from sx2torch.ops.shapes import Analysis
from sx2torch.ops.registry import REGISTRY, Op
from sx2torch.errors import SourceError
from sx2torch.syntax.program import Program
from sx2torch.syntax.read import Datum


class Builder:
    def __init__(self, graph: Graph, program: Optional[Program]):
        self.graph = graph
        # the rank rules, and the parameters and stacks the nodes read (the program None
        # for a library op's function, which reads neither), shape each node as it is made
        self.shapes = Analysis(program, None)
        self.nodes = graph.nodes  # where new nodes go: the graph's, or a region's
        self._serials = itertools.count(1)
        self.block = 0  # the serial number of the block new nodes go to
        self.frames: tuple = ()  # the with-numerics frames around the nodes made now
        self.datum: Optional[Datum] = None  # the form whose nodes are being made
        # the marks of the gradient being traced, or expanded: its backward's innermost frames
        self.stamps: tuple = ()
        self.of: Optional[Node] = None  # the forward node whose backward is being made
        self.expanding = (
            False  # inside an op's expand: its own expansions are its nodes
        )

    def _spelled(self, name: str, inputs: list) -> list:
        """A function's literal operand as the form being traced spells it, `(sqrt (/
        2.0 3.0))`'s division; where that form is another (a rule's), as it is."""
        datum = self.datum
        if not (scalars.head_is(datum, name) and len(datum.items) == 2):
            return inputs
        written = scalars.spelled(datum.items[1])
        return [written] if written and written.value == inputs[0].value else inputs

    def op(self, name: str, inputs: list, **attrs) -> Operand:
        op = REGISTRY[name]
        if op.numbers and inputs and all(isinstance(i, Scalar) for i in inputs):
            if op.spells:
                inputs = self._spelled(name, inputs)
            return op.numbers(inputs, self.datum.span, **attrs)
        if op.python_arithmetic and all(map(is_number, inputs)):
            # a size known when the module runs, in arithmetic: a number, as Python's
            numbers = [i if isinstance(i, Scalar) else Scalar.run(i) for i in inputs]
            return op.numbers(numbers, self.datum.span, **attrs)
        for operand in inputs:
            if isinstance(operand, Scalar) and isinstance(operand.value, tuple):
                raise SourceError(
                    self.datum.span,
                    f"'{name}' of a list: a list is read by (at LIST I) and (len LIST)",
                )
            if isinstance(operand, Scalar) and isinstance(operand.value, str):
                raise SourceError(
                    self.datum.span,
                    f"'{name}' of the keyword :{operand.value}, not a number or a tensor",
                )
        for spec in op.keys:
            attrs.setdefault(spec.name, default(spec.default))
        if op.expand:
            return self._expanded(op, inputs, attrs)
        frames = self.frames + (
            (_mark(ISLAND, self.datum),) if op.is_sensitive(attrs) else ()
        )
        return self.add(
            Node(
                Kind.OP,
                op,
                tuple(inputs),
                attrs,
                self.datum.span,
                self.datum,
                frames,
                forward=self.of,
            )
        )

    def _expanded(self, op: Op, inputs: list, attrs: dict) -> Operand:
        """An op defined by other ops, traced in place; the outermost such is recorded."""
        start, outer = len(self.nodes), self.expanding
        self.expanding = True
        try:
            result = op.expand(self, inputs, attrs)
        finally:
            self.expanding = outer
        if isinstance(result, Node) and result.label is None:
            result.label = op.word
        made = self.nodes[start:]
        if not outer and isinstance(result, Node) and result in made:
            record = Expansion(op, tuple(inputs), attrs, made, result, self.frames)
            self.graph.expansions.append(record)
        return result

    def add(self, node: Node) -> Node:
        self.nodes.append(node)
        self.shape(node)
        return node

    def shape(self, node: Node) -> None:
        """The node's shape as it is made, its inputs' shapes known."""
        self.shapes.made(node, self.graph)

    def items(self, node: Node, count: int) -> list:
        """The ITEM nodes that read the values of a FOR, or of a call giving several."""
        return [
            self.add(
                Node(
                    Kind.ITEM,
                    None,
                    (node,),
                    {"index": k},
                    node.span,
                    node.form,
                    self.frames,
                )
            )
            for k in range(count)
        ]

    @contextmanager
    def region(self, region: Region):
        """Nodes made inside go to `region`."""
        outer = self.nodes, self.block
        self.nodes, self.block = region.nodes, next(self._serials)
        try:
            yield region
        finally:
            self.nodes, self.block = outer

    @contextmanager
    def library_island(self):
        """Nodes made inside compute in f32 under either policy (a library mark, 6.8)."""
        with self.frame(_mark(ISLAND, self.datum)):
            yield

    @contextmanager
    def library_region(self):
        """Nodes made inside compute in bf16 under either policy."""
        with self.frame(_mark(REGION, self.datum)):
            yield

    def cast(self, operand: Operand, dtype: str) -> Operand:
        """An explicit conversion to "f32" or "bf16"; a scalar stays a scalar."""
        if isinstance(operand, Scalar):
            return operand
        return self.add(
            Node(
                Kind.CAST,
                None,
                (operand,),
                {"dtype": dtype},
                self.datum.span,
                self.datum,
                self.frames,
                forward=self.of,
            )
        )

    def frame(self, frame: Frame):
        """Nodes made inside sit in `frame` too."""
        return self._pushed("frames", frame)

    def stamp(self, frame: Frame):
        """A with-numerics form whose body is a gradient marks only what the gradient appends."""
        return self._pushed("stamps", frame)

    @contextmanager
    def _pushed(self, stack: str, frame: Frame):
        outer = getattr(self, stack)
        setattr(self, stack, outer + (frame,))
        try:
            yield
        finally:
            setattr(self, stack, outer)


def _mark(mode: str, datum: Datum) -> Frame:
    """The frame of a library op's mark: its whole form is the comment."""
    return Frame(mode, echo(datum), datum.span, library=True)


def is_python_number(operand) -> bool:
    """Whether an operand is an op node that gives a Python number when the module runs
    (`x.shape[1]`)."""
    return (
        isinstance(operand, Node)
        and operand.kind is Kind.OP
        and operand.op.python_number
    )


def is_number(operand) -> bool:
    """A number known when the file compiles, or one known when the module runs."""
    return isinstance(operand, Scalar) or is_python_number(operand)


def default(value):
    """A registry key's default as the value an attribute holds."""
    if value is None or isinstance(value, bool):
        return Scalar.lit(value) if isinstance(value, bool) else None
    if isinstance(value, tuple):
        return tuple(Scalar.lit(v) for v in value)
    return Scalar.lit(value)
