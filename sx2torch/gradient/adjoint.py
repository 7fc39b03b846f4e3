"""The adjoint loop of a FOR that a backward goes through: the layers in reverse, each
computing its layer's forward again from the carried values recorded, then its backward.
"""

from __future__ import annotations

from sx2torch.errors import SourceError
from sx2torch.gradient.dependence import read_in_regions, reads_around
from sx2torch.gradient.labels import label
from sx2torch.ir import Kind, Node, Operand, Region, Scalar, argument, walk


class Adjoint:
    """The adjoint loop of a FOR: over the layers in reverse, each iteration computes its
    layer's forward again from the carried values the forward loop recorded, then the
    gradient of the values it carries; values read from around the loop collect their
    contributions in carried sums. `backward`: the Backward (gradient/backward.py) going
    through the loop, unnamed here since that module imports this one."""

    def __init__(self, backward, loop: Node):
        self.backward = backward
        self.t = backward.t
        self.loop = loop
        (self.body,) = loop.regions
        self.outer = [  # the values read from around the loop that depend on X
            value
            for value in dict.fromkeys(read_in_regions(loop))
            if isinstance(value, Node) and value in backward.depends
        ]

    def run(self, contributions: list) -> list:
        """[(operand, its contribution)] for the loop's starts and the values read around it."""
        loop, body, t = self.loop, self.body, self.t
        if None in loop.inputs:
            # the first layer's backward would get None for the value it does not read
            raise SourceError(
                loop.span,
                "a gradient through a loop whose carried value starts as none is not "
                "supported yet: start it from a tensor",
            )
        starts = self._starts(contributions)
        grads_in = [_input("grad_" + (c.name or "x"), loop) for c in body.inputs]
        for start, carried in zip(starts, grads_in):
            _named_as_carried(start, carried)
        sums = [_input("grad_" + label(value), loop) for value in self.outer]
        recorded = [
            _input(c.name or label(start), loop)
            for c, start in zip(body.inputs, loop.inputs)
        ]
        attrs = dict(loop.attrs, index=loop.attrs["index"] or "i", reverse=loop)
        loop.attrs["recorded"] = True
        adjoint = Node(
            Kind.FOR,
            None,
            tuple(starts),
            attrs,
            loop.span,
            loop.form,
            t.frames,
            regions=(Region(grads_in + sums + recorded),),
        )
        with t.region(adjoint.regions[0]):
            self._body(adjoint, grads_in, sums, recorded)
        t.add(adjoint)
        items = [
            t.add(
                Node(
                    Kind.ITEM,
                    None,
                    (adjoint,),
                    {"index": k},
                    loop.span,
                    loop.form,
                    t.frames,
                    name=carried.name,
                )
            )
            for k, carried in enumerate(grads_in + sums)
        ]
        # a start no iteration reads gets no contribution (not zeros that then decide)
        unread = [not _read_in(body, c) for c in body.inputs[: len(loop.inputs)]]
        return [
            (value, None if k < len(unread) and unread[k] else item)
            for k, (value, item) in enumerate(zip([*loop.inputs, *self.outer], items))
        ]

    def _starts(self, contributions: list) -> list:
        """What the adjoint loop starts from: each carried value's gradient after the loop,
        and zeros for each carried sum."""
        backward, t = self.backward, self.t
        seeds: dict = {}
        for index, gradient in contributions:
            seeds.setdefault(index, []).append(gradient)
        with backward.stamped(self.loop):
            starts = [
                backward.added(seeds[k]) if k in seeds else t.op("zeros-like", [start])
                for k, start in enumerate(self.loop.inputs)
            ]
            return starts + [t.op("zeros-like", [value]) for value in self.outer]

    def _body(self, adjoint: Node, grads_in: list, sums: list, recorded: list) -> None:
        """One iteration: the layer's forward again, then its backward."""
        backward, t, body = self.backward, self.t, self.body
        copies = dict(zip(body.inputs, recorded))
        t.origin.update(zip(recorded, body.inputs))
        backward.depends.update(
            copy for carried, copy in copies.items() if carried in backward.depends
        )
        _Copier(backward, self.loop, adjoint, copies).block(body.nodes)
        grads: dict = {}
        for out, gradient in zip(body.outputs, grads_in):
            grads.setdefault(copies.get(out, out), []).append(gradient)
        grads = backward.propagate(list(adjoint.regions[0].nodes), grads)
        with backward.stamped(self.loop):
            outputs = [
                backward.added(grads[c]) if grads.get(c) else t.op("zeros-like", [c])
                for c in recorded
            ]
            outputs += [
                (
                    t.op("+", [total, backward.added(grads[value])])
                    if grads.get(value)
                    else total
                )
                for total, value in zip(sums, self.outer)
            ]
        adjoint.regions[0].outputs = outputs


def _read_in(body: Region, value: Node) -> bool:
    """Whether a loop's body reads one of its carried values, or gives it on as it is."""
    return value in body.outputs or any(
        value in reads_around(node) for node in walk(body.nodes)
    )


def _named_as_carried(start: Operand, carried: Node) -> None:
    """A gradient that starts an adjoint loop is named as the gradient the loop carries
    (`grad_x = torch.ones_like(x)`, not `grad_chain = ...` then `grad_x = grad_chain`).
    """
    if isinstance(start, Node) and (start.name or "grad_").startswith("grad_"):
        start.name = carried.name


def _input(name: str, loop: Node) -> Node:
    return argument(name, loop.span, loop.form)


class _Copier:
    """A loop body's forward, traced again in an adjoint loop's body: reading the carried
    values it recorded, the adjoint loop's layer and index. `backward`: as Adjoint's."""

    def __init__(self, backward, loop: Node, adjoint: Node, copies: dict):
        self.backward = backward
        self.copies = copies  # forward value -> its copy
        self.copies[loop] = adjoint  # what the layer and the index are read through

    def block(self, nodes: list) -> None:
        for node in nodes:
            self.backward.t.add(self.node(node))

    def node(self, node: Node) -> Node:
        if node.kind is Kind.OP and node.op.draws:
            raise SourceError(
                node.span,
                f"'{node.op.name}' draws random values, and the adjoint loop of this gradient "
                "would compute the layer's forward again and draw anew: draw before the "
                "loop and pass the values in",
            )
        copy = Node(
            node.kind,
            node.op,
            tuple(self.value(i) for i in node.inputs),
            {k: self.value(v) for k, v in node.attrs.items()},
            node.span,
            node.form,
            node.frames,
            name=node.name,
            label=node.label,
        )
        self.copies[node] = copy
        origin = self.backward.t.origin
        origin[copy] = origin.get(node, node)
        copy.regions = tuple(self.region(r) for r in node.regions)
        if node in self.backward.depends:
            self.backward.depends.add(copy)
        return copy

    def region(self, region: Region) -> Region:
        copy = Region([self.node(i) for i in region.inputs])
        with self.backward.t.region(copy):
            self.block(region.nodes)
        copy.outputs = [self.value(o) for o in region.outputs]
        return copy

    def value(self, value):
        """An operand or attribute, reading the copies: in a scalar too (the index)."""
        if isinstance(value, Node):
            return self.copies.get(value, value)
        if isinstance(value, Scalar):
            return Scalar(
                value.op, tuple(self.value(a) for a in value.args), value.value
            )
        if isinstance(value, tuple):
            return tuple(self.value(v) for v in value)
        return value
