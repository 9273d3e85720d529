"""``hpcodegen.inspect`` is a package whose modules import one way, each on its own."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import hpcodegen

MODULES = ["options", "run", "render", "volume", "trace"]


@pytest.mark.parametrize("name", MODULES)
def test_each_module_imports_first_without_torch(name: str) -> None:
    """Importing any one module first works (no circle) and loads no torch or rich."""
    code = (f"import sys, hpcodegen.inspect.{name}\n"
            "heavy = [m for m in ('torch', 'transformers', 'rich') if m in sys.modules]\n"
            "assert not heavy, heavy\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


def test_old_root_modules_are_gone() -> None:
    root = Path(hpcodegen.__file__).parent
    for old in ("inspect_render.py", "inspect_volume.py", "trace.py", "inspect.py"):
        assert not (root / old).exists(), old


def test_imports_point_one_way() -> None:
    """options imports no sibling; render and volume never import run."""
    pkg = Path(hpcodegen.__file__).parent / "inspect"

    def imported(name: str) -> set[str]:
        tree = ast.parse((pkg / name).read_text())
        return {node.module for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and node.module}

    assert not {m for m in imported("options.py") if m.startswith("hpcodegen.inspect")}
    for name in ("render.py", "volume.py", "trace.py"):
        assert "hpcodegen.inspect.run" not in imported(name), name
