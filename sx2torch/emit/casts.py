"""Where a method's casts are written: the dtype each operand is read in, which casts
several readers share, and which cast a reader may read by name.

`Casts` is the part of the layout (sx2torch/emit/layout.py) that decides casts; the layout
gives it `typed`, `target`, `lowered`, `scope`, `parent`, `nodes_of` and `region_of`.
"""

from __future__ import annotations

from typing import Optional

from sx2torch.ir import Kind, Node, Scalar, walk


class Casts:
    def conversion(self, node: Node, index: int) -> Optional[tuple]:
        """(dtype it has, dtype `node` reads it in) for an input that needs a cast, else None."""
        if not self.target.held and self.lowered.promoted(self.typed, node, index):
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
        if node.kind is not Kind.OP or node.op != "take":
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
        return self.conversion_of(node.inputs[index], want)

    def conversion_of(self, operand, want: Optional[str]) -> Optional[tuple]:
        """A bf16-stored parameter is "bf16-stored": a real bf16 tensor even where the target
        holds bf16 values in f32, so that target reads it through `.float()`."""
        if want is None or isinstance(operand, Scalar) or operand in self.entry:
            return None
        have = self.lowered.value_dtype(self.typed, operand)
        if have not in ("f32", "bf16"):
            return None
        if self.target.held and have == "bf16":
            if operand.kind is Kind.PARAM:
                return "bf16-stored", want
            if want == "bf16":
                return None  # a bf16 value already is an f32 tensor there
        return None if have == want else (have, want)

    def _casts(self) -> dict:
        """(value, dtype, region) -> how many operand slots of that region read the value
        cast to dtype; a cast is shared within its region only."""
        counts: dict = {}
        for node in walk(self.graph.nodes):
            for index, operand in enumerate(node.inputs):
                conversion = self.conversion(node, index)
                if conversion and node.kind not in (Kind.CAST, Kind.FOR):
                    key = (operand, conversion, self.scope[node])
                    counts[key] = counts.get(key, 0) + 1
        return counts

    def shared_casts(self, statement, hoisted: dict) -> list:
        """Casts to write before this statement: those read more than once in a region (or
        of a loop's layer's parameter) whose first reader is in it, and not written in its
        region or around it already."""
        region = self.region_of(statement)
        due = []
        for node in self.nodes_of.get(id(statement), []):
            for index, operand in enumerate(node.inputs):
                conversion = self.conversion(node, index)
                key = (operand, conversion)
                shared = (
                    self.casts.get((operand, conversion, self.scope[node]), 0) > 1
                    or conversion is not None
                    and is_local_param(operand)
                ) and not is_conditional(operand)
                written = self.visible(hoisted, key, region) is not None
                if shared and not written and key not in due:
                    due.append(key)
        return due

    def visible(self, hoisted: dict, key: tuple, region) -> Optional[str]:
        """The name of a cast written in `region` or around it; `hoisted` holds
        (value, conversion) -> [(region, name)]."""
        for where, name in hoisted.get(key, ()):
            inner = region
            while inner is not where and inner is not None:
                inner = self.parent[inner]
            if inner is where:
                return name
        return None


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
