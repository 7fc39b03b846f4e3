"""How the backward names and describes the forward's values (`grad_x`, `gradient of
(* x w)`)."""

from __future__ import annotations

from sx2torch.ir import Kind, Node
from sx2torch.syntax.echo import echo


def shown(node: Node) -> str:
    """How a comment names a forward value: a carried value (in the loop or after it) by
    its name, else its form."""
    if node.kind in (Kind.INPUT, Kind.ITEM) and node.name:
        return node.name
    return echo(node.form)


def label(node: Node) -> str:
    """A forward value's name: its source name, else its op and the name of what it reads."""
    if node.name is not None:
        return node.name
    if node.kind is Kind.ITEM:
        return _word(node)
    if node.kind is Kind.IF:
        return label(_given(node))
    first = next((i for i in node.inputs if isinstance(i, Node)), None)
    return (
        _word(node) if first is None else f"{_word(node)}-{first.name or _word(first)}"
    )


def _given(node: Node) -> Node:
    """What an IF is named as: the value its first branch gives."""
    return next(o for r in node.regions for o in r.outputs if isinstance(o, Node))


def _word(node: Node) -> str:
    if node.kind is Kind.IF:
        return _word(_given(node))
    if node.kind is Kind.ITEM:  # a value a loop gives: named by its form, chain or for
        return node.form.items[0].name
    return node.op.word if node.kind is Kind.OP else node.what
