"""A docstring in the source is the generated class's or method's __doc__, exactly."""

from __future__ import annotations

import black
import pytest

TRICKY = [
    "plain",
    "",
    " ",
    '"quoted at the start',
    'quoted at the end"',
    '"',
    '""',
    'a """triple""" quote',
    '"""',
    "back\\slash",
    "ends in a backslash\\",
    "\\",
    "  leading and trailing spaces  ",
    "two\nlines",
    "\nstarts with a newline",
    "ends with a newline\n",
    "  indented\n    continuation\n  lines  ",
    "tab\there",
    "unicode: é ☃ 𝔁 \u2028 line separator",
    "a\x00nul and \x1b escape",
    'trailing quote after backslash\\"',
]


def lisp(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


@pytest.mark.parametrize("text", TRICKY)
def test_the_docstring_is_the_source_text(build, text):
    source = (
        f"(defmodel block (&key (d 2)) {lisp(text)}\n"
        f"  (defun forward (x) {lisp(text)} (relu x)))\n"
        "(defparam b (block))\n"
        f"(defun helper (x) {lisp(text)} (b x))\n"
        "(defun forward (x) (helper x))\n"
    )
    module, code = build(source)
    assert black.format_str(code, mode=black.Mode()) == code
    assert module.Block.__doc__ == text
    assert module.Block.forward.__doc__ == text
    assert module.Model.helper.__doc__ == text


def test_a_plain_docstring_stays_triple_quoted(build):
    _, code = build('(defun forward (x) "The identity, said plainly." x)\n')
    assert '        """The identity, said plainly."""\n' in code
