"""Layers and pass boundaries. The package is a stack of layers: a module imports from its own
layer and the layers below it, never above, deferred and type-only imports counted (as
tests/import_graph.py reads them). The passes are layers in the pipeline's order, so no pass
imports a later one; and a pass reads what the pass before it made, not that pass's inputs.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

from import_graph import MODULES, imports
from sx2torch.compiler import PASSES

PACKAGE = Path(__file__).resolve().parent.parent / "sx2torch"

GROUND = ("errors", "limits", "version", "build", "output")
# From the ground floor up; each entry is the units (sx2torch's top-level modules and
# packages) of one layer. A unit may import its own layer's units and any lower layer's.
LAYERS = [
    # diagnostics, limits, the version, the libcst builders, standard output and -o
    GROUND,
    # the reader's data, compile-time scalars, the program's types, the language's names
    ("syntax",),
    # the graph IR (its operands are syntax's scalars), and its printer
    ("ir", "printer"),
    # the registry: each op's signature, torch code, derivative, marks and rank rule
    ("ops",),
    # the passes, in the pipeline's order (read is syntax's reader; names and emit, emit/)
    ("resolve",),
    ("trace",),
    ("gradient",),
    ("ranks",),
    ("policy",),
    ("functions",),
    ("emit",),
    ("format",),
    # the pipeline's printers (--dump-after) and its warnings; then the pass table
    ("dump", "lint"),
    ("compiler",),
    # explain, report, check, ops_table: around the pipeline, importing it
    ("tools",),
    # the public API; the command line and the package's own namespace
    ("api",),
    ("cli", "__main__", "sx2torch"),
]
# Beside the stack, with what each may import. The interpreter accepts what the compiler
# accepts: it checks a program with the compiler's passes through the policy (their
# diagnostics, never their dtype decisions) and reads sources with the API's limits, then
# evaluates it from the rules, importing no pass's module to compute a value. The
# runtime is what generated modules import: the ground floor, and the public API (its
# located.py compiles a module's source again when an error is shown).
BESIDE = {
    "interpret": {*GROUND, "syntax", "ir", "ops", "resolve", "compiler", "api"},
    "runtime": {*GROUND, "api"},
    "metal": set(),
}
# Where a pass still climbs above its layer, each with what removes it; the test fails when
# one is gone, so that its entry goes with it.
CLIMBS = {
    ("gradient", "ranks"): (
        "gradient asks the rank rules whether Y is 0-d before the ranks pass runs"
        " (issue 34, item 2: shapes at node creation)"
    ),
}


def unit(module: str) -> str:
    """`sx2torch.emit.naming` -> `emit`; the package's __init__ is `sx2torch`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


# each pass of the pipeline's table, by its unit (its name where they agree)
PASS_UNITS = list(
    dict.fromkeys(
        {"read": "syntax", "names": "emit"}.get(p.name, p.name) for p in PASSES
    )
)
LEVEL = {name: level for level, names in enumerate(LAYERS) for name in names}
UNITS = {unit(m) for m in MODULES if m.split(".")[0] == "sx2torch"}


@functools.lru_cache(maxsize=None)
def reaches() -> frozenset:
    """(importer's unit, imported unit) for every import of sx2torch that crosses units."""
    return frozenset(
        (unit(module), unit(other))
        for module in MODULES
        if module.split(".")[0] == "sx2torch"
        for other in imports(module)
        if other.split(".")[0] == "sx2torch" and unit(other) != unit(module)
    )


def test_every_unit_has_its_place():
    assert UNITS == set(LEVEL) | set(BESIDE)
    assert not set(LEVEL) & set(BESIDE)


def test_a_layer_imports_only_its_own_and_lower_layers():
    def allowed(importer: str, imported: str) -> bool:
        if importer in BESIDE:
            return imported in BESIDE[importer]
        if imported in BESIDE:  # `sx2torch run` is the interpreter's only caller
            return importer == "cli" and imported == "interpret"
        return LEVEL[imported] <= LEVEL[importer]

    climbs = {pair for pair in reaches() if not allowed(*pair)}
    assert climbs == set(CLIMBS)


def test_the_passes_are_layers_in_the_pipeline_s_order():
    levels = [LEVEL[name] for name in PASS_UNITS]
    assert levels == sorted(set(levels))


def test_no_pass_imports_a_later_pass():
    later = {
        (earlier, after)
        for i, earlier in enumerate(PASS_UNITS)
        for after in PASS_UNITS[i + 1 :]
        if (earlier, after) in reaches()
    }
    assert later == set(CLIMBS)


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
