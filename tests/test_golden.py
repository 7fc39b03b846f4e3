"""Every NAME.lisp in golden/ and examples/ compiles, with default options, to exactly the
NAME.py beside it (and NAME.metal.py, NAME.cpu.py where they exist, for those targets).

`pytest --update-golden` rewrites the expected files; read every diff it makes.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import black
import pytest

from cases import EXAMPLES, SOURCES as CASES
from sx2torch.compiler import Options, compile_source


def expected_path(source: Path, target: str) -> Path:
    suffix = ".py" if target == "cuda" else f".{target}.py"
    return source.with_name(source.stem + suffix)


GOLDEN_PAIRS = [
    pytest.param(source, target, id=expected_path(source, target).name)
    for source in CASES
    for target in ("cuda", "metal", "cpu")
    if target == "cuda" or expected_path(source, target).exists()
]


@pytest.mark.parametrize(("source", "target"), GOLDEN_PAIRS)
def test_golden(source: Path, target: str, request):
    code = compile_source(
        source.read_text(encoding="utf-8"), source.name, Options(target=target)
    )
    expected = expected_path(source, target)
    if request.config.getoption("--update-golden"):
        expected.write_text(code, encoding="utf-8")
    assert expected.exists(), f"{expected.name} is missing: run pytest --update-golden"
    assert code == expected.read_text(
        encoding="utf-8"
    ), f"{expected.name} is stale: run pytest --update-golden"


@pytest.mark.parametrize(("source", "target"), GOLDEN_PAIRS)
def test_golden_output_is_black_stable_and_compiles_cleanly(source: Path, target: str):
    """Black leaves every expected module as it is: the format pass has black format
    only the statements too long for a line (sx2torch/format.py)."""
    code = expected_path(source, target).read_text(encoding="utf-8")
    assert black.format_str(code, mode=black.Mode()) == code
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compile(code, source.name, "exec")


def test_the_bundled_examples_are_there():
    assert sorted(p.stem for p in EXAMPLES.glob("*.lisp")) == [
        "bart",
        "bert",
        "convnet",
        "convnext",
        "deepseek-v3",
        "distill",
        "energy",
        "gemma2",
        "gpt2",
        "llama",
        "mamba",
        "mixtral",
        "modded-nanogpt-medium",
        "modded-nanogpt-simple",
        "rms-mlp",
        "scan",
        "t5",
        "tiny-gpt",
        "vit",
        "whisper",
    ]
