"""What each value of a method is written as, and how each of its casts is spelled: the part
of a specialization's plan that emission reads as it writes, deciding none of it.

`written` and `rounds` say what a value's expression is written as, which decides how a
cast of it is written (sx2torch/plan/targets.py, `Target.spelling`). `Spelled` holds, for
one layout, every cast it writes spelled (each read's, each hoisted cast's, each region
output's and each gather's), the results a held target rounds on store, and the regions
whose stores may be reordered.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from sx2torch.ir import Kind, Node, walk
from sx2torch.plan.layout import Layout
from sx2torch.policy import Typed
from sx2torch.policy.rules import output_dtype

# what a cast's spelling leaves its value written as (see `written`)
AFTER = {"fill": "fill", "round": "rounding"}


@dataclass(frozen=True)
class Cast:
    """A cast as it is written: `spelling` (`Target.spelling`'s; None: nothing written) of a
    value read as `want`."""

    spelling: Optional[str]
    want: str


class Spelled:
    """A layout's casts spelled and its roundings on store, decided once for emission and
    for the printed plan (sx2torch/plan/printed.py) alike."""

    def __init__(self, layout: Layout):
        target, conversions = layout.target, layout.conversions
        # (node, input index) -> the read's Cast, or the Hoist it reads by name
        self.reads: dict = {}
        self.outputs: dict = {}  # (node, region, output index) -> Cast
        self.gathered: dict = {}  # a take of a parameter's rows -> the rows' Cast
        self.stores: set = set()  # the ops whose results a held target rounds on store
        self.reordered: set = (
            set()
        )  # (node, region): its stores may be written in any order

        def cast(conversion: tuple, inner: Optional[str]) -> Cast:
            return Cast(target.spelling(*conversion, inner), conversion[1])

        for node in walk(layout.graph.nodes):
            # a read is hoisted or spelled only where it casts
            for index, conversion in conversions.casts.get(node, ()):
                hoist = layout.hoists.reads.get((node, index))
                if hoist is not None:
                    self.reads[node, index] = hoist
                else:
                    operand = node.inputs[index]
                    self.reads[node, index] = cast(conversion, written(layout, operand))
            for r, region in enumerate(node.regions):
                if not _may_draw(region.nodes):
                    self.reordered.add((node, r))
                for k, operand in enumerate(region.outputs):
                    want = output_dtype(layout.typed, node, k)
                    conversion = conversions.conversion_of(operand, want)
                    if conversion is not None:
                        self.outputs[node, r, k] = cast(
                            conversion, written(layout, operand)
                        )
            if node.kind is not Kind.OP:
                continue
            if target.held and rounds(layout.typed, node):
                self.stores.add(node)
            gathered = conversions.gathered(node)
            if gathered is not None:
                self.gathered[node] = cast(gathered, stored(layout, node))
        self.hoists = {  # Hoist -> its Cast
            hoist: cast(hoist.conversion, written(layout, hoist.operand))
            for hoists in layout.hoists.at.values()
            for hoist in hoists
        }

    def rounds(self) -> bool:
        """Whether the method rounds a value (a store, or a cast down), which autograd may
        save for the backward: a held target's method then saves its held bf16 values in
        2 bytes (`@sx.saves_bf16`)."""
        casts = [*self.reads.values(), *self.outputs.values(), *self.hoists.values()]
        casts += self.gathered.values()
        return bool(self.stores) or any(rounding(c) for c in casts)


# the spellings that round (sx2torch/plan/targets.py): a cast down, an argument's at entry
ROUNDINGS = ("round", "to-held")


def rounding(cast) -> bool:
    """Whether a read's cast (a Cast, or the Hoist it reads by name) rounds its value."""
    return isinstance(cast, Cast) and (cast.spelling or "").endswith(ROUNDINGS)


def rounds(typed: Typed, node: Node) -> bool:
    """Whether an op's result is a bf16 value its op can leave, which a held target rounds
    on store."""
    return typed.decided[node].dtype == "bf16" and not node.op.is_exact(node.inputs)


def written(layout: Layout, operand) -> Optional[str]:
    """What an operand is written as where a node reads it: "rounding" (a held target's
    rounding), "fill" (`torch.ones_like(x, dtype=...)`), or None (a name, a member, any
    other expression)."""
    if (
        not isinstance(operand, Node)
        or operand.kind in (Kind.INPUT, Kind.PARAM, Kind.ITEM)
        or operand in layout.named
    ):
        return None
    if operand.kind is Kind.CAST:
        return read_written(layout, operand, 0)
    if operand.kind is not Kind.OP:
        return None
    result = stored(layout, operand)
    gathered = layout.conversions.gathered(operand)
    if gathered is None:
        return result
    return _after(layout.target.spelling(*gathered, result), result)


def stored(layout: Layout, node: Node) -> Optional[str]:
    """What an op's result is written as, before the cast of the rows it gathered."""
    if layout.target.held and rounds(layout.typed, node):
        return "rounding"
    return "fill" if node.op.fills else None


def read_written(layout: Layout, node: Node, index: int) -> Optional[str]:
    """What input `index` is written as as `node` reads it, cast or not."""
    operand = node.inputs[index]
    conversion = layout.conversions.conversion(node, index)
    if conversion is None:
        return written(layout, operand)
    if (node, index) in layout.hoists.reads:
        return None  # read by name
    inner = written(layout, operand)
    return _after(layout.target.spelling(*conversion, inner), inner)


def _after(spelling: Optional[str], inner: Optional[str]) -> Optional[str]:
    return inner if spelling is None else AFTER.get(spelling)


def _may_draw(nodes: list) -> bool:
    """Whether a region's values may draw random numbers: a draw, or a call."""
    return any(
        node.kind in (Kind.CALL, Kind.SUBMODEL)
        or (node.kind is Kind.OP and node.op.draws)
        for node in walk(nodes)
    )
