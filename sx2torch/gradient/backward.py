"""The backward of Y with respect to X: the contributions to each value that depends on
X, from Y back to X, by the ops' derivative rules, through IFs and (gradient/adjoint.py)
loops, each backward node stamped with its forward node's frames and the gradient's marks.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Optional

from sx2torch.errors import SourceError
from sx2torch.gradient.adjoint import Adjoint
from sx2torch.gradient.dependence import Dependence, reads_around
from sx2torch.gradient.labels import label, shown
from sx2torch.ir import Kind, Node, Operand, Region
from sx2torch.syntax.echo import echo
from sx2torch.ops.builder import Builder


class Backward:
    def __init__(self, t: Builder, datum, visible: list, around: list):
        self.t = t
        self.datum = datum
        self.visible = visible  # the nodes Y may read
        self.around = around  # the nodes whose regions hold the gradient form
        self.noted: Optional[Node] = None  # the node the gradient form's comment is on
        self.depends: set = set()  # the values that depend on X, in regions too
        self.grads: dict = {}  # value -> its contributions, once run
        self.cone: set = set()  # the values Y is computed from that depend on X
        self.readers: dict = {}  # value -> the nodes its contributions come from
        self.pending: dict = (
            {}
        )  # value -> its contributions so far, in the block running

    def run(self, y: Node, x: Node) -> Operand:
        path = self._path(y, x)
        if not path:
            return self._zeros(x)
        # the gradient of a sum over all axes is ones shaped like its input: the sum
        # itself is not needed for it, and the ones are made where their readers (the
        # input's backward) are, so a region's bf16 ones are not f32 ones cast down
        seeded = y.inputs[0] if _sums_all(y) and y is not x else y
        with self.stamped(y, None if seeded is x else [seeded]):
            seed = self._note(self.t.ones(seeded))
        grads = self.propagate(path, {seeded: [seed]}, stop=x)
        self.grads = grads
        if grads.get(x):
            with self.stamped(x, self.readers.get(x)):
                return self._sum(grads[x], x)
        return self._zeros(x)

    def propagate(self, nodes: list, grads: dict, stop: Node = None) -> dict:
        """Contributions to the values that depend on X, from the last of `nodes` back to
        the first; a value read from around `nodes` collects them, for its block to sum.
        """
        outer, self.pending = self.pending, grads
        try:
            self._propagate(nodes, grads, stop)
        finally:
            self.pending = outer
        return grads

    def _propagate(self, nodes: list, grads: dict, stop: Optional[Node]) -> None:
        for node in reversed(nodes):
            contributions = grads.get(node)
            if not contributions or node is stop:
                continue
            # (carried value's index, its gradient) from ITEMs
            if node.kind is Kind.FOR and node.attrs.get("reverse") is not None:
                raise SourceError(
                    self.datum.span,
                    "this gradient goes through the backward of a loop (a gradient of a "
                    "gradient through for or chain), which is not supported yet: "
                    "differentiate the loop once",
                )
            if node.kind is Kind.FOR:
                found = Adjoint(self, node).run(contributions)
            else:
                with self.stamped(node, self.readers.get(node)):
                    total = self._sum(contributions, node)
                with self.stamped(node):
                    found = self._rule(node, total)
            for operand, gradient in found:
                if gradient is not None and operand in self.depends:
                    grads.setdefault(operand, []).append(gradient)
                    self.readers.setdefault(operand, []).append(node)

    def _zeros(self, x: Node) -> Operand:
        """Y does not depend on X (or only through ops without a gradient): dY/dX is zero."""
        with self.stamped(x):
            return self._note(self.t.op("zeros-like", [x]))

    def _path(self, y: Node, x: Node) -> list:
        """The nodes on some path from x to y, in trace order, among those Y may read; an IF
        or FOR depends on X where a node in its regions does."""
        visible = self.visible
        # the loops around too, for carried_check to see what reaches a carried value
        self.depends = Dependence(x).around(visible, self.around).found
        needed, pending = set(), [y]
        while pending:
            node = pending.pop()
            if node in self.depends and node not in needed:
                needed.add(node)
                pending.extend(i for i in reads_around(node) if isinstance(i, Node))
        self.cone = needed
        return (
            [x] + [n for n in visible if n in needed and n is not x]
            if x in needed
            else []
        )

    def reaches(self, value: Node) -> bool:
        """Whether the backward reaches `value`: it has contributions, or, where Y reads X
        only through values a loop around carries (so no backward node is made and the
        gradient is zeros), Y is computed from it through values that depend on X."""
        return bool(self.grads.get(value)) or (not self.grads and value in self.cone)

    def _sum(self, contributions: list, node: Node) -> Operand:
        """A value's gradient, named after it."""
        total = self.added(contributions)
        if isinstance(total, Node) and total.name is None:
            total.name = "grad_" + label(node)
            total.note = total.note or "gradient of " + shown(node)
        return total

    def added(self, contributions: list) -> Operand:
        total = contributions[0]
        for more in contributions[1:]:
            total = self.t.op("+", [total, more])
        return total

    def _rule(self, node: Node, g: Operand) -> list:
        """[(operand, its contribution)] of one node's backward."""
        if node.kind is Kind.CAST:
            # A conversion's gradient is the identity; the marks set its dtype.
            return [(node.inputs[0], g)]
        if node.kind is Kind.IF:
            return self._if(node, g)
        if node.kind is Kind.ITEM:
            return [(node.inputs[0], (node.attrs["index"], g))]
        if "at" in node.attrs:
            raise SourceError(
                node.span,
                "gradient through one layer of a stack (nth) is not supported yet",
            )
        if node.attrs.get("loop") is not None:
            raise SourceError(
                node.span,
                f"this loop over '{node.attrs['target']}' was traced outside the gradient "
                "form, so its layers cannot be differentiated: write the loop inside it",
            )
        if node.kind in (Kind.CALL, Kind.SUBMODEL):
            raise SourceError(
                node.span,
                f"this call of '{node.attrs['target']}' was traced outside the gradient form, so its "
                f"nodes cannot be differentiated: write it inside, as (gradient ({node.attrs['target']} ...) X)",
            )
        op = node.op
        if op.grad is None:
            why = op.no_grad or "the compiler made it, and takes no second derivative"
            raise SourceError(
                node.span,
                f"'{node.op.name}' has no gradient ({why}), and (gradient ...) needs one here",
            )
        with self.stamped(node):
            return list(zip(node.inputs, op.grad(self.t, node, g)))

    def _if(self, node: Node, g: Operand) -> list:
        """One IF per value read from around the branches that depends on X: each branch
        gives that value's contribution through it, or zeros where it does not read it.
        """
        outer = [
            value
            for value in reads_around(node)
            if isinstance(value, Node) and value in self.depends
        ]
        found = []
        for value in dict.fromkeys(outer):
            regions, absent = (Region([]), Region([])), []
            for k, (region, forward) in enumerate(zip(regions, node.regions)):
                with self.t.region(region):
                    known = len(self.readers.get(value, ()))
                    grads = self.propagate(forward.nodes, {forward.outputs[0]: [g]})
                    readers = self.readers.get(value, [])[known:]
                    # summed in the marks the branch's readers share, zeros where the `if`
                    # is; stored in the IF's own name
                    with (
                        self.stamped(value, readers) if readers else self.stamped(node)
                    ):
                        if grads.get(value):
                            total = self.added(grads[value])
                        else:
                            absent.append(k)
                            total = self.t.op("zeros-like", [self._shaped(value)])
                region.outputs = [total]
            with self.stamped(node):
                backward = self.t.add(
                    Node(
                        Kind.IF,
                        None,
                        (),
                        # the branches that read the value not: their zeros decide no dtype
                        dict(node.attrs, absent=tuple(absent) or None),
                        node.span,
                        node.form,
                        self.t.frames,
                        regions=regions,
                    )
                )
            found.append((value, backward))
        return found

    def _shaped(self, value: Node) -> Node:
        """A value of `value`'s shape for zeros to take it from: a contribution to its
        gradient already made, so that a value an adjoint loop computes again is not computed
        only for its shape, else the value itself."""
        made = [g for g in self.pending.get(value, ()) if isinstance(g, Node)]
        return made[0] if made else value

    @contextmanager
    def stamped(self, node: Node, readers: Optional[list] = None):
        """Nodes made now carry the forward node's frames, then the frames around `gradient`,
        and know the forward node (the policy reads the marks it has from its parameters).
        `readers`: the nodes whose contributions to `node` are being summed: the sum carries
        the frames they share, so it is computed where they are (a value read twice in a
        region gets its gradient there, as one read once does), whatever frames `node` has.
        """
        t = self.t
        outer = t.frames, t.datum, t.of
        frames = _shared([r.frames for r in readers]) if readers else node.frames
        t.frames, t.datum, t.of = frames + t.stamps, node.form, node
        try:
            yield
        finally:
            t.frames, t.datum, t.of = outer

    def _note(self, node: Operand) -> Operand:
        if self.noted is None and isinstance(node, Node):
            node.note = echo(self.datum)
            self.noted = node
        return node


def _sums_all(node: Node) -> bool:
    return (
        node.kind is Kind.OP
        and node.op.totals(node.attrs)
        and isinstance(node.inputs[0], Node)
    )


def _shared(frames: list) -> tuple:
    """The frames every one of `frames` starts with, by their marks: two `with-numerics`
    forms of the same marks are one precision to a sum of contributions from both (the
    first reader's frame stands for them)."""
    common = frames[0]
    for more in frames[1:]:
        n = next(
            (k for k, (a, b) in enumerate(zip(common, more)) if _marks(a) != _marks(b)),
            None,
        )
        common = common[: min(len(common), len(more)) if n is None else n]
    return common


def _marks(frame) -> tuple:
    return frame.mode, frame.library
