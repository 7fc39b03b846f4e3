"""Source forms printed back, short, for the comments that tie code to source."""

from __future__ import annotations

from sx2torch.syntax.read import (
    Boolean,
    Datum,
    Keyword,
    List,
    Number,
    String,
    Symbol,
    Vector,
)

WIDTH = 72


def echo(datum: Datum, body: bool = True) -> str:
    """The form on one line; sub-forms elided as `...` until it fits.

    With body=False, a form's arguments after its first are elided:
    `(with-numerics (:sensitivity :high) ...)`.
    """
    if not body and isinstance(datum, List) and len(datum.items) > 2:
        return f"({_show(datum.items[0], 9)} {_show(datum.items[1], 9)} ...)"
    for depth in range(8, 0, -1):
        text = _show(datum, depth)
        if len(text) <= WIDTH:
            return text
    return _show(datum, 0)


def show(datum: Datum) -> str:
    """The whole form on one line."""
    return _show(datum, 1 << 30)


def _show(datum: Datum, depth: int) -> str:
    if isinstance(datum, (List, Vector)):
        if depth == 0:
            return "(...)" if isinstance(datum, List) else "[...]"
        inner = " ".join(_show(item, depth - 1) for item in datum.items)
        return f"({inner})" if isinstance(datum, List) else f"[{inner}]"
    if isinstance(datum, Symbol):
        return datum.name
    if isinstance(datum, Keyword):
        return ":" + datum.name
    if isinstance(datum, Boolean):
        return "true" if datum.value else "false"
    if isinstance(datum, Number):
        return datum.text or repr(datum.value)
    if isinstance(datum, String):
        return '"..."'
    raise TypeError(datum)
