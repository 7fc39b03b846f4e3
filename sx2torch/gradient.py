"""The gradient pass: each GRADIENT node trace left, `(gradient Y X)`, becomes the backward
of Y with respect to X, written where the form was, before the policy runs, so the policy
lowers it like the forward (6.9).

Each backward node carries the frames of the forward node it differentiates, then the frames
of the `with-numerics` forms wrapped directly around the `gradient` form (the node's marks),
which are innermost and so win: such a form stamps its marks on every node the expansion
writes, and not on Y's forward, which trace traced as it would be without them (so in
energy.lisp the forward runs in bf16 and the sweep in f32). The derivative rules live in the
ops' registry entries. Trace traced the defun calls inside Y in place, so the backward sees
their nodes. The nodes nothing reads any longer are pruned after.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Optional

import sx2torch.ranks as ranks
from sx2torch.syntax.echo import echo
from sx2torch.errors import SourceError
from sx2torch.ir import REGION, Graph, Kind, Node, Operand, Region, Scalar, prune, reads, walk
from sx2torch.syntax.scalars import ScalarOp
from sx2torch.ops import REGISTRY
from sx2torch.ops.rank import BROADCAST, REDUCED, SAME
from sx2torch.ops.registry import ArgKind
from sx2torch.syntax.program import Program
from sx2torch.trace.builder import Builder


def run(program: Program, graphs: dict) -> None:
    """Expand every GRADIENT node of `graphs` (trace's output), in trace order."""
    for graph in graphs.values():
        if any(node.kind is Kind.GRADIENT for node in walk(graph.nodes)):
            _Expansion(program, graph).block(graph.nodes, [])
            prune(graph)


class _Expansion:
    """One graph's GRADIENT nodes replaced by their backward nodes, and every read of one by
    a read of its value, so that a later gradient differentiates through an earlier one.
    """

    def __init__(self, program: Program, graph: Graph):
        self.program = program
        self.graph = graph
        self.values: dict = {}  # GRADIENT node -> dY/dX
        self.shapes = ranks.shapes(graph, program)  # of the forward values
        for value in _iterated(graph.nodes, set()):
            self.shapes[value] = None

    def block(self, nodes: list, opened: list) -> None:
        """`opened`: (block, end) of the blocks around `nodes`: their nodes up to `end`
        are those a node of `nodes` may read."""
        k = 0
        while k < len(nodes):
            node = nodes[k]
            node.inputs = tuple(self._value(i) for i in node.inputs)
            if node.kind is Kind.GRADIENT:
                visible = [
                    n for block, end in [*opened, (nodes, k)] for n in block[:end]
                ]
                around = [block[end] for block, end in opened]
                built = self._expand(node, visible, around)
                nodes[k : k + 1] = built
                k += len(built)
                continue
            for region in node.regions:
                self.block(region.nodes, [*opened, (nodes, k)])
                region.outputs = [self._value(o) for o in region.outputs]
            k += 1
        if nodes is self.graph.nodes:
            out = self.graph.output
            self.graph.output = (
                tuple(map(self._value, out))
                if isinstance(out, tuple)
                else self._value(out)
            )

    def _value(self, operand):
        return (
            self.values.get(operand, operand) if isinstance(operand, Node) else operand
        )

    def _expand(self, node: Node, visible: list, around: list) -> list:
        """The nodes that compute dY/dX in place of the GRADIENT node; `around`: the
        nodes whose regions hold it."""
        t = _Writer(self.graph, self.shapes)
        t.nodes = []
        t.frames, t.datum, t.stamps = node.frames, node.form, node.attrs["marks"]
        (y, x), y_form = node.inputs, node.form.items[1]
        scalar = self._is_scalar(y) if isinstance(y, Node) else False
        if scalar is False:
            raise SourceError(
                y_form.span,
                "gradient needs a scalar Y: reduce it over all axes, as (sum ...) or (mean ...)",
            )
        if scalar is None:
            y = _expect_scalar(t, y, y_form)
        _aliased_start_check(node, y, visible, around)
        backward = _Backward(t, node.form, [*visible, *t.nodes], around)
        value = backward.run(y, x)
        _pass_note(backward.noted, t.nodes, value)
        _carried_check(node, visible, around, backward, (t.nodes, value))
        self.values[node] = value
        _bind(value, node)
        return t.nodes

    def _is_scalar(self, node: Node) -> Optional[bool]:
        """Whether a value is a 0-d tensor; None where its rank depends on arguments of unknown rank."""
        rank = ranks.rank_of(node, self.graph, self.program)
        return None if rank is None else rank == 0


def _pass_note(noted: Optional[Node], nodes: list, value: Operand) -> None:
    """The gradient form's comment goes from a seed nothing reads (its readers made ones of
    their own shapes) to the first value after it that is read and named, so a statement."""
    made = list(walk(nodes))
    read = {i for n in made for i in reads(n)}
    if noted is None or noted in read or noted not in made:
        return
    later = made[made.index(noted) + 1 :]
    heir = next((n for n in later if n is value or (n in read and n.name)), None)
    if heir is not None:
        heir.note, noted.note = noted.note, None


def _iterated(nodes: list, found: set, inside: bool = False) -> set:
    """The values inside loop bodies that depend on what the loops carry: ranks finds their
    shapes in one iteration, and another may differ."""
    for node in nodes:
        if node.kind is Kind.FOR:
            found.update(node.regions[0].inputs)
        for region in node.regions:
            _iterated(region.nodes, found, inside or node.kind is Kind.FOR)
        if inside and any(value in found for value in _reads_around(node)):
            found.add(node)
    return found


class _Writer(Builder):
    """The builder the derivative rules write a backward with. A rule gives an operand's
    gradient at the shape its op broadcast the operands to; `sum_back` sums it back to the
    operand's shape unless the forward's shapes show the broadcast kept that shape."""

    def __init__(self, graph: Graph, shapes: dict):
        super().__init__(graph)
        self.shapes = shapes  # forward value -> its shape, None where not known
        self.origin: dict = (
            {}
        )  # a value computed again in an adjoint loop -> the forward's

    def sum_back(self, g: Operand, n: Node, index: int, batch=False, passed=False):
        """The gradient of input `index` of `n`, from `g`; None for a number. `batch`: `n`
        broadcasts only its inputs' batch axes (all but the last two), as matmul does.
        `passed`: the derivative is `g` itself (`+`'s, `-`'s by its first operand), no
        backward node, so it carries no marks (docs/LANGUAGE.md, gradient): summed back
        where `g` was made, whether or not the shapes known here prove it needs no sum."""
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
        if not REGISTRY[seed.op].ones or (
            seed.mode == REGION and _mode(self.frames) is None
        ):
            return None
        if seed.inputs[0].kind is Kind.OP and REGISTRY[seed.inputs[0].op].checks:
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
        ones_from = REGISTRY[value.op].ones_from if value.kind is Kind.OP else None
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
            if value.kind is Kind.CAST or REGISTRY[value.op].rank is SAME:
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

    def _shape(self, value: Node):
        return self.shapes.get(self.origin.get(value, value))


def _keeps_shape(value: Node) -> bool:
    """Whether a node's shape is its first input's (a cast, an op shaped as its first input)
    or the broadcast of its inputs'."""
    return value.kind is Kind.CAST or (
        value.kind is Kind.OP and REGISTRY[value.op].rank in (BROADCAST, SAME)
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
        same = node.kind is Kind.CAST or REGISTRY[node.op].rank is SAME
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
    same = value.kind is Kind.CAST or REGISTRY[value.op].rank is SAME
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
    if other.kind is not Kind.OP or REGISTRY[other.op].rank is not REDUCED:
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


def _expect_scalar(t: Builder, y: Node, y_form) -> Node:
    """Y itself, checked to be 0-d when the module runs, the error naming Y's form."""
    outer = t.frames, t.datum
    t.frames, t.datum = y.frames, y_form
    try:
        checked = t.op("expect-scalar", [y], form=echo(y_form))
        checked.name = _label(y)  # named as Y would be: the backward is named after it
        return checked
    finally:
        t.frames, t.datum = outer


def _bind(value: Operand, node: Node) -> None:
    """The names a `let` bound the GRADIENT node to go to its value, as they would had the
    let bound the value itself."""
    if not isinstance(value, Node):
        return
    for name in filter(None, (node.name, *node.aliases)):
        if value.name is None:
            value.name = name
        elif name not in (value.name, *value.aliases):
            value.aliases += (name,)


class _Backward:
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
        self.pending: dict = {}  # value -> its contributions so far, in the block running

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
                found = _Adjoint(self, node).run(contributions)
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
        # the loops around too, for _carried_check to see what reaches a carried value
        self.depends = _Dependence(x).around(visible, self.around).found
        needed, pending = set(), [y]
        while pending:
            node = pending.pop()
            if node in self.depends and node not in needed:
                needed.add(node)
                pending.extend(i for i in _reads_around(node) if isinstance(i, Node))
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
            total.name = "grad_" + _label(node)
            total.note = total.note or "gradient of " + _shown(node)
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
        op = REGISTRY[node.op]
        if op.grad is None:
            why = op.no_grad or "the compiler made it, and takes no second derivative"
            raise SourceError(
                node.span,
                f"'{node.op}' has no gradient ({why}), and (gradient ...) needs one here",
            )
        with self.stamped(node):
            return list(zip(node.inputs, op.grad(self.t, node, g)))

    def _if(self, node: Node, g: Operand) -> list:
        """One IF per value read from around the branches that depends on X: each branch
        gives that value's contribution through it, or zeros where it does not read it.
        """
        outer = [
            value
            for value in _reads_around(node)
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
                    with self.stamped(value, readers) if readers else self.stamped(node):
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


class _Dependence:
    """The values that depend on X: a node where it reads one, a loop's carried value where
    its start or an iteration's result does. `expansion`: (the GRADIENT node being expanded,
    its nodes, its value): that node depends on X as its value does."""

    def __init__(self, x: Node, expansion: tuple = (None, (), None)):
        self.x = x
        self.found = {x}
        self.gradient, self.nodes, self.value = expansion

    def mark(self, nodes: list) -> None:
        for node in nodes:
            if node is self.gradient:
                self.mark(self.nodes)
                if self.value in self.found:
                    self.found.add(node)
                continue
            if node.kind is Kind.FOR:
                self.carry(node)
            for region in node.regions:
                self.mark(region.nodes)
            if any(isinstance(i, Node) and i in self.found for i in _valued(node)):
                self.found.add(node)

    def around(self, visible: list, around: list) -> "_Dependence":
        """Marks the values a gradient may read (`visible`) and those the loops around it
        (`around`, those that hold it) carry: before the loops, since a carried value may
        start as one computed from X before its loop, and after, since the values read in
        the body (and the gradient's own nodes) may read a carried one."""
        self.mark(visible)
        for loop in around:
            if loop.kind is Kind.FOR and self.x not in _inside(loop):
                self.carry(loop)
        self.mark(visible)
        return self

    def carry(self, loop: Node) -> None:
        (body,) = loop.regions
        while True:
            self.mark(body.nodes)
            more = {
                carried
                for carried, start, out in zip(body.inputs, loop.inputs, body.outputs)
                if carried not in self.found
                and (start in self.found or out in self.found)
            }
            if not more:
                return
            self.found |= more


def _carried_check(
    gradient: Node, visible: list, around: list, backward: "_Backward", expansion: tuple
):
    """A gradient inside a loop whose backward reaches a carried value that depends on X
    through the iterations before would have to go back through them, and each may hold
    this gradient's backward again (a nesting as deep as the loop is long): a diagnostic.
    Where the carried value depends on X only as it is held fixed, the backward is right.
    """
    x = gradient.inputs[1]
    marked = _Dependence(x, (gradient, *expansion)).around(visible, around)
    for loop in (n for n in around if n.kind is Kind.FOR and x not in _inside(n)):
        reached = [c for c in loop.regions[0].inputs if backward.reaches(c)]
        for carried in (c for c in reached if c in marked.found):
            raise SourceError(
                gradient.span,
                f"this gradient reaches '{_label(carried)}', which the loop around it "
                f"carries and which depends on '{_label(x)}' through the iterations "
                "before, and a backward does not go back through a loop's earlier "
                "iterations: take the gradient outside the loop",
            )


def _aliased_start_check(gradient: Node, y: Node, visible: list, around: list):
    """A gradient with respect to a value a loop around it carries, where Y also reads
    what that value starts as (or a value computed from it): in the first iteration the
    two are one value, whose gradient has both contributions, and in the later ones they
    are not, so no one backward of the body is the gradient of every iteration."""
    x = gradient.inputs[1]
    for loop in (n for n in around if n.kind is Kind.FOR):
        (body,) = loop.regions
        if x not in body.inputs:
            continue
        start = loop.inputs[body.inputs.index(x)]
        if not isinstance(start, Node):
            continue
        marked = _Dependence(start)
        marked.mark(visible)
        inside = _inside(loop)
        aliased = {v for v in marked.found if v not in inside}
        aliased |= {
            carried
            for carried, begins in zip(body.inputs, loop.inputs)
            if carried is not x and begins in marked.found
        }
        if aliased & _cone(y):
            raise SourceError(
                gradient.span,
                f"this gradient is with respect to '{_label(x)}', which the loop around "
                f"it carries, starting as '{_label(start)}', and Y reads that start too: "
                "in the first iteration they are one value, in the later ones not, so "
                "one backward of the body cannot be the gradient of every iteration; "
                f"start the loop from a copy Y does not read, as (* {_label(start)} 1.0)",
            )


def _cone(y: Node) -> set:
    """The values Y is computed from, Y included."""
    seen, pending = set(), [y]
    while pending:
        node = pending.pop()
        if node not in seen:
            seen.add(node)
            pending.extend(i for i in _reads_around(node) if isinstance(i, Node))
    return seen


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


def _valued(node: Node) -> list:
    """What a node reads for its values: not the tensors an op reads only for the shape."""
    if node.kind is not Kind.OP:
        return reads(node)
    args = REGISTRY[node.op].args
    return [
        value
        for k, value in enumerate(node.inputs)
        if args[min(k, len(args) - 1)].kind is not ArgKind.LIKE
    ]


def _inside(node: Node) -> set:
    """The values made in a node's regions, their inputs included."""
    nodes = [*walk([n for region in node.regions for n in region.nodes])]
    return {*nodes, *(v for n in [node, *nodes] for r in n.regions for v in r.inputs)}


class _Adjoint:
    """The adjoint loop of a FOR: over the layers in reverse, each iteration computes its
    layer's forward again from the carried values the forward loop recorded, then the
    gradient of the values it carries; values read from around the loop collect their
    contributions in carried sums."""

    def __init__(self, backward: _Backward, loop: Node):
        self.backward = backward
        self.t = backward.t
        self.loop = loop
        (self.body,) = loop.regions
        self.outer = [  # the values read from around the loop that depend on X
            value
            for value in dict.fromkeys(_read_in_regions(loop))
            if isinstance(value, Node) and value in backward.depends
        ]

    def run(self, contributions: list) -> list:
        """[(operand, its contribution)] for the loop's starts and the values read around it."""
        loop, body, t = self.loop, self.body, self.t
        starts = self._starts(contributions)
        grads_in = [_input("grad_" + (c.name or "x"), loop) for c in body.inputs]
        for start, carried in zip(starts, grads_in):
            _named_as_carried(start, carried)
        sums = [_input("grad_" + _label(value), loop) for value in self.outer]
        recorded = [
            _input(c.name or _label(start), loop)
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
        value in _reads_around(node) for node in walk(body.nodes)
    )


def _named_as_carried(start: Operand, carried: Node) -> None:
    """A gradient that starts an adjoint loop is named as the gradient the loop carries
    (`grad_x = torch.ones_like(x)`, not `grad_chain = ...` then `grad_x = grad_chain`)."""
    if isinstance(start, Node) and (start.name or "grad_").startswith("grad_"):
        start.name = carried.name


def _input(name: str, loop: Node) -> Node:
    return Node(Kind.INPUT, None, (), {}, loop.span, loop.form, name=name)


class _Copier:
    """A loop body's forward, traced again in an adjoint loop's body: reading the carried
    values it recorded, the adjoint loop's layer and index."""

    def __init__(self, backward: "_Backward", loop: Node, adjoint: Node, copies: dict):
        self.backward = backward
        self.copies = copies  # forward value -> its copy
        self.copies[loop] = adjoint  # what the layer and the index are read through

    def block(self, nodes: list) -> None:
        for node in nodes:
            self.backward.t.add(self.node(node))

    def node(self, node: Node) -> Node:
        if node.kind is Kind.OP and REGISTRY[node.op].draws:
            raise SourceError(
                node.span,
                f"'{node.op}' draws random values, and the adjoint loop of this gradient "
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


def _sums_all(node: Node) -> bool:
    return (
        node.kind is Kind.OP
        and REGISTRY[node.op].totals(node.attrs)
        and isinstance(node.inputs[0], Node)
    )


def _reads_around(node: Node) -> list:
    """The values a node reads, its regions' nodes reading from around them included."""
    return [*node.inputs, *_read_in_regions(node)]


def _read_in_regions(node: Node) -> list:
    """The values a node's regions read from around them, what they give included: a
    loop's body may read (or give) the value a carried one starts as, and that read has
    a contribution of its own, apart from the start's."""
    inside = {value for region in node.regions for value in region.inputs}
    found = [out for region in node.regions for out in region.outputs]
    for inner in walk([r for region in node.regions for r in region.nodes]):
        inside.add(inner)
        inside.update(value for region in inner.regions for value in region.inputs)
        found.extend(reads(inner))
    return [value for value in found if value not in inside]


def _shown(node: Node) -> str:
    """How a comment names a forward value: a carried value (in the loop or after it) by
    its name, else its form."""
    if node.kind in (Kind.INPUT, Kind.ITEM) and node.name:
        return node.name
    return echo(node.form)


def _label(node: Node) -> str:
    """A forward value's name: its source name, else its op and the name of what it reads."""
    if node.name is not None:
        return node.name
    if node.kind is Kind.ITEM:
        return _word(node)
    if node.kind is Kind.IF:
        return _label(_given(node))
    first = next((i for i in node.inputs if isinstance(i, Node)), None)
    return (
        _word(node) if first is None else f"{_word(node)}-{first.name or _word(first)}"
    )


def _given(node: Node) -> Node:
    """What an IF is named as: the value its first branch gives."""
    return next(o for r in node.regions for o in r.outputs if isinstance(o, Node))


def _word(node: Node) -> str:
    if node.kind is Kind.IF:
        return _word(_given(node))
    if node.kind is Kind.ITEM:  # a value a loop gives: named by its form, chain or for
        return node.form.items[0].name
    return REGISTRY[node.op].word if node.kind is Kind.OP else node.what
