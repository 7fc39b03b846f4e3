"""The module-level functions: the library's, and the top-level defuns the models share
(sx2torch/plan/functions.py); one `def` per group of specializations that one body serves
(sx2torch/plan/sharing.py), written before the classes, called by name.

A function is named after its op or defun (`rms_norm`, `gelu_new`); where the program needs two bodies of it (a
value that stays f32 with f32 input and bf16 with bf16 input), each is named with its
dtypes (`rms_norm_f32`, `rms_norm_bf16`), a comment above it saying what it is for. A name
a caller's local already has gets a trailing `_`, so no local shadows a function.
"""

from __future__ import annotations

from typing import Callable

import libcst as cst

from sx2torch.emit.names import Namespace
from sx2torch.emit.naming import Locals, Naming, specialization_suffix
from sx2torch.plan import Plans
from sx2torch.syntax.names import mangle


def name(plans: Plans, naming: Naming) -> None:
    """Name the functions the methods call (the plan's `library` and `functions`), in
    `naming.methods`; a function the program needs two bodies of is named with their
    dtypes (the plan's `specialized`)."""
    taken = set()
    for locals_ in naming.locals.values():
        taken |= _local_names(locals_)
    names = Namespace(taken | plans.imports)
    chosen = {}
    for rep in (*plans.library, *plans.functions):
        base = mangle(rep.graph.name)
        if rep in plans.specialized:
            base = f"{base}_{specialization_suffix(rep)}"
        chosen[rep] = names.fresh(base)
    for typed, plan in plans.plans.items():
        if plan.code in chosen:
            naming.methods[typed] = chosen[plan.code]


def definitions(plans: Plans, naming: Naming, method: Callable) -> list:
    """The functions' `def`s, in the order they were named: `method(typed, name)` writes one
    as a method, whose `self` is then left out."""
    written, found = set(), []
    for typed, function in naming.methods.items():
        if not plans.function(typed) or function in written:
            continue
        written.add(function)
        definition = method(plans.plans[typed].code, function)
        params = definition.params.with_changes(params=definition.params.params[1:])
        leading = [cst.EmptyLine(), cst.EmptyLine(), *definition.leading_lines]
        found.append(definition.with_changes(params=params, leading_lines=leading))
    return found


def _local_names(locals_: Locals) -> set:
    found = {*locals_.args, *locals_.keys.values(), *locals_.values.values()}
    found |= set(locals_.hoists.values())
    found |= {n for pair in locals_.loops.values() for n in pair if n}
    for names in (locals_.records, locals_.aliases, locals_.unpacked):
        found |= {n for group in names.values() for n in group}
    return found | set(locals_.targets.values())
