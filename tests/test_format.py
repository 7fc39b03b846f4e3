"""The format pass formats a module class by class; the result must be exactly black's
formatting of the whole module, for every golden and example source, every target, with
and without source lines, and for the benchmark's large synthetic sources."""

from __future__ import annotations

import black
import pytest

from benchmarks.transpile import SHAPES
from cases import SOURCES
from sx2torch import format
from sx2torch.compiler import Options, compile_source

OPTIONS = [
    Options(),
    Options(target="metal"),
    Options(target="cpu"),
    Options(source_lines=True),
]
TEXTS = [
    pytest.param(s.read_text(encoding="utf-8"), s.name, id=s.name) for s in SOURCES
]
SIZES = {
    "defuns": 40,
    "submodels": 6,
    "attention": 3,
}  # past a call chain; a few classes
TEXTS += [
    pytest.param(SHAPES[name][0](size), f"{name}.lisp", id=name)
    for name, size in SIZES.items()
]


@pytest.mark.parametrize(("text", "filename"), TEXTS)
def test_pieces_format_as_the_whole_module(text, filename, monkeypatch):
    modules = []
    pieces = format.run

    def run(tree):
        modules.append(tree)
        return pieces(tree)

    monkeypatch.setattr(format, "run", run)
    for options in OPTIONS:
        code = compile_source(text, filename, options)
        whole = black.format_str(modules[-1].code, mode=black.Mode())
        assert code == whole, f"{filename} {options}"
    assert len(modules) == len(OPTIONS)
