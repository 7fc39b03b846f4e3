"""The SexpGPU sources the tests compile: golden/ holds one case per precision rule,
examples/ the bundled models; each NAME.lisp sits beside the NAME.py it compiles to."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "golden"
EXAMPLES = ROOT / "examples"
SOURCES = sorted(
    (p for d in (GOLDEN, EXAMPLES) for p in d.glob("*.lisp")), key=lambda p: p.name
)


def lisp(name: str) -> Path:
    """The source named NAME.lisp, in golden/ or examples/."""
    (path,) = [p for p in SOURCES if p.stem == name]
    return path
