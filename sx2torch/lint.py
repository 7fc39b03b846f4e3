"""Warnings: what compiles but is likely a mistake, each with its place and its fix.

Where bf16 is likely to hurt (a scalar result, a loss, in bf16; a sum or exp in bf16 outside
an island), an island that reaches into a call (the callee is compiled again, all in f32),
`:out :f32` on f32 operands (it changes nothing), and consts and &key arguments nothing reads.
The compiler prints them (`--warn`); `explain` lists them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from sx2torch.errors import Span
from sx2torch.ir import CALLS, ISLAND, Kind, Node, outputs, walk
from sx2torch.policy.rules import calling
from sx2torch.syntax.echo import echo
from sx2torch.syntax.read import Datum, List, Symbol, Vector
from sx2torch.syntax.scalars import head_is

ISLAND_FIX = "wrap it in (with-numerics (:sensitivity :high) ...)"


@dataclass(frozen=True, order=True)
class Finding:
    span: Span
    message: str


def find(program, lowered, data: list) -> list:
    """Every warning, in source order, each once."""
    found = set(_unused(data))
    reached = reached_specializations(program, lowered)
    for typed in reached:
        found.update(_precision(typed, lowered.precision))
    found.update(_useless_out_f32(reached))
    return sorted(found)


def reached_specializations(program, lowered) -> list:
    """The specializations a run computes: the top model's defuns that no defun calls (its
    entry points), and what they call. The f32 method of a defun that is only called with
    bf16 arguments is not one: its f32 lines are not what a run computes."""
    called = {
        (callee.model, callee.graph.name)
        for typed in lowered.specializations
        for callee in typed.callee.values()
    }
    todo = [
        typed
        for key, typed in lowered.natural.items()
        if typed is not None and key[0] == program.top.name and key not in called
    ]
    reached = calling(todo)
    return [t for t in lowered.specializations if t in reached]


def _precision(typed, precision: str):
    returned = outputs(typed.graph)
    for node in walk(typed.graph.nodes):
        if node.kind in CALLS and precision == "bf16" and _in_user_island(node):
            yield Finding(
                node.span,
                f"the island around {echo(node.form)} reaches into the call: "
                f"{node.attrs.get('target')} is compiled again, all in f32, "
                "for it; bind the call's result with let outside the island",
            )
        if node.kind is Kind.FOR and head_is(node.form, "chain"):
            yield from _chain_rounds(typed, node)
        if node.kind is not Kind.OP or typed.decided[node].compute != "bf16":
            continue
        form = echo(node.form)
        if (
            node in returned
            and node.shape.dims == ()  # the ranks pass's, as the file calls it
            and typed.decided[node].dtype == "bf16"
        ):
            yield Finding(
                node.span,
                f"{typed.graph.name} returns a scalar computed in bf16, {form}: a loss "
                f"keeps only 8 bits of precision; {_island_fix(node)}",
            )
        risk = node.op.bf16_risk
        if risk:
            yield Finding(node.span, f"{form} {risk}; {_island_fix(node)}")


def _chain_rounds(typed, node: Node):
    """A chain whose layers give f32 (an island's value) but whose start is bf16 carries
    bf16 by the join rule, so every layer's f32 value is rounded before the next reads it:
    a residual stream meant to stay f32 loses its precision at each layer, silently."""
    (body,) = node.regions
    carried = typed.decided[node].dtype
    for k, (start, out, dtype) in enumerate(zip(node.inputs, body.outputs, carried)):
        if (
            dtype == "bf16"
            and typed.decided[start].dtype == "bf16"
            and typed.decided[out].dtype == "f32"
        ):
            written = (
                node.form.items[2] if k == 0 else start.form
            )  # (chain LAYERS X ...)
            yield Finding(
                node.span,
                f"the loop carries bf16 because {echo(written)} is bf16 here: cast it "
                "to f32 before the chain if the residual stream should stay f32",
            )


def _in_user_island(node: Node) -> bool:
    return any(f.mode == ISLAND and not f.library for f in node.frames)


def _island_fix(node: Node) -> str:
    """Wrapping a form that calls a defun would take the call into the island too; a call
    bound by let before it is not written inside it, and wrapping leaves it out already.
    """
    inside = _subforms(node.form)
    calls = [n for n in _operands(node) if n.kind in CALLS and id(n.form) in inside]
    if not calls:
        return ISLAND_FIX
    return (
        f"bind {echo(calls[0].form)} with let first, then wrap the rest in "
        "(with-numerics (:sensitivity :high) ...)"
    )


def _subforms(form: Datum) -> set:
    """The ids of the forms written inside `form`, itself included."""
    found, todo = set(), [form]
    while todo:
        datum = todo.pop()
        found.add(id(datum))
        if isinstance(datum, (List, Vector)):
            todo.extend(datum.items)
    return found


def _operands(node: Node) -> list:
    seen, todo, found = set(), [node], []
    while todo:
        current = todo.pop()
        for operand in current.inputs:
            if isinstance(operand, Node) and operand not in seen:
                seen.add(operand)
                found.append(operand)
                if operand.kind not in CALLS:
                    todo.append(operand)
    return found


def _useless_out_f32(reached: list):
    """`:out :f32` where no specialization computes the matmul in bf16."""
    computes: dict = {}
    for typed in reached:
        for node in walk(typed.graph.nodes):
            if node.kind is Kind.OP and node.attrs.get("out") == "f32":
                computes.setdefault(node.span, []).append(typed.decided[node].compute)
    for span, dtypes in computes.items():
        if "bf16" not in dtypes:
            yield Finding(
                span,
                ":out :f32 does nothing here: the matmul's operands are f32, so it is a "
                "plain f32 GEMM; remove it, or make an operand bf16",
            )


def _unused(data: list):
    """Consts, model keys and defun &key arguments whose name no other symbol has."""
    top = [d for d in data if not head_is(d, "defmodel")]
    for scope in [top, *([d] for d in data if head_is(d, "defmodel"))]:
        symbols = Counter(_symbols(scope))
        for name in _defined(scope):
            if symbols[name.name] == 1:  # its definition alone
                yield Finding(
                    name.span, f"'{name.name}' is defined and never read; remove it"
                )


def _defined(scope: list):
    for datum in scope:
        if (head_is(datum, "defconst") or head_is(datum, "defflag")) and isinstance(
            _item(datum, 1), Symbol
        ):
            yield datum.items[1]
        if head_is(datum, "defmodel") and isinstance(_item(datum, 2), List):
            yield from _keys(datum.items[2])
            yield from _defined(list(datum.items[3:]))
        if head_is(datum, "defun") and isinstance(_item(datum, 2), List):
            yield from _keys(datum.items[2])


def _keys(arguments: List):
    """The names after `&key`: `(k default)` pairs or bare symbols."""
    names = [
        i.items[0] if isinstance(i, List) and i.items else i for i in arguments.items
    ]
    at = next(
        (n for n, s in enumerate(names) if isinstance(s, Symbol) and s.name == "&key"),
        None,
    )
    if at is not None:
        yield from (s for s in names[at + 1 :] if isinstance(s, Symbol))


def _symbols(scope: list):
    """The names of every symbol in the data but those a binding defines and the reads of
    them in its scope (a `let` local, a `for`'s names, a defun's arguments): they shadow a
    const of that name rather than read it. A `&key` name counts, as it is defined."""
    for datum in scope:
        yield from _names(datum, frozenset())


def _names(datum, bound: frozenset):
    if isinstance(datum, Symbol):
        if datum.name not in bound:
            yield datum.name
        return
    if not isinstance(datum, (List, Vector)):
        return
    items = datum.items
    if head_is(datum, "let") and isinstance(_item(datum, 1), List):
        for pair in items[1].items:
            if isinstance(pair, List) and pair.items:
                for value in pair.items[1:]:
                    yield from _names(value, bound)
                bound = bound | _targets(pair.items[0])
        items = items[2:]
    elif head_is(datum, "for") and isinstance(_item(datum, 2), List):
        loop = items[1].items if isinstance(items[1], List) else [items[1]]
        yield from _names(loop[-1] if loop else None, bound)
        pairs = [p for p in items[2].items if isinstance(p, List) and p.items]
        for pair in pairs:
            yield from (n for v in pair.items[1:] for n in _names(v, bound))
        names = [*loop[:-1], *(p.items[0] for p in pairs)]
        bound = bound | {n for t in names for n in _targets(t)}
        items = items[3:]
    elif head_is(datum, "defun") and isinstance(_item(datum, 2), List):
        arguments = items[2].items
        positional = [a for a in arguments if isinstance(a, Symbol)]
        bound = bound | {a.name for a in positional if a.name != "&key"}
        items = [items[1], *(a for a in arguments if isinstance(a, List)), *items[3:]]
    for item in items:
        yield from _names(item, bound)


def _targets(target) -> frozenset:
    """The names a binding's target defines: `x`, or `[a b]`."""
    if isinstance(target, Symbol):
        return frozenset({target.name})
    if isinstance(target, Vector):
        return frozenset(t.name for t in target.items if isinstance(t, Symbol))
    return frozenset()


def _item(datum: Datum, index: int):
    return datum.items[index] if len(datum.items) > index else None
