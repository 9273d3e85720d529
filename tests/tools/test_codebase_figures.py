"""tools/codebase_figures.py counts each figure by its stated rule, on a tree built here.

Each figure gets a case that counts and a case that must not (a typed meta parameter, a
private name inside its own package, a docstring that spells a placement, a copy under six
lines), so a rule that drifts fails here.
"""

import importlib.util
import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[2] / "tools" / "codebase_figures.py"
_spec = importlib.util.spec_from_file_location("codebase_figures", TOOL)
figures_mod = importlib.util.module_from_spec(_spec)
sys.modules["codebase_figures"] = figures_mod
_spec.loader.exec_module(figures_mod)

BLOCK = "\n".join(f"    total = total + {i} * scale" for i in range(7))


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_each_figure_counts_by_its_rule(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "hpcodegen/__init__.py": "",
        "hpcodegen/placement.py": 'CODEC = ["S(0)", "R"]\n',  # the codec: not counted
        "hpcodegen/inspect/__init__.py": "",
        "hpcodegen/inspect/volume.py": "def _targets(): ...\ndef _own(): ...\n",
        "hpcodegen/inspect/run.py": "from hpcodegen.inspect.volume import _own\n",
        "hpcodegen/generate/__init__.py": "",
        "hpcodegen/generate/a.py": (
            '"""Docstring naming "S(0)" is prose."""\n'
            "from typing import Any, Mapping\n"
            "from hpcodegen.inspect.volume import _targets\n"
            "from hpcodegen.inspect import volume\n"
            "def raw(meta: Mapping[str, Any]) -> None:\n    volume._own()\n"
            "def untyped(meta): ...\n"
            "def named(source_meta: dict[str, Any]) -> None: ...\n"
            "def typed(meta: 'LoadedMeta') -> None: ...\n"
            "def path(meta_path: str) -> None: ...\n"
            "PLACES = ['S(1)', 'Replicate', 'P(sum)', 'SS(0, 2)', 'Rows']\n"
            "def head(d):\n    return f'S({d})'\n"
            f"def one(total, scale):\n{BLOCK}\n    return total\n"),
        "hpcodegen/generate/b.py": (
            f"def two(total, scale):\n{BLOCK}\n    return total\n"
            "def short(total, scale):\n" + "\n".join(BLOCK.splitlines()[:5]) + "\n"),
        "cli/app.py": "def _register(): ...\n",
        "hpcodegen/families/probe.py": "from cli.app import _register\n",
        "tests/test_x.py": "from hpcodegen.inspect.volume import _targets\n",
    })
    got = figures_mod.measure(root)
    assert [f.split()[1] for f in got.raw_meta_fns] == ["raw", "untyped", "named"]
    assert got.private_cross_imports == [
        "hpcodegen.families.probe -> cli.app._register",
        "hpcodegen.generate.a -> hpcodegen.inspect.volume._own",
        "hpcodegen.generate.a -> hpcodegen.inspect.volume._targets",
    ]
    assert got.generate_top_modules == ["a.py", "b.py"]
    assert got.dup_blocks_6 == ["hpcodegen/generate/a.py:15-22", "hpcodegen/generate/b.py:2-9"]
    assert sorted(s.split(" ", 1)[1] for s in got.placement_literals) == sorted(
        ["'S(1)'", "'Replicate'", "'P(sum)'", "'SS(0, 2)'", "f'S('..."])
    assert got.line() == ("figures: raw_meta_fns=3 private_cross_imports=3 "
                          "generate_top_modules=2 dup_blocks_6=2 placement_literals=5")


def test_the_script_prints_one_figures_line_for_this_repo() -> None:
    out = subprocess.run([sys.executable, str(TOOL)], capture_output=True, text=True,
                         check=True, timeout=300).stdout
    assert out.startswith("figures: raw_meta_fns=")
    assert len(out.strip().splitlines()) == 1
