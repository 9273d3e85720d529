"""One loader, imported one way: the artifact-reading modules form no import cycle.

``Artifact.load`` and ``runtime/api.py`` used to call each other (each importing the other
inside a function). Function-level imports count here: the graph is every ``import`` in
the source of ``hpcodegen.artifact`` and ``hpcodegen.runtime`` (nested packages included),
and it must be acyclic. Each loader module also imports first in a fresh interpreter,
without torch.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "hpcodegen"
LAYERS = ("artifact", "runtime")
LOADER_MODULES = ("hpcodegen.artifact.load", "hpcodegen.runtime.checked",
                  "hpcodegen.runtime.artifact", "hpcodegen.runtime.api",
                  "hpcodegen.runtime.loader", "hpcodegen.runtime.pretrained",
                  "hpcodegen.launch.rank.artifact", "hpcodegen.parity.harness")


def _module_name(path: Path, package: Path) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of ``tree`` that runs (``if TYPE_CHECKING:`` blocks left out)."""
    out, todo = [], [tree]
    while todo:
        node = todo.pop()
        out.append(node)
        if _type_checking(node):
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))
    return out


def _graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the modules of the same layers it imports (anywhere in its source, inside
    functions too; not the imports only type checkers see)."""
    files = {_module_name(p, package): p for layer in LAYERS
             for p in (package / layer).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        deps: set[str] = set()
        for node in _runtime_nodes(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            deps |= {n for n in names if n in files and n != name}
        graph[name] = deps
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (as a path back to its start), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                return [*stack[stack.index(dep):], dep]
            if dep not in state:
                found = visit(dep)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_artifact_and_runtime_modules_import_each_other_one_way() -> None:
    graph = _graph()
    assert "hpcodegen.runtime.api" in graph and "hpcodegen.runtime.artifact" in graph
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])
    # the pure layer never reaches up into the runtime
    assert not any(dep.startswith("hpcodegen.runtime") for name, deps in graph.items()
                   if name.startswith("hpcodegen.artifact") for dep in deps)
    assert "hpcodegen.runtime.api" not in graph["hpcodegen.runtime.artifact"]


@pytest.mark.parametrize("module", LOADER_MODULES)
def test_each_loader_module_imports_first_and_without_torch(module: str) -> None:
    code = f"import sys, {module}\nassert 'torch' not in sys.modules, '{module}'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)
