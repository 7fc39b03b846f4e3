"""The language's names: the special forms' (which no defun may take), and how a source name
is spelled as a Python identifier (`mangle`, idempotent, always an identifier), which resolve
reads to refuse two parameters one attribute would hold, and emission writes."""

from __future__ import annotations

from sx2torch.syntax.forms import SPECIAL

# Traced by sx2torch/trace/forms.py's handlers, one for each; never called.
FORMS = frozenset(SPECIAL)

SPELLED = {
    "-": "_",
    "*": "_star",
    "+": "_plus",
    "/": "_slash",
    "<": "_lt",
    ">": "_gt",
    "=": "_eq",
    "!": "_bang",
    "?": "_p",
    "&": "_and",
    ".": "_dot",
    "%": "_pct",
}


def mangle(name: str) -> str:
    """`rms-norm*` -> `rms_norm_star`; a leading digit or underscore gets a `v` in front."""
    text = "".join(
        SPELLED.get(c, c) if not (c.isalnum() or c == "_") or not c.isascii() else c
        for c in name
    )
    text = "".join(
        c if c.isascii() and (c.isalnum() or c == "_") else f"_u{ord(c):04x}"
        for c in text
    )
    if not text or text[0].isdigit() or text[0] == "_":
        text = "v" + text
    assert text.isidentifier(), text
    return text
