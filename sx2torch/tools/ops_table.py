"""The op table of docs/OPS.md, made from the registry: `python -m sx2torch.tools.ops_table > docs/OPS.md`."""

from sx2torch.ops.initializers import sizes
from sx2torch.ops.registry import REGISTRY, Op
from sx2torch.resolve import layers
from sx2torch.resolve.models import defmodel
from sx2torch.syntax import scalars


def signature(op: Op) -> str:
    args = [a.name.upper() for a in op.args]
    least, most = op.bounds
    if most is None:
        args[-1] += " ..."
    elif most > least:
        args[least:] = [f"[{a}]" for a in args[least:]]
    keys = [
        f":{k.name}" + ("" if k.default is None else f" {_shown(k.default)}")
        for k in op.keys
    ]
    return "(" + " ".join([op.name, *args, *(["&key", *keys] if keys else [])]) + ")"


def _shown(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return "[" + " ".join(map(str, value)) + "]"
    return "none" if value is None else str(value)


def marks(op: Op) -> str:
    found = []
    if op.sensitive is True:
        found.append("f32 island")
    elif op.sensitive:
        found.append("f32 island unless its keys say otherwise")
    if op.expand:
        found.append("defined by other ops")
    if op.exact is True:
        found.append("exact in bf16")
    return ", ".join(found)


def markdown() -> str:
    lines = [
        "# Ops",
        "",
        "Made from the registry (`sx2torch/ops/`) by `python -m sx2torch.tools.ops_table`; a test keeps it current.",
        "",
        "The rank column is the output's rank (sx2torch/ops/rank.py); `sx2torch/ranks.py` follows it",
        "through each graph, with the sizes written as literals, to prove shape mismatches;",
        "matmul, the broadcasting ops, the same-shape ops, transpose and swap-axes also follow the",
        "last sizes of a value whose rank is unknown, so `(matmul (matmul x a) b)` is checked.",
        "",
        "| op | rank | marks | derivative | notes |",
        "| --- | --- | --- | --- | --- |",
    ]
    public = [op for _, op in sorted(REGISTRY.items()) if not op.internal]
    internal = [op for _, op in sorted(REGISTRY.items()) if op.internal]
    lines += [_row(op) for op in public]
    lines += [
        "",
        "## Internal ops",
        "",
        "Made by the compiler, in derivative rules and in the definitions of other ops; a source",
        "that calls one gets an unknown-op diagnostic.",
        "",
        "| op | rank | marks | derivative | notes |",
        "| --- | --- | --- | --- | --- |",
    ]
    lines += [_row(op) for op in internal]
    lines += [
        "",
        "## Layers",
        "",
        'The layer library (docs/LANGUAGE.md, "The layer library"), made from its source',
        "(`sx2torch/resolve/layers.py`): each layer is a model, its arguments in torch's order",
        "(those in capitals have no default), its parameters torch's keys; its forward's ops",
        "have their rows above, with their precision and derivative.",
        "",
        "| layer | parameters | forward |",
        "| --- | --- | --- |",
    ]
    lines += [_layer_row(defmodel(form)) for form in layers.forms()]
    usage, params, forward = layers.WEIGHT_NORM_ROW
    lines.append(f"| `{usage}` | {params} | {forward} |")
    return "\n".join(lines) + "\n"


def _row(op: Op) -> str:
    derivative = (
        "rule"
        if op.grad
        else (
            "through its definition"
            if op.expand
            else f"none: {op.no_grad or 'internal'}"
        )
    )
    cell = signature(op).replace("|", "\\|")
    return f"| `{cell}` | {op.rank.doc} | {marks(op)} | {derivative} | {op.doc.replace('|', '/')} |"


def _layer_row(model) -> str:
    consts = list(model.consts.values())

    def leaf(scalar) -> str:  # a const as instances pass it: `bias`, read as has-bias
        return model.consts[scalar.args[0]].argument

    def shown(scalar) -> str:
        return (
            _shown(scalar.value) if scalar.op == "lit" else scalars.text(scalar, leaf)
        )

    keys = [f":{c.argument} {shown(c.value)}" for c in consts if not c.required]
    args = [c.argument.upper() for c in consts if c.required]
    head = " ".join([model.name, *args, *(["&key", *keys] if keys else [])])
    params = "; ".join(
        f"`{p.name}` [{' '.join(shown(z) for z in sizes(p.init))}] {p.init.kind}"
        + ("" if p.when is None else f", if {shown(p.when)}")
        for p in model.params.values()
    )
    ops = sorted(_heads(model.defuns["forward"].body) & set(REGISTRY))
    calls = ", ".join(f"`{op}`" for op in ops)
    return f"| `({head})` | {params} | {model.doc}; calls {calls} |"


def _heads(body) -> set:
    """The heads of the lists in `body`, at any depth."""
    found, pending = set(), list(body)
    while pending:
        datum = pending.pop()
        items = getattr(datum, "items", None)
        if items:
            found.add(getattr(items[0], "name", None))
            pending.extend(items)
    return found


if __name__ == "__main__":
    print(markdown(), end="")
