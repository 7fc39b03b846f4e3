"""What each module of sx2torch (and of the repository's tools/) imports, read from its source:
deferred imports inside functions and type-only imports count, as every import does. A
package's __init__ is a module: an import that names the package (`from sx2torch import ir`,
`from sx2torch.trace import calls`) reads its namespace, which is half made while the
__init__'s own imports run, so it counts as importing the __init__. An import by a
submodule's full path (`import sx2torch.ir as ir`, `from sx2torch.ir import Graph`) reads
only the submodule. Read by tests/test_import_cycles.py and tests/test_boundaries.py."""

import ast
import functools
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = [ROOT / "sx2torch", ROOT / "tools"]


def _name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_name(path): path for root in PACKAGES for path in root.rglob("*.py")}


def _owner(name: str):
    """The module an imported dotted name lives in (a module, or the package defining it)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


@functools.cache
def _import_nodes(path: pathlib.Path) -> list:
    """Read once per test process: every test of the graph walks every module."""
    tree = ast.parse(path.read_text())
    return [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]


def imports(module: str) -> set:
    path = MODULES[module]
    found = set()
    for node in _import_nodes(path):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                package = (
                    module if path.name == "__init__.py" else module.rpartition(".")[0]
                )
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{base}".rstrip(".")
            names = [f"{base}.{alias.name}" for alias in node.names]
            if MODULES.get(base, path).name == "__init__.py":
                names.append(base)  # the package's namespace is read
        found |= {_owner(name) for name in names} - {None, module}
    return found
