"""No import cycles in python/opmux: the import graph, read statically, has no cycle.

Every ``import`` and ``from ... import`` counts, at any level (module top, a function body, an
``if TYPE_CHECKING:`` block): a function-level import only postpones a cycle to the first call
that takes it. Relative imports are resolved against the importing module's package. An edge
goes to the most specific module named: ``from . import x`` is an edge to the submodule ``x`` when
there is one, to the package otherwise. The parent packages Python imports along the way are not
edges (a submodule importing its package's siblings is not a cycle).
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "python"


def _modules(root: Path, package: str) -> dict[str, tuple[Path, bool]]:
    """Module name -> (file, is a package) for every .py file under ``root/package``."""
    out: dict[str, tuple[Path, bool]] = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        out[".".join(parts)] = (path, is_package)
    return out


def _known(name: str, modules: dict[str, tuple[Path, bool]]) -> str | None:
    """``name`` or its nearest enclosing module that is in ``modules`` (None: outside)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(root: Path, package: str) -> dict[str, dict[str, int]]:
    """Module -> {imported module of the package: line of the first such import}."""
    modules = _modules(root, package)
    graph: dict[str, dict[str, int]] = {}
    for name, (path, is_package) in modules.items():
        edges: dict[str, int] = {}

        def add(target: str | None, line: int, name: str = name, edges: dict[str, int] = edges) -> None:
            if target is not None and target != name:
                edges.setdefault(target, line)

        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    add(_known(alias.name, modules), node.lineno)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".") if is_package else name.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    if node.module:
                        base.append(node.module)
                    source = ".".join(base)
                else:
                    source = node.module or ""
                for alias in node.names:
                    sub = f"{source}.{alias.name}"
                    add(sub if sub in modules else _known(source, modules), node.lineno)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan), each as a
    closed path ``[a, b, ..., a]`` through that component, starting at its smallest name."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(v: str) -> None:  # recursion depth is bounded by the package's module count
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)

    out = []
    for component in components:
        start = min(component)
        # breadth-first from start back to start inside the component: a shortest cycle
        previous: dict[str, str] = {}
        frontier = [start]
        found = None
        while frontier and found is None:
            nxt = []
            for v in frontier:
                for w in sorted(graph[v]):
                    if w == start:
                        found = v
                        break
                    if w in component and w not in previous:
                        previous[w] = v
                        nxt.append(w)
                if found is not None:
                    break
            frontier = nxt
        assert found is not None
        path = [found]
        while path[-1] != start:
            path.append(previous[path[-1]])
        out.append([*reversed(path), start])
    return sorted(out)


def describe(cycle: list[str], graph: dict[str, dict[str, int]]) -> str:
    return " -> ".join(f"{a} (line {graph[a][b]})" for a, b in itertools.pairwise(cycle)) + f" -> {cycle[-1]}"


def test_opmux_has_no_import_cycles() -> None:
    graph = import_graph(ROOT, "opmux")
    assert len(graph) > 50 and "opmux.kernels.fused_op" in graph["opmux.kernels.ops._group"]
    found = cycles(graph)
    assert not found, "import cycles in python/opmux:\n" + "\n".join(describe(c, graph) for c in found)


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@pytest.fixture
def toy(tmp_path: Path) -> Iterator[Path]:
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "from .a import f\n",
            "pkg/a.py": "import os\nfrom . import b\n\ndef f():\n    from .sub.c import g\n",
            "pkg/b.py": "from pkg import d\n",
            "pkg/d.py": "",
            "pkg/sub/__init__.py": "",
            "pkg/sub/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..a import f\n",
        },
    )
    yield tmp_path


def test_graph_resolves_relative_and_nested_imports(toy: Path) -> None:
    graph = import_graph(toy, "pkg")
    assert graph == {
        "pkg": {"pkg.a": 1},
        "pkg.a": {"pkg.b": 2, "pkg.sub.c": 5},
        "pkg.b": {"pkg.d": 1},
        "pkg.d": {},
        "pkg.sub": {},
        "pkg.sub.c": {"pkg.a": 3},
    }


def test_a_cycle_through_a_function_level_import_is_named(toy: Path) -> None:
    graph = import_graph(toy, "pkg")
    found = cycles(graph)
    assert found == [["pkg.a", "pkg.sub.c", "pkg.a"]]
    assert describe(found[0], graph) == "pkg.a (line 5) -> pkg.sub.c (line 3) -> pkg.a"


def test_no_cycle_without_one(toy: Path) -> None:
    _write(toy, {"pkg/sub/c.py": "import pkg.d\n"})
    assert cycles(import_graph(toy, "pkg")) == []
