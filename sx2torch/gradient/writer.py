"""The builder the derivative rules write a backward with, and what it knows of the
forward's shapes: where a broadcast kept an operand's shape, so that no sum back is written,
and which value a shape can be read from."""

from __future__ import annotations

from typing import Optional

from sx2torch.ir import REGION, Graph, Kind, Node, Operand, Scalar
from sx2torch.ops import REGISTRY
from sx2torch.ops.rank import BROADCAST, REDUCED, SAME
from sx2torch.syntax.scalars import ScalarOp
from sx2torch.gradient.dependence import reads_around
from sx2torch.ops.builder import Builder
from sx2torch.ops.shapes import ranked
from sx2torch.syntax.program import Program


class Writer(Builder):
    """The builder the derivative rules write a backward with. A rule gives an operand's
    gradient at the shape its op broadcast the operands to; `sum_back` sums it back to the
    operand's shape unless the forward's shapes show the broadcast kept that shape."""

    def __init__(self, graph: Graph, program: Program, iterated: set):
        super().__init__(graph, program)
        # the values inside loop bodies that depend on what the loops carry: their shapes
        # are those of one iteration, and another may differ
        self.iterated = iterated
        self.origin: dict = (
            {}
        )  # a value computed again in an adjoint loop -> the forward's

    def sum_back(self, g: Operand, n: Node, index: int, batch=False, passed=False):
        """The gradient of input `index` of `n`, from `g`; None for a number. `batch`: `n`
        broadcasts only its inputs' batch axes (all but the last two), as matmul does.
        `passed`: the derivative is `g` itself (`+`'s, `-`'s by its first operand), no
        backward node, so it carries no marks (docs/LANGUAGE.md, gradient): summed back
        where `g` was made, whether or not the shapes known here prove it needs no sum.
        """
        operand = n.inputs[index]
        if isinstance(operand, Scalar):
            return None
        others = [value for k, value in enumerate(n.inputs) if k != index]
        if all(self._kept(operand, other, batch) for other in others):
            return g
        outer = self.frames, self.of
        if passed and isinstance(g, Node):
            self.frames, self.of = g.frames, g.forward
        try:
            return self.op("sum-to", [g, self.shaped_as(operand)])
        finally:
            self.frames, self.of = outer

    def op(self, name: str, inputs: list, **attrs) -> Operand:
        """A product by 1 is the other factor (the rules multiply by the forward's numbers):
        an op's identity as either of two operands gives the other; ones spread to a shape
        are ones of that shape (`_spread_ones`)."""
        identity = REGISTRY[name].identity
        if identity is not None and len(inputs) == 2:
            factor, other = inputs if _is(inputs[0], identity) else inputs[::-1]
            if _is(factor, identity) and isinstance(other, Node):
                return other
        spread = self._spread_ones(name, inputs, attrs)
        if spread is not None:
            return super().op(spread[0], [self.shaped_as(spread[1])])
        return super().op(name, inputs, **attrs)

    def _spread_ones(self, name: str, inputs: list, attrs: dict) -> Optional[tuple]:
        """(fill, the value shaped as it) for a seed of ones that a sum's, a full mean's or
        a concat's rule spreads to an operand's shape, so that the value the seed was shaped
        as is not computed for its shape: `ones_like(torch.mean(x))` then `.expand_as(x) /
        ...` is `ones_like(x) / x.numel()`. Only where the fill computes in the dtype the
        spread would (outside any with-numerics form, a spread of bf16 ones from a region
        computes in bf16 by contagion, a fill there in f32), and not where the seed reads
        Y's check that it is 0-d, which must still run."""
        seed = inputs[0] if inputs else None
        if not (isinstance(seed, Node) and seed.kind is Kind.OP):
            return None
        if not seed.op.ones or (seed.mode == REGION and _mode(self.frames) is None):
            return None
        if seed.inputs[0].kind is Kind.OP and seed.inputs[0].op.checks:
            return None
        spread = REGISTRY[name].spread
        return spread(inputs, attrs) if spread else None

    def _kept(self, operand: Node, other, batch: bool) -> bool:
        """Whether broadcasting `other` against `operand` keeps `operand`'s shape."""
        if not isinstance(other, Node) or _spans(operand, other):
            return True
        if _shaped_like(other, operand) or not batch and _reduced_from(other, operand):
            return True
        inner, outer = self._shape(other), self._shape(operand)
        if batch:
            inner = None if inner is None else inner[:-2]
            outer = None if outer is None else outer[:-2]
        if inner == ():  # 0-d, or a matrix with no batch axes
            return True
        if inner is None or outer is None or len(inner) > len(outer):
            return False
        return all(
            size == 1 or (size is not None and size == against)
            for size, against in zip(reversed(inner), reversed(outer))
        )

    def ones(self, value: Node) -> Node:
        """Ones of `value`'s shape, made without computing it: of a matmul by a matrix, from
        its operands' shapes (read before a cast, which the forward may not make)."""
        ones_from = value.op.ones_from if value.kind is Kind.OP else None
        fill = ones_from and ones_from([_uncast(i) for i in value.inputs], self._shape)
        if fill:
            return self.op(*fill)
        return self.op("ones-like", [self.shaped_as(value)])

    def shaped_as(self, value: Node) -> Node:
        """The value whose shape `value` has, down through elementwise ops: to the first
        input of an op shaped as it, to an operand of a broadcast that kept that operand's
        shape (the only tensor, or one the others broadcast against). A sum back to its shape
        or a `ones-like` then reads no value computed only for the shape."""
        while _keeps_shape(value):
            first = value.inputs[0]
            if value.kind is Kind.CAST or value.op.rank is SAME:
                if not isinstance(first, Node):
                    break
                value = first
                continue
            tensors = [i for i in dict.fromkeys(value.inputs) if isinstance(i, Node)]
            kept = [
                operand
                for operand in tensors
                if all(self._kept(operand, other, False) for other in tensors)
            ]
            if not kept:
                break
            value = kept[0]
        return value

    def shape(self, node: Node) -> None:
        super().shape(node)
        if any(value in self.iterated for value in reads_around(node)):
            self.iterated.add(node)

    def _shape(self, value: Node):
        value = self.origin.get(value, value)
        return None if value in self.iterated else ranked(value.shape.dims)


