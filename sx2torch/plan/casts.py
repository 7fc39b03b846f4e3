"""Where a method's casts are written: the dtype each operand is read in (`Conversions`),
and which casts are written as statements of their own, before which statement, and read
by name by which reads (`Hoists`). The layout (sx2torch/plan/layout.py) holds one of each
and gives `Hoists` its statements in the order they are written; naming names the hoisted
casts and emission writes them, neither deciding them again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from sx2torch.plan.targets import Target, or_bool, or_none
from sx2torch.ir import DType, Kind, Node, Scalar, walk
from sx2torch.policy import Lowered, Typed
from sx2torch.policy.rules import Why


class Conversions:
    """The cast, if any, each read of a specialization needs on a target; `entry` holds the
    arguments cast down once at entry, read as they are then.

    Each read's is decided once, as it is made: the layout, its hoists, its liveness, the
    plan and the emission all ask for each read's several times, and deciding it (the
    dtypes read and had, and the 0-d promotion of its op) was a third of a long
    expression's compile."""

    def __init__(
        self, typed: Typed, target: Target, lowered: Lowered, entry=frozenset()
    ):
        self.typed = typed
        self.target = target
        self.lowered = lowered
        self.entry = entry
        self.reads: dict = {}
        # node -> (input index, conversion) of each of its reads that casts, in walk order:
        # the layout's counts, hoists and spellings read these, not every read again
        self.casts: dict = {}
        for node in walk(typed.graph.nodes):
            # a held target computes on f32 tensors, whose kernels promote nothing
            promoted = (
                lowered.promoted(typed, node)
                if not target.held
                else [False] * len(node.inputs)
            )
            for index in range(len(node.inputs)):
                conversion = self._decide(node, index, promoted[index])
                self.reads[node, index] = conversion
                if conversion is not None:
                    self.casts.setdefault(node, []).append((index, conversion))

    def conversion(self, node: Node, index: int) -> Optional[tuple]:
        """(dtype it has, dtype `node` reads it in) for an input that needs a cast, else None."""
        return self.reads[node, index]

    def _decide(self, node: Node, index: int, promoted: bool) -> Optional[tuple]:
        if promoted:
            # A GPU's kernel converts a 0-d operand to the op's dtype as it loads it, on
            # either side; torch's CPU kernel reads a later one as a scalar, in f32: the
            # cuda module writes that cast down, so it computes the rule on a CPU too.
            conversion = self._wanted(node, index)
            narrows = index > 0 and conversion and conversion[1] == "bf16"
            return conversion if narrows else None
        if index == 0 and self.gathered(node) is not None:
            return None  # the rows are cast once gathered
        return self._wanted(node, index)

    def gathered(self, node: Node) -> Optional[tuple]:
        """The cast of a parameter's rows that a `take` reads: written after the gather,
        since the cast is elementwise, so a forward casts the rows it reads, not the table.
        A bf16-stored table read in f32 is widened first (and a held target's always: it
        makes no bf16 tensor): the cast's backward then rounds the summed f32 gradient once,
        where a widening after the gather would sum repeated ids' rows in bf16."""
        if node.kind is not Kind.OP or not node.op.gathers:
            return None
        if node.inputs[0].kind is not Kind.PARAM:
            return None
        conversion = self._wanted(node, 0)
        widened = (
            conversion and "bf16-stored" in conversion or conversion == ("bf16", "f32")
        )
        return None if widened else conversion

    def _wanted(self, node: Node, index: int) -> Optional[tuple]:
        want = self.lowered.read_dtype(self.typed, node, index)
        conversion = self.conversion_of(node.inputs[index], want)
        if conversion and self.lowered.may_be_bool(self.typed, node, index):
            conversion = or_bool(conversion[0]), conversion[1]
        # `(if has-bias bias none)`: the cast passes None as it is (written inside the
        # branch that reads the tensor)
        if conversion and may_be_none(node.inputs[index], self.typed):
            conversion = or_none(conversion[0]), conversion[1]
        return conversion

    def own_cast(self, node: Node) -> bool:
        """Whether `node` is a negation that reads its f32 operand cast down where the f32
        code would cast its result (the policy's NEGATED): that cast stays its own, as the
        one after the negation was, never shared with other reads of the operand, since
        autograd sums the gradients through a shared cast in bf16 and through separate
        casts in f32."""
        reason = self.typed.decision(node).reason
        return reason is not None and reason.why is Why.NEGATED

    def conversion_of(self, operand, want: Optional[str]) -> Optional[tuple]:
        """A bf16-stored parameter is "bf16-stored": a real bf16 tensor even where the target
        holds bf16 values in f32, so that target reads it through `.float()`."""
        if want is None or isinstance(operand, Scalar) or operand in self.entry:
            return None
        have = self.lowered.value_dtype(self.typed, operand)
        # only a cast reads an integer or a boolean as a float (read_dtype); an `if` or a
        # loop that stores one as it is converts nothing
        if have in (DType.INT, DType.BOOL):
            return None if want == have else (have, want)
        if have not in ("f32", "bf16"):
            return None
        if self.target.held and have == "bf16":
            if operand.kind is Kind.PARAM:
                return "bf16-stored", want
            if want == "bf16":
                return None  # a bf16 value already is an f32 tensor there
        return None if have == want else (have, want)


def cast_reads(conversions: Conversions, scope: dict) -> dict:
    """(value, conversion, region) -> how many operand slots of that region read the value
    so cast; a cast is shared within its region only."""
    counts: dict = {}
    for node, casts in conversions.casts.items():
        if node.kind in (Kind.CAST, Kind.FOR) or conversions.own_cast(node):
            continue
        for index, conversion in casts:
            key = (node.inputs[index], conversion, scope[node])
            counts[key] = counts.get(key, 0) + 1
    return counts


