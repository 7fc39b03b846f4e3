"""`:key value` arguments, parsed alike wherever the language takes them: a call of an op or
a defun, and the declarations (defparam, defrun, an initializer, a sub-model instance).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from sx2torch.errors import SourceError
from sx2torch.syntax.read import Datum, Keyword, shown


@dataclass(frozen=True)
class Taker:
    """What takes the keywords, as its diagnostics name it."""

    keys: tuple  # the keys it takes, listed in this order
    place: str  # "for 'softmax'", "in defrun"
    suggest: bool = False  # name the known key nearest an unknown one
    missing: str = ""  # where a key without a value is: " in defrun"


def call(name: str, keys) -> Taker:
    """An op's or a defun's keywords, after its positional arguments."""
    return Taker(tuple(keys), f"for '{name}'", suggest=True)


def form(where: str, keys) -> Taker:
    """A declaration's keywords, from a fixed place in its form."""
    return Taker(tuple(keys), f"in {where}", missing=f" in {where}")


def split(items: tuple, taker: Taker) -> tuple:
    """Positional arguments, then `:key value` pairs: (positional, {key: value})."""
    start = next(
        (i for i, item in enumerate(items) if isinstance(item, Keyword)), len(items)
    )
    keys = parse(
        items[start:],
        taker,
        lambda item: "expected a keyword: positional arguments come before keywords",
    )
    return items[:start], keys


def keywords(items: tuple, taker: Taker) -> dict:
    """`:key value` pairs and nothing else: {key: value}."""
    first = taker.keys[0] if taker.keys else "key"
    return parse(
        items,
        taker,
        lambda item: f"expected a keyword such as :{first}, got {shown(item)}",
    )


def parse(items: tuple, taker: Taker, not_a_key) -> dict:
    """{key: value} of `:key value` pairs in source order, each checked where it stands;
    `not_a_key(item)` says what is wrong with an item where a keyword belongs."""
    found: dict[str, Datum] = {}
    for at in range(0, len(items), 2):
        key = items[at]
        if not isinstance(key, Keyword):
            raise SourceError(key.span, not_a_key(key))
        if at + 1 == len(items):
            raise SourceError(
                key.span, f"keyword :{key.name} without a value{taker.missing}"
            )
        if key.name not in taker.keys:
            raise _unknown(key, taker)
        if key.name in found:
            raise SourceError(key.span, f":{key.name} given twice")
        found[key.name] = items[at + 1]
    return found


def _unknown(key: Keyword, taker: Taker) -> SourceError:
    close = difflib.get_close_matches(key.name, taker.keys, n=1, cutoff=0.75)
    hint = f": did you mean :{close[0]}?" if close and taker.suggest else ""
    listed = ", ".join(f":{k}" for k in taker.keys) or "none"
    return SourceError(
        key.span,
        f"unknown keyword :{key.name} {taker.place}{hint} (known: {listed})",
    )
