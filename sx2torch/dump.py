"""`--dump-after PASS`: each intermediate form, printed for people debugging the compiler."""

from __future__ import annotations

import sx2torch.printer as printer
from sx2torch.syntax.echo import show
from sx2torch.emit.naming import Naming
from sx2torch.plan import Plans
from sx2torch.plan.printed import printed
from sx2torch.ir import Graph, Kind, Node, walk
from sx2torch.ops.rank import Tail
from sx2torch.policy import Lowered, Typed
from sx2torch.policy.rules import is_param


def data(items: list) -> str:
    return "".join(f"{d.span.line}:{d.span.col} {show(d)}\n" for d in items)


def program(prog) -> str:
    lines = []
    for model in prog.all_models():
        lines.append(f"model {model.name}{' (top)' if model.is_top else ''}")
        lines += [
            f"  const {c.name} = {printer.scalar(c.value)}"
            for c in model.consts.values()
        ]
        for p in model.params.values():
            flags = [
                f
                for f, on in (
                    ("frozen", not p.trainable),
                    ("not persistent", not p.persistent),
                    ("numerics high", p.numerics_high),
                    (f"dtype {p.dtype}", p.dtype),
                )
                if on
            ]
            init = p.init.kind
            if p.init.kind in ("model", "stack"):
                init = p.init.model
            elif p.is_module:  # a list's or a choice's models
                init += "(" + " ".join(i.model for i in p.init.instances) + ")"
            args = ", ".join(f"{k}={printer.value(v)}" for k, v in p.init.args.items())
            count = f"{printer.scalar(p.init.count)} x " if p.init.count else ""
            lines.append(
                f"  param {p.name} = {count}{init}({args}){' [' + ', '.join(flags) + ']' if flags else ''}"
            )
        for d in model.defuns.values():
            keys = "".join(f" :{k.name} {show(v)}" for k, v in d.keys)
            lines.append(
                f"  defun {d.name} ({' '.join(a.name for a in d.args)}{' &key' + keys if keys else ''})"
            )
    lines += [f"run {r.name} :precision :{r.precision}" for r in prog.runs]
    return "\n".join(lines) + "\n"


def graphs(traced: dict, shapes: bool = False) -> str:
    """Each graph; with `shapes`, each value's shape as the ranks pass set it."""
    return "".join(graph(g, shapes=shapes) for g in traced.values())


def graph(g: Graph, typed: Typed = None, shapes: bool = False) -> str:
    if typed is not None:
        ambient = f" called {typed.ambient}" if typed.ambient else ""
        return printer.graph(g, _Dtypes(typed), f" : ({_signature(typed)}){ambient}")
    if shapes:
        return printer.graph(g, _Shapes(g))
    return printer.graph(g)


class _Dtypes(printer.Notes):
    """` : bf16 -> bf16`: what a node computes in (`-`: nothing), and the dtype it gives."""

    def __init__(self, typed: Typed):
        self.typed = typed

    def node(self, node: Node) -> str:
        decision = self.typed.decision(node)
        return f" : {decision.compute or '-'} -> {decision.dtype}"


class _Shapes(printer.Notes):
    """` : [4 ?]`: a size per axis, `?` where it is not known; `[...]` where the rank is
    not known; a loop's, or a call's that gives several values, `([4] [...])`."""

    inputs = True

    def __init__(self, g: Graph):
        self.several = {n.inputs[0] for n in walk(g.nodes) if n.kind is Kind.ITEM}

    def node(self, node: Node) -> str:
        dims = node.shape.dims
        if dims is not None and (node.kind is Kind.FOR or node in self.several):
            return " : (" + " ".join(_dims(d) for d in dims) + ")"
        return " : " + _dims(dims)


def _dims(dims) -> str:
    """`[...]` where the rank is not known, `[... 4]` where only the last sizes are."""
    if dims is None:
        return "[...]"
    known = dims.sizes if isinstance(dims, Tail) else dims
    sizes = ["?" if d is None else str(d) for d in known]
    return "[" + " ".join(["..."] * isinstance(dims, Tail) + sizes) + "]"


def _signature(typed: Typed) -> str:
    """Its arguments' dtypes; a parameter passed as an argument is `param NAME`."""
    return ", ".join(f"param {s.name}" if is_param(s) else s for s in typed.signature)


def lowered(low: Lowered) -> str:
    parts = [graph(t.graph, t) for t in low.specializations]
    storage = "".join(f"  {m}.{p}: {d}\n" for (m, p), d in low.storage.items())
    return "".join(parts) + f"storage ({low.precision})\n" + storage


def plans(planned: Plans) -> str:
    """Each specialization's plan on the target, numbered `#N` in the policy's order: what
    its method is (its own, served by another's, left out), the arguments it casts at
    entry, then its graph noted with its statements, blocks and casts as they are written,
    the methods it calls by their numbers; then the consts the methods read."""
    label = {typed: f"#{i}" for i, typed in enumerate(planned.plans)}
    emitted = {t for specs in planned.emitted.values() for t in specs}
    emitted |= set(planned.library)
    lines = []
    for typed, plan in planned.plans.items():
        what = [
            "public" if typed in planned.public.values() else "",
            "specialized" if typed in planned.specialized else "",
            f"served by {label[plan.code]}" if plan.code is not typed else "",
            "" if typed in emitted else "not emitted",
            f"casts {', '.join(map(str, plan.entry))} at entry" if plan.entry else "",
        ]
        lines.append(
            f"{label[typed]} ({_signature(typed)}) {' '.join(filter(None, what))}"
        )
        lines.append(printed(plan.layout, label, plan.spelled))
    for model, consts in planned.read_consts.items():
        lines.append(f"{model} reads {', '.join(sorted(consts))}")
    return "\n".join(lines) + "\n"


def names(naming: Naming) -> str:
    """Each class and its attributes, then each method and the name of every value in it,
    numbered as `--dump-after trace` numbers them."""
    lines = []
    for model, class_name in naming.classes.items():
        attrs = ", ".join(f"{k} -> {v}" for k, v in naming.attrs[model].items())
        lines.append(f"class {class_name} ({model}): {attrs}")
    for typed, method in naming.methods.items():
        local = naming.locals[typed]
        ids = printer.numbering(typed.graph)
        signature = _signature(typed)
        # a library function is at module level, in no class
        owner = naming.classes.get(typed.model)
        where = f"{owner}.{method}" if owner else method
        lines.append(f"{where} <- {typed.model}.{typed.graph.name}({signature})")
        lines += [f"  {ids[node]} {name}" for node, name in local.values.items()]
        lines += [f"  :{key} {name}" for key, name in local.keys.items()]
        for loop, (index, layer) in local.loops.items():
            lines.append(f"  {ids[loop]} for {index + ', ' if index else ''}{layer}")
        lines += [
            f"  {name} = {ids[hoist.operand]} as {hoist.conversion[1]}"
            for hoist, name in local.hoists.items()
        ]
    return "\n".join(lines) + "\n"


def plan(tp) -> str:
    """The tensor-parallel plan: each linear layer's style, each weight kept whole and why."""
    lines = [f"reduce {tp.reduce}"]
    for entry in tp.entries:
        style = entry.style or "whole"
        lines.append(
            f"{entry.path}: {style}" + (f"  ({entry.reason})" if entry.reason else "")
        )
    return "\n".join(lines) + "\n"
