"""Every third-party module the package imports is a declared dependency (core or an extra).

A module imported but not declared works in the dev venv (something else pulled it in) and
crashes for a user: the CLI once imported ``click``, which typer stopped depending on in
0.26. The imports are read with ``ast`` from ``hpcodegen/`` and ``cli/``; each top-level
name is mapped to its distribution through the dev venv's installed metadata.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("hpcodegen", "cli")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared() -> dict[str, str]:
    """Distribution name -> where pyproject.toml declares it (``core`` or the extra)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    groups = {"core": project["dependencies"], **project["optional-dependencies"]}
    return {_norm(re.split(r"[\s<>=!~;\[]", req, maxsplit=1)[0]): group
            for group, reqs in groups.items() if group != "dev" for req in reqs}


def _third_party_imports() -> dict[str, list[str]]:
    """Top-level imported name -> the files importing it (stdlib and relative imports left out)."""
    found: dict[str, list[str]] = {}
    for src in SOURCES:
        for path in sorted((ROOT / src).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for top in {n.split(".")[0] for n in names}:
                    if top not in sys.stdlib_module_names and top != "hpcodegen":
                        found.setdefault(top, []).append(str(path.relative_to(ROOT)))
    return found


def test_every_imported_distribution_is_declared() -> None:
    declared = _declared()
    dists = importlib.metadata.packages_distributions()
    undeclared = {}
    for top, files in _third_party_imports().items():
        names = {_norm(d) for d in dists.get(top, [top])}
        if not names & set(declared):
            undeclared[top] = files
    assert not undeclared, f"imported but not declared in pyproject.toml: {undeclared}"


def test_the_scan_sees_the_runtime_imports() -> None:
    """The scan is not vacuous: it finds the extras' modules and maps them to their extra."""
    declared = _declared()
    imports = _third_party_imports()
    assert {"torch", "transformers", "yaml", "typer", "jsonschema"} <= set(imports)
    assert declared["torch"] == "runtime" and declared["typer"] == "core"
