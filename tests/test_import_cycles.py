"""No module of sx2torch (or of the repository's tools/) imports itself back, through any chain
of imports, counting package __init__s as modules (tests/import_graph.py says what counts)."""

import pytest

from import_graph import MODULES, imports


def cycles() -> list:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    graph = {module: imports(module) for module in MODULES}
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def test_no_module_imports_itself_back():
    assert cycles() == []


@pytest.mark.parametrize(
    "source, cyclic",
    [
        ("from sx2torch.b import thing\n", True),
        ("def late():\n    from sx2torch import b\n", True),
        ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from sx2torch.b import T\n", True),
        # b is a package: naming it reads its __init__, which imports a
        ("from sx2torch.b import c\n", True),
        # a submodule by its full path reads only the submodule
        ("import sx2torch.b.c as c\nfrom sx2torch.b.c import d\n", False),
    ],
)  # fmt: skip
def test_the_check_sees_every_kind_of_import(tmp_path, monkeypatch, source, cyclic):
    (tmp_path / "a.py").write_text(source)
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "__init__.py").write_text("from sx2torch.a import other\n")
    (tmp_path / "b" / "c.py").write_text("")
    monkeypatch.setitem(MODULES, "sx2torch.a", tmp_path / "a.py")
    monkeypatch.setitem(MODULES, "sx2torch.b", tmp_path / "b" / "__init__.py")
    monkeypatch.setitem(MODULES, "sx2torch.b.c", tmp_path / "b" / "c.py")
    assert (["sx2torch.a", "sx2torch.b"] in cycles()) is cyclic
