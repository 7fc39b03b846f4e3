"""The library functions at module level: one `def` per group of specializations that one
body serves (sx2torch/emit/sharing.py), written before the classes, called by name.

A function is named after its op (`rms_norm`); where the program needs two bodies of it (a
value that stays f32 with f32 input and bf16 with bf16 input), each is named with its
dtypes (`rms_norm_f32`, `rms_norm_bf16`), a comment above it saying what it is for. A name
a caller's local already has gets a trailing `_`, so no local shadows a function.
"""

from __future__ import annotations

from typing import Callable

import libcst as cst

from sx2torch.emit.names import Namespace
from sx2torch.syntax.names import mangle
from sx2torch.emit.naming import Locals, Naming, specialization_suffix
from sx2torch.ir import LIBRARY
from sx2torch.policy import Lowered


def name(lowered: Lowered, naming: Naming) -> None:
    """Name the library specializations the methods call, in `naming.methods`; those named
    with their dtypes go to `naming.specialized`."""
    reps = _called(lowered, naming)
    taken = set()
    for locals_ in naming.locals.values():
        taken |= _local_names(locals_)
    names = Namespace(taken)
    by_function: dict = {}
    for rep in reps:
        by_function.setdefault(rep.graph.name, []).append(rep)
    chosen = {}
    for function, group in by_function.items():
        for rep in group:
            base = mangle(function)
            if len(group) > 1:
                base = f"{base}_{specialization_suffix(rep)}"
                naming.specialized.add(rep)
            chosen[rep] = names.fresh(base)
    for typed in lowered.specializations:
        rep = naming.code.get(typed, typed)
        if rep in chosen:
            naming.methods[typed] = chosen[rep]


def definitions(naming: Naming, method: Callable) -> list:
    """The functions' `def`s, in the order they were named: `method(typed, name)` writes one
    as a method, whose `self` is then left out."""
    written, found = set(), []
    for typed, function in naming.methods.items():
        if typed.model != LIBRARY or function in written:
            continue
        written.add(function)
        definition = method(naming.code.get(typed, typed), function)
        params = definition.params.with_changes(params=definition.params.params[1:])
        leading = [cst.EmptyLine(), cst.EmptyLine(), *definition.leading_lines]
        found.append(definition.with_changes(params=params, leading_lines=leading))
    return found


def _called(lowered: Lowered, naming: Naming) -> list:
    """The library specializations whose code the methods' code calls, in the policy's order."""
    reached, pending = set(), [naming.code.get(t, t) for t in naming.methods]
    while pending:
        for callee in pending.pop().callee.values():
            rep = naming.code.get(callee, callee)
            if rep.model == LIBRARY and rep not in reached:
                reached.add(rep)
                pending.append(rep)
    return [t for t in lowered.specializations if t in reached]


def _local_names(locals_: Locals) -> set:
    found = {*locals_.args, *locals_.keys.values(), *locals_.values.values()}
    found |= set(locals_.hoists.values())
    found |= {n for pair in locals_.loops.values() for n in pair if n}
    for names in (locals_.records, locals_.aliases, locals_.unpacked):
        found |= {n for group in names.values() for n in group}
    return found | set(locals_.targets.values())
