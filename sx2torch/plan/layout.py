"""Where each value of a specialization is written: the layout of a method's statements.

A node becomes a statement when the source names it (`let`), when several
nodes read it, when an op must read it twice, or when it sits in another
precision block than its reader; otherwise its expression is written inside its
reader's. A compile-time number the source names (`let`) becomes a statement at the
top of the method where the method writes it more than once. Casts are explicit: a parameter's cast down is written once at the
top of the method, a cast several readers share once before the first of them.
The layout also knows, for liveness, the last statement that reads each value. It is
the plan the names pass names and emission writes: which values are statements, in which
blocks, and which casts are hoisted before which statement (sx2torch/plan/casts.py).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import cached_property
from typing import Optional

from sx2torch.plan.casts import Conversions, Hoists, cast_reads
from sx2torch.plan.targets import Target
from sx2torch.ir import ISLAND, Kind, Node, Scalar, numbers_read, outputs, reads, walk
from sx2torch.policy import Lowered, Typed
from sx2torch.syntax.scalars import (
    MAX_OPERANDS,
    ScalarOp,
    operands_of,
    scalars_in,
    walk_up,
)

RETURN = "return"
TOP = "top"  # where a parameter's casts are written: before every statement
MAX_BLOCKS = 4  # precision blocks nested as in the source; deeper, only those that change something
MAX_INLINE_DEPTH = 24  # a deeper expression is split into statements (readable, and within Python's limits)


@dataclass(eq=False)
class Yield:
    """The end of a region, as a statement: it stores the region's outputs in the
    variables of its IF or FOR."""

    node: Node
    region: int


class Structure:
    """What every layout of one graph shares, whatever its specialization's dtypes, its
    target and its casts: where each node and carried value is made (`scope`, and each
    region's `parent`), each value's reads (`readers`; `numbers`: the run-time numbers each
    node reads), the ends of its regions (`yields`), the compile-time numbers kept as
    locals (`scalars`), and which nodes are statements, found once for each ambient
    precision and set of topk's gathers, all they depend on beside the graph (`laid`). The
    plan pass lays a graph out once for each specialization on the target and on the
    deciding one, for each of sharing's views and for the casts at entry: six times for
    each defun of an attention block."""

    def __init__(self, graph):
        self.graph = graph
        self.yields: dict = {}
        self.scope, self.parent = _scopes(graph)
        self.readers, self.numbers = _readers(self)
        self.scalars = _scalar_locals(graph)
        self.laid: dict = {}  # (ambient, topk's gathers) -> Laid

    def end(self, node: Node, index: int) -> Yield:
        return self.yields.setdefault((node, index), Yield(node, index))


@dataclass(frozen=True)
class Laid:
    """Which nodes a layout writes as statements, and where: see `Layout`."""

    named: frozenset
    statement_of: dict
    nodes_of: dict
    order: dict
    statements: list  # those casts may be written before, in order (`_statements`)


class Layout:
    """A specialization's statements on a target: which values are statements, in which
    precision blocks, and the casts (`conversions`: each read's; `hoists`: those written as
    statements). `conversions` defaults to the specialization's own (sharing compares
    another's); `entry` holds the arguments cast down once at entry. `structure`: its
    graph's, where another layout of the graph has made it."""

    def __init__(
        self,
        typed: Typed,
        target: Target,
        lowered: Lowered,
        entry=frozenset(),
        conversions: Optional[Conversions] = None,
        structure: Optional[Structure] = None,
    ):
        self.typed = typed
        self.target = target
        self.lowered = lowered
        self.conversions = conversions or Conversions(typed, target, lowered, entry)
        self.graph = typed.graph
        self.structure = structure or Structure(typed.graph)
        self.yields = self.structure.yields
        self.scope, self.parent = self.structure.scope, self.structure.parent
        self.readers, self.numbers = self.structure.readers, self.structure.numbers
        self.casts = cast_reads(self.conversions, self.scope)
        # gather -> the topk-indices whose call's values it reads (see `_topk_values`)
        self.topk_values = _topk_values(self)
        key = (typed.ambient, tuple(self.topk_values.items()))
        if key not in self.structure.laid:
            self.structure.laid[key] = self._laid()
        laid = self.structure.laid[key]
        self.named, self.statement_of = laid.named, laid.statement_of
        self.nodes_of, self.order = laid.nodes_of, laid.order
        self.unblocked = _unblocked(self)
        self.scalars = self.structure.scalars
        self.hoists = Hoists(self.conversions, self.casts, self.scope, self.parent)
        self.hoists.top(TOP)
        for statement in laid.statements:
            region = self.region_of(statement)
            self.hoists.write(statement, region, self.nodes_of.get(statement, []))

    @cached_property
    def last_read(self) -> dict:
        """The last statement that reads each value (`_last_reads`), for the names pass:
        made where a layout is named, not for those sharing only prints."""
        last = _last_reads(self)
        # a compile-time number kept as a local is assigned first and read to the end
        last.update((scalar, self.order[RETURN]) for _, scalar in self.scalars)
        return last

    def _laid(self) -> Laid:
        """Its statements, from its graph's structure, its ambient precision and its
        gathers of topk's values alone."""
        self.named = self._named()
        self.statement_of = self._statement_of()
        self.nodes_of = self._nodes_of()
        self.order = {
            statement: i
            for i, statement in enumerate(
                s for s in self._sequence() if s in self.named or isinstance(s, Yield)
            )
        }
        self.order[RETURN] = len(self.order)
        self.order[TOP] = -1
        return Laid(
            frozenset(self.named),
            self.statement_of,
            self.nodes_of,
            self.order,
            self._statements(),
        )

    def _sequence(self) -> list:
        """Nodes and region ends in the order their statements are written."""
        order: list = []

        def visit(nodes: list) -> None:
            for node in nodes:
                order.append(node)
                for index, region in enumerate(node.regions):
                    visit(region.nodes)
                    order.append(self.end(node, index))

        visit(self.graph.nodes)
        return order

    def end(self, node: Node, index: int) -> Yield:
        return self.structure.end(node, index)

    def _statements(self) -> list:
        """The statements casts may be written before, in the order they are written: the
        named nodes, the end of each region of a compound one, and a return that computes.
        """
        found: list = []

        def visit(nodes: list) -> None:
            for node in nodes:
                if node not in self.named:
                    continue
                found.append(node)
                if self.compound(node, self.named):
                    for index, region in enumerate(node.regions):
                        visit(region.nodes)
                        found.append(self.end(node, index))

        visit(self.graph.nodes)
        return found + [RETURN] if returns_expression(self) else found

    def region_of(self, reader):
        """The region a reader's statement is written in."""
        if reader in (RETURN, TOP):
            return None
        if isinstance(reader, Yield):
            return reader.node.regions[reader.region]
        return self.scope[reader]

    def _named(self) -> set:
        """The nodes written as statements of their own."""
        named, depth = set(), {}
        for node in _post_order(self.graph.nodes):
            if node.kind in (Kind.INPUT, Kind.PARAM, Kind.ITEM):
                continue
            readers = self.readers[node]
            depth[node] = 1 + max(
                (
                    depth.get(i, 0)
                    for i in reads(node, self.numbers.get(node, ()))
                    if isinstance(i, Node)
                ),
                default=0,
            )
            if (
                self.compound(node, named)
                or node.name is not None
                or len(readers) != 1
                or depth[node] >= MAX_INLINE_DEPTH
                or self._apart(node, readers[0][0])
            ):
                named.add(node)
                depth[node] = 0
        for gather, indices in self.topk_values.items():
            # a gather at indices nothing else reads is topk's values; else the indices'
            # statement assigns both, `top, chosen = torch.topk(...)`
            named.discard(indices if self.absorbs(gather) else gather)
        return named

    def _apart(self, node: Node, reader) -> bool:
        """Whether a value read once is a statement of its own all the same: read by an
        ITEM, returned beside other values from inside a block, read by an op that names
        its inputs, or read in another region or precision block."""
        if reader == RETURN:
            # several values returned: each a name, `return h, pooled`
            several = isinstance(self.graph.output, tuple) and bool(self.path(node))
            return several or self.scope[node] is not None
        if isinstance(reader, Yield):
            return self.region_of(reader) is not self.scope[node] or self._path_of(
                reader
            ) != self.path(node)
        return (
            reader.kind is Kind.ITEM
            or (reader.kind is Kind.OP and reader.op.names_inputs(reader))
            or self.scope[reader] is not self.scope[node]
            or self.path(reader) != self.path(node)
        )

    def absorbs(self, gather: Node) -> bool:
        """Whether a gather of topk's values is the only reader of its indices."""
        return self.readers[self.topk_values[gather]] == [(gather, 1)]

    def compound(self, node: Node, named: set) -> bool:
        """Whether a node is written as a compound statement: a FOR, or an IF whose
        branches need statements of their own (else it is a conditional expression)."""
        return node.kind is Kind.FOR or (
            node.kind is Kind.IF
            and any(n in named for r in node.regions for n in walk(r.nodes))
        )

    def _path_of(self, reader) -> tuple:
        """A region's outputs are stored in the blocks of its node."""
        return self.path(reader.node if isinstance(reader, Yield) else reader)

    def _statement_of(self) -> dict:
        """For each node, the statement its expression is written in."""
        where: dict = {}
        for node in reversed(list(_post_order(self.graph.nodes))):
            if node in self.named:
                where[node] = node
            elif self.readers.get(node):
                reader = self.readers[node][0][0]
                where[node] = self.written_in(reader, where)
        for gather, indices in self.topk_values.items():
            if not self.absorbs(gather):
                where[gather] = indices  # assigned by the indices' statement
        return where

    def _nodes_of(self) -> dict:
        """Statement -> the nodes written in it, in walk order, loops left out: found once,
        not by a walk of the whole graph per statement."""
        nodes: dict = {}
        for node in walk(self.graph.nodes):
            if node.kind is not Kind.FOR and node in self.statement_of:
                nodes.setdefault(self.statement_of[node], []).append(node)
        return nodes

    def written_in(self, reader, where: dict):
        """The statement a reader's expression is in: an IF written as an expression
        stores its regions' outputs where it is itself written."""
        if isinstance(reader, Yield):
            compound = self.compound(reader.node, self.named)
            return reader if compound else where[reader.node]
        return reader if reader == RETURN else where[reader]

    def path(self, node: Node) -> tuple:
        """The precision blocks a node's statement sits in, outermost first."""
        if not node.frames:  # most nodes: no block
            return ()
        blocks, mode = [], self.typed.ambient
        for frame in node.frames:
            if frame.mode != mode:
                blocks.append(frame)
                mode = frame.mode
        return _without_repeats(tuple(blocks))


def _scopes(graph) -> tuple:
    """Each node and region input -> the region it is made in (None: the method's own);
    each region -> the region its node is in."""
    scope: dict = {node: None for node in graph.inputs}
    parent: dict = {}

    def visit(nodes: list, region) -> None:
        for node in nodes:
            scope[node] = region
            for inner in node.regions:
                parent[inner] = region
                scope.update((i, inner) for i in inner.inputs)
                visit(inner.nodes, inner)

    visit(graph.nodes, None)
    return scope, parent


def _readers(structure: Structure) -> tuple:
    """Each value -> (reader, input index) of its reads; each node that reads run-time
    numbers -> those (`numbers_read`), kept for liveness (few nodes read any: a long
    expression's keep no empty list each)."""
    graph = structure.graph
    readers: dict = {node: [] for node in structure.scope}
    numbers: dict = {}
    for node in walk(graph.nodes):
        for index, operand in enumerate(node.inputs):
            if isinstance(operand, Node):
                readers[operand].append((node, index))
        found = numbers_read(node)
        if found:
            numbers[node] = found
        for number in found:  # a size in a bound: read, never cast
            readers[number].append((node, None))
        for r, region in enumerate(node.regions):
            for index, out in enumerate(region.outputs):
                if isinstance(out, Node):
                    readers[out].append((structure.end(node, r), index))
    for output in outputs(graph):
        if isinstance(output, Node) and output in readers:
            readers[output].append((RETURN, None))
    return readers, numbers


def _topk_values(layout: Layout) -> dict:
    """Each gather of a value at topk's indices of it along the same axis (the entry's
    `picks` and `picked`), both read uncast in one block: topk's own values are those
    elements (the same bits, and the same gradient), so one torch.topk call gives both.
    """
    found: dict = {}
    for node in walk(layout.graph.nodes):
        picks = node.kind is Kind.OP and node.op.picks
        indices = node.inputs[1] if picks else None
        if (
            isinstance(indices, Node)
            and indices.kind is Kind.OP
            and indices.op.picked
            and indices.inputs[0] is node.inputs[0]
            and indices.attrs["axis"] == node.attrs["axis"]
            and indices not in found.values()
            and not node.aliases
            and not indices.aliases
            and layout.conversions.conversion(node, 0) is None
            and layout.conversions.conversion(indices, 0) is None
            and layout.scope[node] is layout.scope[indices]
            and layout.path(node) == layout.path(indices)
        ):
            found[node] = indices
    return found


def _unblocked(layout: Layout) -> set:
    """The f32 islands written without `torch.autocast(..., enabled=False)`: those an
    enabled autocast would not change. Only the ops autocast runs in lower precision
    (the entry's `autocasts`: GEMMs) compute otherwise under it; its f32 ops take the
    island's f32 inputs as they are, and every other op computes in its inputs' dtype.
    A call keeps the block (the callee runs under it), as does a value computed in bf16
    there (autocast's f32 ops would widen it)."""
    islands, blocked = set(), set()
    for node in walk(layout.graph.nodes):
        if not node.frames:  # most nodes: in no island
            continue
        frames = {f for f in node.frames if f.mode == ISLAND}
        islands |= frames
        if (
            node.kind in (Kind.CALL, Kind.SUBMODEL, Kind.FOR)
            or node.kind is Kind.OP
            and (node.op.autocasts or layout.typed.decision(node).compute == "bf16")
        ):
            blocked |= frames
    return islands - blocked


def _scalar_locals(graph) -> tuple:
    """(name, Scalar) of the `let`-bound compile-time numbers kept as locals, in the
    order they are bound: each that the method writes more than once, counting a
    number written inside a kept one's definition once, and each that, written in place,
    would nest too deep (`_too_deep`). They are assigned before every
    statement, so only numbers of consts and &key arguments are (no loop's layer or
    index, no run-time size). Each number is visited once (a let's number is read by
    reference where it is written), so a long chain of lets costs its length."""
    candidates: dict = {}  # Scalar -> the first name bound to it
    top: dict = {}  # id -> whether it is computed first, shared by the lets' walks
    for name, scalar in graph.lets:
        if walk_up(scalar, _computed_first, done=top):
            candidates.setdefault(scalar, name)
    if not candidates:
        return ()
    by_id = {id(scalar): scalar for scalar in candidates}
    # id -> Counter of the candidates in a number's operands, none inside another
    below: dict = {}

    def inside(scalar: Scalar, of) -> Counter:
        found: Counter = Counter()
        for operand in operands_of(scalar):
            found.update({id(operand): 1} if id(operand) in by_id else of(operand))
        return found

    def parts(scalar: Scalar) -> Counter:
        """The candidates in a number's operands."""
        return walk_up(scalar, inside, lambda s, _: _uncounted(s, by_id), done=below)

    written: Counter = Counter()
    for value in _written_scalars(graph):
        for scalar in scalars_in(value):
            written.update({id(scalar): 1} if id(scalar) in by_id else parts(scalar))
    # the candidates each definition holds: a later number holds earlier ones
    holders: dict = {}
    for scalar in candidates:
        for inner, times in parts(scalar).items():
            holders.setdefault(inner, []).append((id(scalar), times))
    occurrences: dict = {}
    kept: set = _too_deep(candidates)
    for scalar in reversed(list(candidates)):
        key = id(scalar)
        occurrences[key] = written[key] + sum(
            times * (1 if holder in kept else occurrences[holder])
            for holder, times in holders.get(key, [])
        )
        if occurrences[key] > 1:
            kept.add(key)
    return tuple((name, s) for s, name in candidates.items() if id(s) in kept)


def _uncounted(scalar: Scalar, by_id: dict) -> tuple:
    """A number's operands but the candidates, which are counted, not walked into."""
    return tuple(o for o in operands_of(scalar) if id(o) not in by_id)


def _too_deep(candidates: dict) -> set:
    """The ids of the candidates that, written in place, would nest deeper than
    MAX_INLINE_DEPTH or chain more than MAX_OPERANDS operands, in the order they are
    bound, each kept one written by its name: a chain of lets each inside the one before
    (`(- 3 (- a 1))`, an `if`'s branch) is then a local every few levels, where written
    whole it would nest as deep as the chain (beyond what Python's parser and libcst's
    code take: they recurse once per level)."""
    kept, written = set(), {}  # written: id -> (depth, operands), shared by the walks
    for scalar in candidates:
        depth, chained = walk_up(scalar, _nesting, done=written)
        if depth > MAX_INLINE_DEPTH or chained > MAX_OPERANDS:
            kept.add(id(scalar))
            written[id(scalar)] = (0, 1)  # its name, where a later one reads it
    return kept


# Python's precedence of the arithmetic written as a chain: a left operand of the same or a
# higher level continues the chain unparenthesized (`a - 2 + 2`), one level deep
LEVELS = {ScalarOp.ADD: 1, ScalarOp.SUB: 1, ScalarOp.MUL: 2, ScalarOp.DIV: 2}
LEVELS.update({ScalarOp.FLOORDIV: 2, ScalarOp.MOD: 2, ScalarOp.POW: 3})


def _nesting(scalar: Scalar, of) -> tuple:
    """(how deep a number is written in place, the operands of the chain it ends): a leaf
    (0, 1); a chain continues its first operand's where that is written unparenthesized,
    and every other operand nests one level deeper."""
    if not operands_of(scalar):
        return 0, 1
    first, level = scalar.args[0], LEVELS.get(scalar.op)
    continues = (
        level is not None
        and isinstance(first, Scalar)
        and LEVELS.get(first.op, 0) >= level
        and scalar.op is not ScalarOp.POW
    )
    nested = scalars_in(scalar.args[1:] if continues else scalar.args)
    depth = max([1 + of(o)[0] for o in nested] + [of(first)[0] if continues else 0])
    if not continues:
        return depth, len(scalar.args) if level is not None else 1
    return depth, of(first)[1] + len(scalar.args) - 1


def _written_scalars(graph):
    """The compile-time numbers a method writes: operands, attributes (an op's, an IF's
    condition, a call's keys), branch values and what it returns."""
    for node in walk(graph.nodes):
        yield from node.inputs
        yield from node.attrs.values()
        for region in node.regions:
            yield from region.outputs
    yield graph.output


def _computed_first(scalar: Scalar, of) -> bool:
    """Whether a number can be computed before the method's first statement."""
    if scalar.op in (ScalarOp.LAYER, ScalarOp.INDEX, ScalarOp.RUN):
        return False
    if scalar.op is ScalarOp.CONST:
        return len(scalar.args) < 4  # not a const of a loop's layer
    return all(of(operand) for operand in operands_of(scalar))


def _last_reads(layout: Layout) -> dict:
    """The last statement that reads each value, and each cast of a value; a value made
    before a loop and read in it is live until the loop ends. A carried value is live
    until its iteration last reads it: the loop's store at the end gives the next.
    """
    last: dict = {}

    def note(value, at: int) -> None:
        last[value] = max(last.get(value, -1), at)

    for node in walk(layout.graph.nodes):
        at = layout.order.get(layout.statement_of.get(node), -1)
        for index, operand in enumerate(node.inputs):
            conversion = layout.conversions.conversion(node, index)
            for value in (operand, (operand, conversion and conversion[1])):
                note(value, at)
        for number in layout.numbers.get(node, ()):
            note(number, at)
        for r, region in enumerate(node.regions):
            end = layout.written_in(layout.end(node, r), layout.statement_of)
            for out in region.outputs:
                note(out, layout.order.get(end, -1))
            if node.kind is Kind.IF:  # each branch ends storing into the if's name
                note(node, layout.order.get(end, -1))
    for output in outputs(layout.graph):
        if isinstance(output, Node):
            last[output] = layout.order[RETURN]
    for loop in (n for n in walk(layout.graph.nodes) if n.kind is Kind.FOR):
        (body,) = loop.regions
        start, end = layout.order[loop], layout.order[layout.end(loop, 0)]
        inside = set(walk(body.nodes)) | set(body.inputs)
        for value, at in list(last.items()):
            key = value[0] if isinstance(value, tuple) else value
            if start < at <= end and key not in inside:
                last[value] = max(at, end)
        last[loop, "layer"] = last[loop, "index"] = end
        forward = loop.attrs.get("reverse")
        if forward is not None:  # the lists of the forward's carried values
            last.update(((forward, k), end) for k in range(len(forward.inputs)))
    return last


def _without_repeats(blocks: tuple) -> tuple:
    """Blocks as the source nests them, MAX_BLOCKS deep; deeper, one whose kind is already open is
    left out: an island inside an island (through a region) changes nothing, autocast being off
    already, nor does a region marker inside a region. So the output stays within Python's limit
    of 20 nested blocks, whatever the depth of with-numerics forms."""
    kept = list(blocks[:MAX_BLOCKS])
    for frame in blocks[MAX_BLOCKS:]:
        if all(open_.mode != frame.mode for open_ in kept):
            kept.append(frame)
    return tuple(kept)


def _post_order(nodes: list):
    """Every node after its regions' nodes."""
    for node in nodes:
        for region in node.regions:
            yield from _post_order(region.nodes)
        yield node


def returns_expression(layout: Layout) -> bool:
    """Whether the return statement computes a value, not only names the values."""
    return any(
        isinstance(o, Node)
        and o not in layout.named
        and o.kind not in (Kind.INPUT, Kind.PARAM, Kind.ITEM)
        for o in outputs(layout.graph)
    )
