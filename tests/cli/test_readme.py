"""The README's read-only commands run as written, and its Python snippet defines what it uses.

A user copies these first; a glob that sweeps in the wrong artifacts or a snippet that uses an
undefined name is the first thing they trip over. (The launch and generate lines are
exercised by tests/launch and tests/generate.)
"""

from __future__ import annotations

import ast
import builtins
import glob
import re
import shlex
from pathlib import Path

import pytest
from hpcodegen.cli.app import app, register_verbs
from typer.testing import CliRunner

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
register_verbs()


def _commands(verb: str) -> list[list[str]]:
    """``hpcodegen VERB ...`` lines of the bash blocks (continuations joined, comments cut)."""
    blocks = re.findall(r"```bash\n(.*?)```", README, re.S)
    text = "\n".join(blocks).replace("\\\n", " ")
    lines = [line.split("#", 1)[0].strip() for line in text.splitlines()]
    return [shlex.split(line)[1:] for line in lines if line.startswith(f"hpcodegen {verb} ")]


def _expand(args: list[str]) -> list[str]:
    """The shell's glob expansion, from the repo root."""
    out: list[str] = []
    for arg in args:
        hits = sorted(glob.glob(arg, root_dir=REPO)) if "*" in arg else []
        out.extend(str(REPO / h) for h in hits) if hits else out.append(_rooted(arg))
    return out


def _rooted(arg: str) -> str:
    return str(REPO / arg) if (REPO / arg).exists() and not arg.startswith("-") else arg


@pytest.mark.timeout(400)
@pytest.mark.parametrize("verb", ["verify", "inspect-plan"])
def test_readme_commands_exit_0(verb: str, tmp_path: Path, monkeypatch) -> None:
    commands = _commands(verb)
    assert commands, f"no `hpcodegen {verb}` line found in README.md"
    monkeypatch.chdir(tmp_path)  # --junit verify.xml lands here
    for args in commands:
        result = CliRunner().invoke(app, _expand(args))
        assert result.exit_code == 0, (args, result.output[-2000:])


def test_readme_python_snippet_defines_every_name_it_uses() -> None:
    (snippet,) = re.findall(r"### In your own code\n\n```python\n(.*?)```", README, re.S)
    _check_defined(ast.parse(snippet).body, set(dir(builtins)))


def _check_defined(body: list[ast.stmt], defined: set[str]) -> None:
    """Statements in order: each uses only names defined before it; a loop's target and
    the assignments of a block's body count from where they are made."""
    for node in body:
        block = node.body if isinstance(node, (ast.For, ast.With, ast.If, ast.While)) else None
        heads = [node.iter, node.target] if isinstance(node, ast.For) else (
            [i.context_expr for i in node.items] if isinstance(node, ast.With) else
            [node.test] if isinstance(node, (ast.If, ast.While)) else [node])
        for head in heads:
            used = {n.id for n in ast.walk(head) if isinstance(n, ast.Name)
                    and isinstance(n.ctx, ast.Load)}
            assert used <= defined, f"line {node.lineno} uses undefined {sorted(used - defined)}"
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            defined |= {(a.asname or a.name).split(".")[0] for a in node.names}
        targets = [node.target] if isinstance(node, (ast.For, ast.AugAssign, ast.AnnAssign)) \
            else getattr(node, "targets", [])
        for target in targets:
            defined |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
        if block is not None:
            _check_defined(block, defined)
            _check_defined(getattr(node, "orelse", []), defined)


def test_ci_md_offline_step_passes_on_its_documented_layout(tmp_path: Path) -> None:
    """docs/ci.md's layout (artifact dirs + a `<name>.model` mapping) passes its own --strict
    step: a mapping file inside the artifact dir would be an unrecorded-file warning."""
    import os
    import shutil
    import subprocess
    import sys

    ci = (REPO / "docs" / "ci.md").read_text()
    (step,) = [b for b in re.findall(r"run: \|\n(.*?)\n\s*- ", ci, re.S) if "--strict" in b]
    shutil.copytree(REPO / "examples" / "llama_tp2", tmp_path / "artifacts" / "llama_tp2")
    for name in re.findall(r'cat "\$dir([^"]*)"', ci):  # the mapping file, where ci.md reads it
        (tmp_path / "artifacts" / f"llama_tp2{name}").write_text("llama")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    run = subprocess.run(["bash", "-ec", step], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert (tmp_path / "verify-offline.xml").is_file()
