"""`--dump-after PASS`: each intermediate form, printed for people debugging the compiler."""

from __future__ import annotations

from functools import partial

from sx2torch.syntax.echo import show
from sx2torch.emit.naming import Naming
from sx2torch.ir import Frame, Graph, Kind, Node, Scalar, outputs, walk
from sx2torch.policy import Lowered, Typed
from sx2torch.syntax import scalars
from sx2torch.syntax.program import Init
from sx2torch.syntax.scalars import ScalarOp


def data(items: list) -> str:
    return "".join(f"{d.span.line}:{d.span.col} {show(d)}\n" for d in items)


def program(prog) -> str:
    lines = []
    for model in prog.all_models():
        lines.append(f"model {model.name}{' (top)' if model.is_top else ''}")
        lines += [
            f"  const {c.name} = {scalar(c.value)}" for c in model.consts.values()
        ]
        for p in model.params.values():
            flags = [
                f
                for f, on in (
                    ("frozen", not p.trainable),
                    ("numerics high", p.numerics_high),
                    (f"dtype {p.dtype}", p.dtype),
                )
                if on
            ]
            init = p.init.model if p.is_module else p.init.kind
            args = ", ".join(f"{k}={_value(v)}" for k, v in p.init.args.items())
            count = f"{scalar(p.init.count)} x " if p.init.count else ""
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
    ids: dict = {}
    for node in [*g.inputs, *_values(g.nodes)]:
        ids[node] = f"%{len(ids)}"
    head = f"{g.model}.{g.name}({', '.join(f'{ids[n]} {n.name}' for n in g.inputs)})"
    if typed is not None:
        ambient = f" called {typed.ambient}" if typed.ambient else ""
        head += f" : ({', '.join(typed.signature)}){ambient}"
    if typed is not None:
        note = partial(_dtypes, typed)
    elif shapes:
        several = {n.inputs[0] for n in walk(g.nodes) if n.kind is Kind.ITEM}
        note = partial(_shape, several)
    else:
        note = None
    lines = [head]
    if shapes:
        lines += [f"  {ids[n]}{note(n)}" for n in g.inputs]
    _block(g.nodes, ids, note, "  ", lines, shapes)
    lines.append(f"  return {', '.join(_operand(o, ids) for o in outputs(g))}")
    return "\n".join(lines) + "\n"


def _values(nodes: list):
    """Every node, and the carried values of the regions after their node."""
    for node in nodes:
        yield node
        for region in node.regions:
            yield from region.inputs
            yield from _values(region.nodes)


def _operand(operand, ids: dict) -> str:
    if isinstance(operand, Node):
        return ids[operand]
    return scalar(operand) if operand is not None else "None"


def _block(nodes: list, ids: dict, note, indent: str, lines: list, each_input=False):
    """`note(node)`: what the line of a node ends with (its dtypes, or its shape); with
    `each_input`, each region's inputs get a line of their own with theirs."""
    for node in nodes:
        inputs = ", ".join(_operand(i, ids) for i in node.inputs)
        attrs = "".join(
            f" {k}={_value(v)}" for k, v in node.attrs.items() if v is not None
        )
        frames = "".join(
            f" [{f.mode}{' library' if f.library else ''}]" for f in node.frames
        )
        name = f" {node.name}" if node.name else ""
        noted = note(node) if note else ""
        lines.append(
            f"{indent}{ids[node]}{name} = {node.what}({inputs}){attrs}{frames}{noted}  @{node.span.line}:{node.span.col}"
        )
        for region in node.regions:
            carried = ", ".join(
                f"{ids[i]} {i.name or ''}".strip() for i in region.inputs
            )
            lines.append(f"{indent}  region({carried}):")
            if each_input:
                lines += [f"{indent}    {ids[i]}{note(i)}" for i in region.inputs]
            _block(region.nodes, ids, note, indent + "    ", lines, each_input)
            outputs = ", ".join(_operand(o, ids) for o in region.outputs)
            lines.append(f"{indent}    yield {outputs}")


def _dtypes(typed: Typed, node: Node) -> str:
    return f" : {typed.decision(node).compute or '-'} -> {typed.decision(node).dtype}"


def _shape(several: set, node: Node) -> str:
    """` : [4 ?]`: a size per axis, `?` where it is not known; `[...]` where the rank is
    not known; a loop's, or a call's that gives several values, `([4] [...])`."""
    dims = node.shape.dims
    if dims is not None and (node.kind is Kind.FOR or node in several):
        return " : (" + " ".join(_dims(d) for d in dims) + ")"
    return " : " + _dims(dims)


def _dims(dims) -> str:
    if dims is None:
        return "[...]"
    return "[" + " ".join("?" if d is None else str(d) for d in dims) + "]"


def lowered(low: Lowered) -> str:
    parts = [graph(t.graph, t) for t in low.specializations]
    storage = "".join(f"  {m}.{p}: {d}\n" for (m, p), d in low.storage.items())
    return "".join(parts) + f"storage ({low.precision})\n" + storage


def scalar(s: Scalar) -> str:
    return scalars.text(s, _leaf)


def _leaf(s: Scalar) -> str:
    if s.op is ScalarOp.LAYER:
        return f"layer {s.args[0]}"
    if s.op is ScalarOp.INDEX:
        return f"index({s.args[0].attrs['index']})"
    return f"{s.args[0]}={s.value!r}"


def _value(value) -> str:
    if isinstance(value, Scalar):
        return scalar(value)
    if isinstance(value, Frame):  # a gradient's marks
        return value.mode
    if isinstance(value, Init):  # a part of a concat
        return f"{value.kind}({', '.join(f'{k}={_value(v)}' for k, v in value.args.items())})"
    if (
        isinstance(value, tuple)
        and len(value) == 2
        and not isinstance(value[0], Scalar)
    ):
        return scalar(value[1])  # a sub-model's keyword: (span, Scalar)
    if isinstance(value, tuple):
        return "[" + " ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_value(v)}" for k, v in value.items()) + "}"
    return str(value)


def names(naming: Naming) -> str:
    """Each class and its attributes, then each method and the name of every value in it,
    numbered as `--dump-after trace` numbers them."""
    lines = []
    for model, class_name in naming.classes.items():
        attrs = ", ".join(f"{k} -> {v}" for k, v in naming.attrs[model].items())
        lines.append(f"class {class_name} ({model}): {attrs}")
    for typed, method in naming.methods.items():
        local = naming.locals[typed]
        ids = {
            node: f"%{i}"
            for i, node in enumerate([*typed.graph.inputs, *_values(typed.graph.nodes)])
        }
        signature = ", ".join(typed.signature)
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
