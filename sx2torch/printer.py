"""The graph IR as text: each node a line `%3 name = op(%1, %2) attrs [marks]  @line:col`,
each region indented under its node and ending in `yield`. What a printing adds beside the
structure is its `Notes`: `--dump-after` notes each value's dtypes or shape
(sx2torch/dump.py); sharing notes a specialization's plan, the casts and roundings its
held code is written from (sx2torch/plan/printed.py), and compares the texts.
"""

from __future__ import annotations

from sx2torch.errors import Span
from sx2torch.ir import Frame, Graph, Node, Scalar, outputs, walk
from sx2torch.syntax import scalars
from sx2torch.syntax.program import Init
from sx2torch.syntax.scalars import ScalarOp


class Notes:
    """What a printing says beside the graph's structure; this one, nothing. `inputs`: each
    argument and carried value gets a line of its own, with its note."""

    inputs = False

    def node(self, node: Node) -> str:
        """What a value's line ends with."""
        return ""

    def before(self, where, ids: dict) -> list:
        """Lines before a node's line, a region's `yield` (`where` is (node, index)), the
        first node's (TOP) or the return's (RETURN)."""
        return []

    def output(self, node: Node, region: int, index: int) -> str:
        """What output `index` of a region is followed by in its `yield`."""
        return ""

    def returned(self) -> str:
        """What the return line ends with."""
        return ""


PLAIN = Notes()
TOP, RETURN = "top", "return"


def graph(g: Graph, notes: Notes = PLAIN, head: str = "", text=None) -> str:
    """`g` as text with `notes`; `text`: its `Text`, where it is printed several times."""
    text = text or Text(g)
    ids = text.ids
    lines = [
        f"{g.model}.{g.name}({', '.join(f'{ids[n]} {n.name}' for n in g.inputs)}){head}"
    ]
    if notes.inputs:
        lines += [f"  {ids[n]}{notes.node(n)}" for n in g.inputs]
    lines += ["  " + line for line in notes.before(TOP, ids)]
    _block(g.nodes, text, notes, "  ", lines)
    lines += ["  " + line for line in notes.before(RETURN, ids)]
    lines.append(f"  return {text.returned}{notes.returned()}")
    return "\n".join(lines) + "\n"


class Text:
    """What a graph's text is without notes: each value's number, each node's line on
    either side of its note, each region's carried values and outputs; made once where a
    graph is printed with several notes (the plan pass prints a graph's plans for each
    of its specializations and for sharing's views)."""

    def __init__(self, g: Graph):
        ids = self.ids = numbering(g)
        self.returned = ", ".join(operand(o, ids) for o in outputs(g))
        self.line: dict = {}  # node -> its line before its note, and after it
        self.carried: dict = {}  # region -> its carried values
        self.given: dict = {}  # region -> its outputs
        for node in walk(g.nodes):
            inputs = ", ".join(operand(i, ids) for i in node.inputs)
            attrs = "".join(
                f" {k}={value(v)}" for k, v in node.attrs.items() if v is not None
            )
            frames = "".join(
                f" [{f.mode}{' library' if f.library else ''}]" for f in node.frames
            )
            name = f" {node.name}" if node.name else ""
            self.line[node] = (
                f"{ids[node]}{name} = {node.what}({inputs}){attrs}{frames}",
                f"  @{node.span.line}:{node.span.col}",
            )
            for region in node.regions:
                self.carried[region] = ", ".join(
                    f"{ids[i]} {i.name or ''}".strip() for i in region.inputs
                )
                self.given[region] = [operand(o, ids) for o in region.outputs]


def numbering(g: Graph) -> dict:
    """Each value -> `%N`, in the order of the lines."""
    return {node: f"%{i}" for i, node in enumerate([*g.inputs, *values(g.nodes)])}


def values(nodes: list):
    """Every node, and the carried values of the regions after their node."""
    for node in nodes:
        yield node
        for region in node.regions:
            yield from region.inputs
            yield from values(region.nodes)


def operand(value, ids: dict) -> str:
    if isinstance(value, Node):
        return ids[value]
    return scalar(value) if value is not None else "None"


def _block(nodes: list, text: Text, notes: Notes, indent: str, lines: list) -> None:
    ids = text.ids
    for node in nodes:
        lines += [indent + line for line in notes.before(node, ids)]
        before, after = text.line[node]
        lines.append(f"{indent}{before}{notes.node(node)}{after}")
        for index, region in enumerate(node.regions):
            lines.append(f"{indent}  region({text.carried[region]}):")
            if notes.inputs:
                lines += [f"{indent}    {ids[i]}{notes.node(i)}" for i in region.inputs]
            _block(region.nodes, text, notes, indent + "    ", lines)
            lines += [indent + "    " + l for l in notes.before((node, index), ids)]
            given = ", ".join(
                written + notes.output(node, index, k)
                for k, written in enumerate(text.given[region])
            )
            lines.append(f"{indent}    yield {given}")


def scalar(s: Scalar) -> str:
    return scalars.text(s, _leaf)


def _leaf(s: Scalar) -> str:
    if s.op is ScalarOp.LAYER:
        return f"layer {s.args[0]}"
    if s.op is ScalarOp.INDEX:
        return f"index({s.args[0].attrs['index']})"
    if s.op is ScalarOp.RUN:  # the node's op and its place: no names are given yet
        return repr(s.args[0])
    return f"{s.args[0]}={scalars.text(Scalar.lit(s.value), _leaf)}"  # [2 1 3]: a list


def value(v) -> str:
    """An attribute's value."""
    if isinstance(v, Scalar):
        return scalar(v)
    if isinstance(v, Frame):  # a gradient's marks
        return v.mode
    if isinstance(v, Init):  # a part of a concat
        return f"{v.kind}({', '.join(f'{k}={value(a)}' for k, a in v.args.items())})"
    if isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], Span):
        return scalar(v[1])  # a sub-model's keyword: (span, Scalar)
    if isinstance(v, tuple):
        return "[" + " ".join(value(a) for a in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {value(a)}" for k, a in v.items()) + "}"
    return str(v)
