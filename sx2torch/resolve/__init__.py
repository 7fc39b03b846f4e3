"""The resolve pass: top-level data -> a Program of models, consts, params, defuns and runs.

Checks what can be checked without tracing bodies: the shape of every
definition, duplicates, defrun keys, recursion, and that `forward` exists. The
definitions are read by resolve/models.py (defmodel and the forms inside a model),
resolve/initializers.py (a defparam's initializer) and resolve/runs.py (defrun), their
parts by resolve/values.py; what needs every model read is checked by resolve/checks.py.
"""

from __future__ import annotations

from dataclasses import replace

from sx2torch.errors import SourceError, Span
from sx2torch.resolve.checks import (
    check_built,
    check_containment,
    check_params,
    check_ties,
)
import sx2torch.resolve.layers as library
from sx2torch.resolve.models import defmodel, model_form
from sx2torch.resolve.runs import check_run, defrun
from sx2torch.resolve.values import form_head
from sx2torch.syntax.forms import match
from sx2torch.syntax.program import Model, Program, Run
from sx2torch.syntax.read import List, Symbol, Vector


def run(data: list, top_name: str) -> Program:
    top = Model(top_name, Span(1, 1), is_top=True)
    models: dict[str, Model] = {}
    runs: list[Run] = []
    for datum in data:
        head = form_head(datum, "a top-level form")
        if head == "defmodel":
            model = defmodel(datum)
            if model.name in models:
                raise SourceError(
                    datum.items[1].span, f"model '{model.name}' is already defined"
                )
            if model.name == top_name:
                raise SourceError(
                    datum.items[1].span,
                    f"a defmodel cannot be named '{top_name}': the file's top model has that name",
                )
            models[model.name] = model
        elif head == "defrun":
            runs.append(defrun(datum, runs))
        elif head == "require":
            _require(datum)
        else:
            model_form(top, datum, head)
    # the library's layers first: their classes come before those that use them
    layers = {m.name: m for m in map(defmodel, library.wanted(models, top))}
    program = Program(top, {**layers, **models}, runs)
    for model in models.values():
        _share_defuns(top, model)
    for model in program.all_models():
        check_params(program, model)
    for model in program.all_models():
        check_ties(program, model)
    for each in runs:
        check_run(top, each)
    check_containment(program)
    check_built(program)
    if "forward" not in top.defuns:
        raise SourceError(
            Span(1, 1),
            "the file defines no 'forward' defun: expected (defun forward (x ...) ...)",
        )
    return program


def _share_defuns(top: Model, model: Model) -> None:
    """The top-level defuns a sub-model calls (and those they call) become its own, unless
    it defines the name itself."""
    pending = list(model.defuns.values())
    while pending:
        for name in _heads(pending.pop().body):
            if name in top.defuns and name not in model.names():
                model.defuns[name] = replace(top.defuns[name], shared=True)
                pending.append(model.defuns[name])


def _heads(data) -> set:
    """The names a body calls: the heads of its lists, at any depth."""
    found: set = set()
    pending = list(data)
    while pending:
        datum = pending.pop()
        if isinstance(datum, (List, Vector)):
            items = datum.items
            if isinstance(datum, List) and items and isinstance(items[0], Symbol):
                found.add(items[0].name)
            pending.extend(items)
    return found


def _require(datum: List) -> None:
    (library,) = match(datum).parts
    if library.name not in ("sexpgpu/nn", "sexpgpu/optim"):
        raise SourceError(
            library.span,
            f"unknown library '{library.name}' (known: sexpgpu/nn, sexpgpu/optim)",
        )
