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
from sx2torch.ops.registry import REGISTRY

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
    ("cache",),
    ("ranks",),
    ("policy",),
    # the tensor-parallel plan, an analysis of the graphs
    ("shard",),
    # each specialization's plan (statements, blocks, spelled casts, hoists) and the
    # module's methods, decided; names and emit (emit/) only name and print them
    ("plan",),
    ("emit",),
    ("format", "lines"),
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
    assert not climbs, sorted(climbs)


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
    assert not later, sorted(later)


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
        # gradient expands the traced graph: it knows nothing of emission, nor of the
        # tracer (both build nodes with ops/builder.py)
        ("gradient/*.py", "sx2torch.emit"),
        ("gradient/*.py", "sx2torch.trace"),
        ("policy/*.py", "sx2torch.emit"),
        # the plan decides what emission prints, knowing nothing of how it is printed
        ("plan/*.py", "sx2torch.emit"),
        ("plan/*.py", "sx2torch.build"),
        ("policy/*.py", "sx2torch.syntax.read"),
    ],
)
def test_a_pass_does_not_reach_past_its_input(files, forbidden):
    for path in PACKAGE.glob(files):
        reached = {m for m in imported(path) if m.startswith(forbidden)}
        assert not reached, f"{path.name} imports {sorted(reached)}"


# The modules that know an op by its entry's fields (sx2torch/ops/registry.py), never by its
# name: the passes after the reader, the pipeline's printers, the compiler and the tools. An
# op's behaviour that a pass tests `node.op == "take"` for is a field of the op's entry.
BY_FIELD = [u for u in LEVEL if LEVEL["resolve"] <= LEVEL[u] <= LEVEL["tools"]]


def _literals(node: ast.AST, constants: dict) -> list:
    """The strings a comparison's operand holds: a literal, a tuple, list or set of them
    (or a frozenset of one), or a module-level name bound to one of those."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [s for item in node.elts for s in _literals(item, constants)]
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) in (
        "frozenset",
        "set",
        "tuple",
    ):
        return [s for arg in node.args for s in _literals(arg, constants)]
    if isinstance(node, ast.Name):
        return constants.get(node.id, [])
    return []


def _constants(tree: ast.Module) -> dict:
    """The module-level names bound to strings: {name: the strings}."""
    return {
        statement.targets[0].id: _literals(statement.value, {})
        for statement in tree.body
        if isinstance(statement, ast.Assign)
        and len(statement.targets) == 1
        and isinstance(statement.targets[0], ast.Name)
    }


def _in_passes(finder) -> list:
    """(path, line, what) for what `finder` sees in each module that knows ops by field."""
    return [
        (path.relative_to(PACKAGE), line, what)
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.relative_to(PACKAGE).parts[0].removesuffix(".py") in BY_FIELD
        for line, what in finder(path.read_text(encoding="utf-8"))
    ]


def op_names_compared(source: str) -> list:
    """(line, op name) for each registry op's name a comparison tests for. In `a in b`, the
    strings b holds: `"at" in node.attrs` asks for a key, not an op."""
    tree = ast.parse(source)
    constants = _constants(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        for k, test in enumerate(node.ops):
            sides = operands[k + 1 : k + 2]
            if not isinstance(test, (ast.In, ast.NotIn)):
                sides = operands[k : k + 2]
            found.extend(
                (node.lineno, name)
                for side in sides
                for name in _literals(side, constants)
                if name in REGISTRY
            )
    return sorted(set(found))


def test_the_finder_sees_an_op_named_in_a_comparison():
    source = """
FILLS = ("ones-like", "zeros-like")
a = node.op == "take"
b = node.op in FILLS
c = "at" in node.attrs
d = name != "*" and kind == "cuda"
"""
    assert op_names_compared(source) == [
        (3, "take"),
        (4, "ones-like"),
        (4, "zeros-like"),
        (6, "*"),
    ]


# Words that name an op and something else a pass tests: `stack` is also the syntax's
# initializer kind of a stack of layers (`param.init.kind == "stack"`), which no field of
# an op could replace; the finder reads words, not what they are compared with.
NOT_ONLY_OPS = {"stack"}


def test_no_pass_names_an_op_in_a_comparison():
    named = {
        f"{path}:{line}: {name!r}"
        for path, line, name in _in_passes(op_names_compared)
        if name not in NOT_ONLY_OPS
    }
    assert not named, sorted(named)


def _is_op_name(node: ast.AST) -> bool:
    """`<value>.op.name`: a node's op by its name."""
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "name"
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "op"
    )


def op_names_looked_up(source: str) -> list:
    """(line, what) for each place an op is found by its name rather than held: a registry
    op's name (a literal, or a module-level name bound to some) looked up in `REGISTRY`, a
    node's `op.name` compared or used as a key (a table of the pass's own by op name), a
    node's entry looked up again (`REGISTRY[node.op]`, which the registry answers for code
    written before `Node.op` held the entry), an OP node made with a name (the builder
    makes one from a name and holds the entry). A message prints `op.name`; what a pass makes, `t.op("+", [a, b])`, is named as source
    names it, and the builder looks the name up once."""
    tree = ast.parse(source)
    constants = _constants(tree)

    def names(node: ast.AST) -> list:
        return [s for s in _literals(node, constants) if s in REGISTRY]

    found = []
    for node in ast.walk(tree):
        keys = []
        if isinstance(node, ast.Subscript):
            keys, table = [node.slice], node.value
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and node.args
        ):
            keys, table = [node.args[0]], node.func.value
        elif isinstance(node, ast.Compare):
            if any(map(_is_op_name, [node.left, *node.comparators])):
                found.append((node.lineno, "op.name compared"))
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", None) == "Node"
            and len(node.args) > 1
        ):
            found.extend(
                (node.lineno, f"{n!r} a node's op") for n in names(node.args[1])
            )
        for key in keys:
            if _is_op_name(key):
                found.append((node.lineno, "op.name a key"))
            elif getattr(table, "id", None) == "REGISTRY":
                if getattr(key, "attr", None) == "op":  # the entry itself, held
                    found.append((node.lineno, "a held op looked up again"))
                found.extend((node.lineno, f"{n!r} looked up") for n in names(key))
    return sorted(set(found))


def test_the_finder_sees_an_op_found_by_its_name():
    source = """
TAKE = "take"
a = REGISTRY["matmul"].rank
b = REGISTRY.get(TAKE)
c = SPECIAL[node.op.name]
d = SPECIAL.get(n.op.name, None)
e = node.op.name in FILLS or n.op.name != name
f = Node(Kind.OP, "exp", (x,), {}, span, form)
g = t.op("+", [a, b]), REGISTRY[name], node.attrs["axis"], f"'{node.op.name}' needs"
h = REGISTRY[node.op].rank
"""
    assert op_names_looked_up(source) == [
        (3, "'matmul' looked up"),
        (4, "'take' looked up"),
        (5, "op.name a key"),
        (6, "op.name a key"),
        (7, "op.name compared"),
        (8, "'exp' a node's op"),
        (10, "a held op looked up again"),
    ]


def test_no_pass_finds_an_op_by_its_name():
    found = {
        f"{path}:{line}: {what}" for path, line, what in _in_passes(op_names_looked_up)
    }
    assert not found, sorted(found)