@dataclass(frozen=True)
class Hoist:
    """A cast written as a statement of its own, before `statement`, and read by name."""

    operand: Node
    conversion: tuple
    statement: object  # a Node, a region's end (a Yield), or the layout's TOP or RETURN


class Hoists:
    """Which casts are hoisted: written once before a statement, their readers then reading
    them by name. Its inputs: the conversions, `cast_reads`'s counts, the region each node
    is made in (`scope`) and the region each region is in (`parent`); then the layout calls
    `top` and `write`, statement by statement, in the order the statements are written.
    """

    def __init__(self, conversions: Conversions, counts: dict, scope: dict, parent):
        self.conversions = conversions
        self.counts = counts
        self.scope = scope
        self.parent = parent
        self.at: dict = {}  # statement -> [Hoist], in the order they are written
        self.reads: dict = (
            {}
        )  # (node, input index) -> the Hoist that read reads by name
        self._written: dict = {}  # (value, conversion) -> [(region, Hoist)]

    def top(self, statement) -> None:
        """Every cast of a parameter read outside loops and `:when`, written at the top."""
        for operand, conversion, _ in self.counts:
            if (
                operand.kind is Kind.PARAM
                and not is_local_param(operand)
                and not held_only(conversion)
                and (operand, conversion) not in self._written
            ):
                self._add(Hoist(operand, conversion, statement), None)

    def write(self, statement, region, written: list) -> None:
        """The casts due before a statement written in `region`, whose expression holds the
        nodes `written`; then which of its reads read a hoisted cast. A loop's own reads
        (its initial values) are cast where it reads them, never hoisted for it."""
        for operand, conversion in self._due(region, written):
            self._add(Hoist(operand, conversion, statement), region)
        loop = [statement] if getattr(statement, "kind", None) is Kind.FOR else []
        for node in written + loop:
            casts = self.conversions.casts.get(node, ())
            if not casts or self.conversions.own_cast(node):
                continue
            for index, conversion in casts:
                operand = node.inputs[index]
                hoist = self._visible((operand, conversion), self.scope[node])
                if hoist is not None:
                    self.reads[node, index] = hoist

    def _add(self, hoist: Hoist, region) -> None:
        self.at.setdefault(hoist.statement, []).append(hoist)
        key = (hoist.operand, hoist.conversion)
        self._written.setdefault(key, []).append((region, hoist))

    def _due(self, region, written: list) -> list:
        """Casts to write before a statement: those read more than once in a region (or
        of a loop's layer's parameter) whose first reader is in it, and not written in its
        region or around it already."""
        due = []
        for node in written:
            casts = self.conversions.casts.get(node, ())  # a read casting nothing: none
            if not casts or self.conversions.own_cast(node):
                continue
            for index, conversion in casts:
                operand = node.inputs[index]
                key = (operand, conversion)
                shared = (
                    self.counts.get((operand, conversion, self.scope[node]), 0) > 1
                    or is_local_param(operand)
                ) and not (is_conditional(operand) or held_only(conversion))
                if shared and self._visible(key, region) is None and key not in due:
                    due.append(key)
        return due

    def _visible(self, key: tuple, region) -> Optional[Hoist]:
        """The cast written in `region` or around it, if any."""
        for where, hoist in self._written.get(key, ()):
            inner = region
            while inner is not where and inner is not None:
                inner = self.parent[inner]
            if inner is where:
                return hoist
        return None


def cast_once(conversions: Conversions, reads: list) -> bool:
    """Whether an argument's reads, (node, input index) each, all cast down, can read one
    cast at entry: not where a negation's own cast is one of several (`own_cast`)."""
    return len(reads) == 1 or not any(conversions.own_cast(r) for r, _ in reads)


def held_only(conversion: Optional[tuple]) -> bool:
    """A bf16-stored parameter read in bf16 on a held target: the `.float()` that makes it
    the f32 tensor such a target computes on, where the cuda file reads the parameter as it
    is. Written where it is read, never a statement, so the two files have one set of
    statements."""
    return conversion == ("bf16-stored", "bf16")


def is_conditional(operand) -> bool:
    """A `:when` parameter, which some instances lack: cast where it is read, inside the
    branch that reads it, never before."""
    return isinstance(operand, Node) and "conditional" in operand.attrs


def is_local_param(operand) -> bool:
    """A parameter read through a loop's layer, which exists only inside the loop, or one
    made on some instances only (`:when`): cast where it is read, not at the top."""
    return (
        isinstance(operand, Node)
        and operand.kind is Kind.PARAM
        and ("loop" in operand.attrs or "conditional" in operand.attrs)
    )


def may_be_none(operand, typed: Typed, found=frozenset()) -> bool:
    """Whether `operand` may be None when the method runs: `none`, an `if` with a `none`
    branch, an argument in `found` ((specialization, index) a caller may pass None), or
    a loop's carried value that starts as one."""
    if operand is None:
        return True
    if not isinstance(operand, Node):
        return False
    if operand.kind is Kind.IF:
        outputs = [o for region in operand.regions for o in region.outputs]
        return any(may_be_none(o, typed, found) for o in outputs)
    inputs = typed.graph.inputs
    if operand in inputs:
        return (typed, inputs.index(operand)) in found
    # a loop's carried value, as the first layer gets it: none where it starts so
    return operand.kind is Kind.INPUT and any(
        may_be_none(start, typed, found)
        for loop in walk(typed.graph.nodes)
        if loop.kind is Kind.FOR
        for start, carried in zip(loop.inputs, loop.regions[0].inputs)
        if carried is operand
    )
