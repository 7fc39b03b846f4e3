"""The top-level defuns the models share, written once as module-level functions.

Resolve copies a top-level defun into each sub-model that calls it (`Defun.shared`), where
it sees only its arguments; each copy is traced and typed as a defun of its model. Where no
copy reads anything of its model (no op reading the module's state, dropout's
`self.training`; calls only of library functions and of such defuns, never of a model's own
defun of the name called), the defun is a function of its arguments: its specializations in
every model whose code is the same (the same signature and ambient, the same printed plan)
are served by one body, the first, which emission writes once at module level and every
class calls by name, as it does the library's functions (sx2torch/emit/functions.py). Casts
at entry do not set two bodies apart: a method casts down at entry only arguments every
caller in the module passes in bf16 already (plan/methods.py), so for those callers the cast
changes nothing, and a function is no model's public method. The top model keeps no method of such a defun: where it calls
the defun it calls the function, and where it does not, the defun is no entry point of it.
A run's loss stays a method: the training script calls it on the model.
"""

from __future__ import annotations

from dataclasses import replace

from sx2torch.ir import LIBRARY, Kind, walk
from sx2torch.plan.printed import printed
from sx2torch.policy import Lowered, Typed
from sx2torch.syntax.program import Program


def shared(program: Program, lowered: Lowered) -> frozenset:
    """The names of the top-level defuns written as module-level functions."""
    losses = {run.loss.name for run in program.runs if run.loss is not None}
    found = {
        name
        for model in program.models.values()
        for name, defun in model.defuns.items()
        if defun.shared
    } - losses
    copies: dict = {}
    for typed in lowered.specializations:
        if typed.model != LIBRARY and typed.graph.name in found:
            copies.setdefault(typed.graph.name, []).append(typed)
    while True:  # a defun calling one that is no function is none either
        kept = {
            name
            for name in found
            if all(_alone(program, t, found) for t in copies.get(name, []))
        }
        if kept == found:
            return frozenset(found)
        found = kept


def _alone(program: Program, typed: Typed, names: set) -> bool:
    """Whether a copy computes from its arguments alone, its callees functions too."""
    if any(
        node.kind is Kind.OP and node.op.module_state
        for node in walk(typed.graph.nodes)
    ):
        return False
    return all(
        callee.model == LIBRARY
        or callee.graph.name in names
        and (
            callee.model == program.top.name
            or program.model(callee.model).defuns[callee.graph.name].shared
        )
        for callee in typed.callee.values()
    )


def pooled(plans: dict, names: frozenset, methods: list) -> tuple:
    """`plans` (Typed -> Plan) with each function specialization served by the first code
    of any model that is the same, and the codes serving the emitted `methods`, in the
    policy's order."""
    order = {typed: index for index, typed in enumerate(plans)}
    first: dict = {}  # what makes two codes the same -> the first of them
    served: dict = {}  # a code -> the code serving it

    def code(typed: Typed) -> Typed:
        own = plans[typed].code
        if own.model == LIBRARY or own.graph.name not in names:
            return own
        if own not in served:
            plan = plans[own]
            stand_ins = {c: f"m{order[code(c)]}" for c in own.callee.values()}
            text = printed(plan.layout, stand_ins, plan.spelled)
            body = text.split("\n", 1)[1]  # the head names the model
            key = (own.graph.name, own.signature, own.ambient, body)
            served[own] = first.setdefault(key, own)
        return served[own]

    pooled_plans = {
        typed: replace(plan, code=code(typed)) for typed, plan in plans.items()
    }
    serving = {pooled_plans[t].code for t in methods}
    return pooled_plans, tuple(
        sorted(serving.intersection(first.values()), key=order.get)
    )


def several(functions: tuple) -> frozenset:
    """The functions of a defun the program needs two bodies of: named with their dtypes,
    as the library's are."""
    count: dict = {}
    for typed in functions:
        count[typed.graph.name] = count.get(typed.graph.name, 0) + 1
    return frozenset(t for t in functions if count[t.graph.name] > 1)
