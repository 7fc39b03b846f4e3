"""Which specializations of a defun share one method, before they are named.

Two share a method when the method of one, called with the other's arguments, computes the
other on every target: their plans on a held target (methods.DECIDING), where every rounding
is written out, print the same (sx2torch/plan/printed.py: the typed graph noted with each
read's cast, the hoisted casts, the roundings on store and the methods called), or print
the same once the casts down that are identities on the other's bf16 arguments are left
out (`sx.round_to_bf16(x)` on a bf16 `x`). The second is then "served" by the first, whose
code the method is. A cast up stays: `sx.as_f32` rounds the gradient through it, which an
f32 argument's gradient is not. No code is written to decide it.

The specializations come callees first. Each joins the first group whose method serves it;
else it starts a group, which then takes in an earlier group it serves whole (the f32 copy
that casts at its reads comes after the bf16 code the program runs), unless a caller's
comparison already counted on that group's method.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional

from sx2torch.plan.casts import Conversions, cast_once
from sx2torch.plan.layout import Layout
from sx2torch.plan.printed import printed
import sx2torch.printer as printer
from sx2torch.ir import Kind, Node
from sx2torch.policy import Lowered, Typed


@dataclass(eq=False)
class Group:
    stand_in: str  # the name callers call it by while groups are formed
    rep: Typed  # whose code the method is
    # the rep's printed plan; None where its defun has one specialization
    plan: Optional[str]
    members: list = field(default_factory=list)


class View(Conversions):
    """A specialization's casts as its code runs on another's arguments (`under`): the
    casts down that are identities there are left out."""

    def __init__(self, typed: Typed, target, lowered: Lowered, under: Typed):
        self.under = under
        super().__init__(typed, target, lowered)

    def conversion_of(self, operand, want):
        found = super().conversion_of(operand, want)
        if (
            found is None
            or not isinstance(operand, Node)
            or operand.kind is Kind.PARAM
            or want != "bf16"
        ):
            return found
        return None if self.lowered.value_dtype(self.under, operand) == want else found


class Sharing:
    """`run(specializations)` -> Typed -> its Group."""

    def __init__(self, lowered: Lowered, target, layouts: dict):
        assert target.held, "a cuda method computes through its tensors' dtypes"
        self.lowered = lowered
        self.target = target
        # Typed -> its Layout on `target`, for the defuns with several specializations
        self.layouts = layouts
        self.stand_ins: dict = {}  # Typed -> the stand-in name of its group's method
        self.group: dict = {}
        self.relied: set = set()  # groups whose method a comparison counted on
        self.served: dict = {}  # (rep, typed) -> bool
        # (layout, its callees' stand-ins...) -> its printed plan (see `plan_of`)
        self.printed: dict = {}
        self.texts: dict = {}  # Graph -> its text without notes, for every printing

    def run(self, by_defun: dict) -> dict:
        groups: dict = {}
        for typed in self.lowered.specializations:
            key = (typed.model, typed.graph.name)
            if len(by_defun[key]) == 1:
                self._start(typed, None, [])
                continue
            plan = self.plan_of(typed)
            found = groups.setdefault(key, [])
            home = next((g for g in found if self._joins(g, typed, plan)), None)
            if home is None:
                found.append(self._start(typed, plan, found))
            else:
                home.members.append(typed)
                self._assign(typed, home)
        return self.group

    def plan_of(self, typed: Typed) -> str:
        """A specialization's plan, its calls by the stand-ins so far. Grouping, the
        casts at entry and the comparisons of views all ask for it, so each is printed
        once per layout and stand-ins of its callees: a group taken into a later one
        gives its members the later one's stand-in, and their callers' plans a new key.
        """
        layout = self.layouts[typed]
        key = (layout, *(self.stand_ins[c] for c in typed.callee.values()))
        if key not in self.printed:
            self.printed[key] = self._printed(layout)
        return self.printed[key]

    def _printed(self, layout: Layout) -> str:
        graph = layout.graph
        if graph not in self.texts:
            self.texts[graph] = printer.Text(graph)
        return printed(layout, self.stand_ins, text=self.texts[graph])

    def _joins(self, group: Group, typed: Typed, plan: str) -> bool:
        return plan == group.plan or self.serves(group.rep, typed)

    def _start(self, typed: Typed, plan, found: list) -> Group:
        group = Group(f"m{len(self.group)}", typed, plan, [typed])
        self._assign(typed, group)
        for earlier in list(found):
            if earlier not in self.relied and all(
                self.serves(typed, t) for t in earlier.members
            ):
                found.remove(earlier)
                group.members += earlier.members
                for member in earlier.members:
                    self._assign(member, group)
        return group

    def _assign(self, typed: Typed, group: Group) -> None:
        self.group[typed] = group
        self.stand_ins[typed] = group.stand_in

    def entry(self, group: Group) -> list:
        """The f32 arguments of a method that serves bf16 ones which it reads only cast
        down, once at least outside a branch (so never None): cast once at entry instead,
        the same code spelled as the bf16 callers read it."""
        rep = group.rep
        if group.plan is None or all(
            self.plan_of(t) == group.plan for t in group.members
        ):
            return []
        layout = self.layouts[rep]
        found = []
        for index, node in enumerate(rep.graph.inputs):
            reads = layout.readers[node]
            if reads and all(
                isinstance(r, Node)
                and layout.conversions.conversion(r, i) == ("f32", "bf16")
                for r, i in reads
            ):
                if any(layout.scope[r] is None for r, _ in reads) and cast_once(
                    layout.conversions, reads
                ):
                    found.append(index)
        return found

    def serves(self, rep: Typed, typed: Typed) -> bool:
        """Whether `rep`'s method, called with `typed`'s arguments, computes `typed`."""
        if rep is typed:
            return True
        key = (rep, typed)
        if key not in self.served:
            self.served[key] = rep.graph is typed.graph and self._same_plan(rep, typed)
        return self.served[key]

    def _same_plan(self, rep: Typed, typed: Typed) -> bool:
        callee = {}
        for node, called in rep.callee.items():
            theirs = typed.callee[node]
            group = self.group[called]
            if group is not self.group[theirs] and self.serves(group.rep, theirs):
                self.relied.add(group)
                called = theirs
            callee[node] = called
        view = replace(rep, callee=callee)
        conversions = View(view, self.target, self.lowered, typed)
        structure = self.layouts[rep].structure
        layout = Layout(
            view,
            self.target,
            self.lowered,
            conversions=conversions,
            structure=structure,
        )
        return self._printed(layout) == self.plan_of(typed)