def _keeps_shape(value: Node) -> bool:
    """Whether a node's shape is its first input's (a cast, an op shaped as its first input)
    or the broadcast of its inputs'."""
    return value.kind is Kind.CAST or (
        value.kind is Kind.OP and value.op.rank in (BROADCAST, SAME)
    )


def _spans(value: Node, other: Node) -> bool:
    """Whether `value` is `other`, or computed from it by casts and elementwise ops that
    broadcast it (`(* (- x b) x)` from x): broadcasting `other` against it then keeps its
    shape, whatever the shapes are."""
    seen, pending = set(), [value]
    while pending:
        node = pending.pop()
        if node is other:
            return True
        if node in seen or not _keeps_shape(node):
            continue
        seen.add(node)
        same = node.kind is Kind.CAST or node.op.rank is SAME
        inputs = node.inputs[:1] if same else node.inputs
        pending.extend(i for i in inputs if isinstance(i, Node))
    return False


def _shaped_like(value: Node, other: Node, depth: int = 64) -> bool:
    """Whether `value` has `other`'s shape whatever it is: it is `other`, or casts and
    elementwise ops of it alone (`(* c c)` of c); `depth` bounds the search."""
    if value is other:
        return True
    if depth == 0 or not _keeps_shape(value):
        return False
    same = value.kind is Kind.CAST or value.op.rank is SAME
    inputs = [
        i for i in (value.inputs[:1] if same else value.inputs) if isinstance(i, Node)
    ]
    return bool(inputs) and all(_shaped_like(i, other, depth - 1) for i in inputs)


def _uncast(value: Operand) -> Operand:
    while isinstance(value, Node) and value.kind is Kind.CAST:
        value = value.inputs[0]
    return value


def _mode(frames: tuple) -> Optional[str]:
    return frames[-1].mode if frames else None


def _reduced_from(other: Node, operand: Node) -> bool:
    """Whether `other` reduces `operand` (or a value shaped like it) keeping its axes, so
    broadcasts against it keeping its shape: (mean x :axes [-1] :keepdims true) of x."""
    if other.kind is not Kind.OP or other.op.rank is not REDUCED:
        return False
    keep = other.attrs.get("keepdims")
    first = other.inputs[0]
    return (
        isinstance(keep, Scalar)
        and keep.value is True
        and isinstance(first, Node)
        and _shaped_like(first, operand)
    )


def _is(value, number: int) -> bool:
    return (
        isinstance(value, Scalar)
        and value.op is ScalarOp.LIT
        and not isinstance(value.value, bool)
        and value.value == number
    )
