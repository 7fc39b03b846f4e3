"""Pass boundaries: a pass reads what the pass before it made, not that pass's inputs."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "sx2torch"


def imported(path: Path) -> set:
    """The sx2torch modules a file imports."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name.startswith("sx2torch")}


@pytest.mark.parametrize(
    "files, forbidden",
    [
        # emission sees the IR and the registry, never the reader's data
        ("emit/*.py", "sx2torch.syntax.read"),
        # gradient expands the traced graph: it knows nothing of emission
        ("gradient.py", "sx2torch.emit"),
        ("policy/*.py", "sx2torch.emit"),
        ("policy/*.py", "sx2torch.syntax.read"),
    ],
)
def test_a_pass_does_not_reach_past_its_input(files, forbidden):
    for path in PACKAGE.glob(files):
        reached = {m for m in imported(path) if m.startswith(forbidden)}
        assert not reached, f"{path.name} imports {sorted(reached)}"
