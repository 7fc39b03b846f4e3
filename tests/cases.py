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


# LlamaConfig's names for the tiny random-weight Llama the port's tests build
TINY_LLAMA = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
)
