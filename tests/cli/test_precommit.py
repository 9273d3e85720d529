"""The published pre-commit hooks see every file of an artifact dir and verify its artifact."""

from __future__ import annotations

import io
import json
import re
import shutil
from pathlib import Path

import yaml

from hpcodegen.verify import artifacts_of_changed, run_verify

ROOT = Path(__file__).resolve().parents[2]
HOOKS = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())


def test_hook_pattern_matches_every_file_of_every_artifact() -> None:
    artifacts = [p.parent for p in (ROOT / "examples").rglob("codegen_meta.json")]
    assert artifacts
    for hook in HOOKS:
        pattern = re.compile(hook.get("files", ""))
        assert "--changed-files" in hook["entry"]
        for art in artifacts:
            for path in art.iterdir():
                rel = path.relative_to(ROOT).as_posix()
                assert pattern.search(rel), (hook["id"], rel)
        assert pattern.search("examples/llama_tp2/notes.txt")  # a file added to the dir


def test_hook_environment_installs_no_torch() -> None:
    for hook in HOOKS:
        extra = " ".join(hook.get("additional_dependencies", []))
        assert "torch" not in extra and "runtime" not in extra


def _copy(tmp_path: Path) -> Path:
    art = tmp_path / "art"
    shutil.copytree(ROOT / "examples" / "llama_tp2", art)
    return art


def test_changed_init_fails_its_artifact(tmp_path: Path) -> None:
    art = _copy(tmp_path)
    (art / "__init__.py").write_text("import os\n")
    out = io.StringIO()
    code = run_verify([str(art / "__init__.py"), str(tmp_path / "README.md")],
                      changed_files=True, stdout=out, stderr=io.StringIO())
    assert code == 1 and "outputs" in out.getvalue()


def test_changed_files_outside_artifacts_pass_silently(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("x = 1\n")
    out = io.StringIO()
    assert run_verify([str(tmp_path / "train.py")], changed_files=True, stdout=out) == 0
    assert out.getvalue() == ""
    out = io.StringIO()
    assert run_verify([str(tmp_path / "train.py")], changed_files=True, stdout=out,
                      output="json") == 0
    assert json.loads(out.getvalue())["artifacts"] == []


def test_changed_files_map_to_each_artifact_once(tmp_path: Path) -> None:
    art = _copy(tmp_path)
    (art / "extra.txt").write_text("x")
    files = [str(art / "extra.txt"), str(art / "codegen_meta.json"), str(art / "gone.py"),
             str(tmp_path / "other.py")]
    assert artifacts_of_changed(files) == [str(art)]
    assert run_verify(files, changed_files=True, stdout=io.StringIO(), strict=True) == 1
