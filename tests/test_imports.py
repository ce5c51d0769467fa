"""The package's import structure: no circular imports, layers point down, public names resolve.

The graph is read from the source with :mod:`ast` (nothing is imported), from
module-level and function-level imports alike; imports under ``if TYPE_CHECKING:``
never run and are left out. ``from ddtk.comm import ring`` counts as an import of
``ddtk.comm.ring``, not of the package ``ddtk.comm``.
"""

from __future__ import annotations

import ast
import functools
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "ddtk"

# Subpackages whose public names are exported from their __init__, and whether
# importing the subpackage alone may load torch (it did before the exports).
SUBPACKAGES = {
    "ddtk.checkpoint": True,
    "ddtk.comm": True,
    "ddtk.compression": True,
    "ddtk.faults": True,
    "ddtk.frameworks": False,
    "ddtk.memory": True,
    "ddtk.net": False,
    "ddtk.parallel": False,
    "ddtk.precision": True,
    "ddtk.profiling": False,
    "ddtk.quiz": False,
    "ddtk.recovery": True,
    "ddtk.viz": False,
}


def module_names(root: Path = PACKAGE) -> dict[str, Path]:
    """``ddtk.x.y`` -> its file, for every module and package of ``root``."""
    names = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """ids of the nodes inside ``if TYPE_CHECKING:`` blocks."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(inner) for stmt in node.body for inner in ast.walk(stmt))
    return skip


def _targets(node: ast.AST, package: str, modules: dict[str, Path]) -> list[str]:
    """The ddtk modules one import statement loads (submodules where it names them)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:
        parts = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join([*parts, base] if base else parts)
    return [
        f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
        for alias in node.names
    ]


@functools.cache
def import_graph(root: Path = PACKAGE) -> dict[str, dict[str, int]]:
    """module -> {imported ddtk module: line of the first such import} (read once per root)."""
    modules = module_names(root)
    graph: dict[str, dict[str, int]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        skip = _type_checking_nodes(tree)
        edges: dict[str, int] = {}
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            for target in _targets(node, package, modules):
                while target and target not in modules:  # an attribute of a module
                    target = target.rpartition(".")[0]
                if target.startswith("ddtk") and target != name:
                    edges.setdefault(target, node.lineno)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
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
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _describe(component: list[str], graph: dict[str, dict[str, int]]) -> str:
    edges = [
        f"{a} -> {b} (line {line})"
        for a in component
        for b, line in graph[a].items()
        if b in component
    ]
    return "; ".join(edges)


def test_the_cycle_finder_finds_a_planted_cycle(tmp_path: Path) -> None:
    root = tmp_path / "ddtk"
    (root / "sub").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "sub" / "__init__.py").write_text("")
    (root / "sub" / "a.py").write_text("from ddtk.sub import b\n")
    (root / "sub" / "b.py").write_text("def f():\n    from ddtk.sub.a import g\n")
    (root / "sub" / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ddtk.sub import a\n"
    )
    graph = import_graph(root)
    assert cycles(graph) == [["ddtk.sub.a", "ddtk.sub.b"]]
    assert graph["ddtk.sub.c"] == {}


def test_no_module_of_ddtk_imports_itself_back() -> None:
    graph = import_graph()
    found = [_describe(c, graph) for c in cycles(graph)]
    assert not found, "circular imports: " + " | ".join(found)


def test_viz_does_not_import_bench() -> None:
    upward = [
        f"{a} -> {b} (line {line})"
        for a, edges in import_graph().items()
        if a == "ddtk.viz" or a.startswith("ddtk.viz.")
        for b, line in edges.items()
        if b == "ddtk.bench" or b.startswith("ddtk.bench.")
    ]
    assert not upward, "ddtk.viz sits below ddtk.bench: " + "; ".join(upward)


def test_every_exported_name_of_every_subpackage_resolves() -> None:
    missing = []
    for package in SUBPACKAGES:
        module = importlib.import_module(package)
        assert module.__all__, f"{package} exports nothing"
        missing += [f"{package}.{name}" for name in module.__all__ if not hasattr(module, name)]
        assert set(module.__all__) <= set(dir(module)), f"dir({package}) hides exported names"
    assert not missing, "exported but not importable: " + ", ".join(missing)


def test_strategies_import_from_the_package_like_torch_nn() -> None:
    from ddtk.parallel import DataParallel, ZeroOptimizer
    from ddtk.parallel.data_parallel import DataParallel as defined_dp
    from ddtk.parallel.zero import ZeroOptimizer as defined_zero

    assert (DataParallel, ZeroOptimizer) == (defined_dp, defined_zero)
    with pytest.raises(AttributeError, match=r"ddtk\.parallel.*NoSuchStrategy"):
        importlib.import_module("ddtk.parallel").NoSuchStrategy  # noqa: B018


def test_importing_a_light_subpackage_does_not_load_torch() -> None:
    light = [name for name, heavy in SUBPACKAGES.items() if not heavy]
    code = (
        "import sys\n"
        f"for name in {light!r}:\n"
        "    __import__(name)\n"
        "from ddtk.cli import build_parser\n"
        "build_parser()  # the `ddtk` command's parser: every command group registered\n"
        "print(sorted(m for m in ('torch', 'matplotlib') if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "[]", f"{light} loaded {out.stdout.strip()}"
