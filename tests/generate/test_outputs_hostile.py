"""``generate -o`` never destroys what is not the artifact's (issue 23): a model's config,
weights and notes beside an artifact, a symlinked OUT, someone else's staging dir."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hpcodegen.cli.app import app, register_verbs
from typer.testing import CliRunner

from hpcodegen.artifact.bundle import (
    BundleTargetError,
    recover_bundle,
    render_bundle,
    write_bundle,
)
from hpcodegen.artifact.load import META_NAME

register_verbs()


def _bundle(text: str) -> dict[str, bytes]:
    files = {"modeling_x_gen_npu.py": text.encode(), "__init__.py": b'"""x"""\n'}
    return render_bundle(files, {"modeling_x_gen_npu.py": "modeling", "__init__.py": "init"},
                         {"signature": "abc"})


def _generate(llama_dir: Path, out: Path, *extra: str):
    return CliRunner().invoke(app, ["generate", "--model", str(llama_dir), "--tp", "2",
                                    "-o", str(out), "--json", *extra])


def test_an_artifact_beside_the_models_files_is_not_replaced(tmp_path, llama_dir) -> None:
    """launch's default --model-dir is the artifact dir: config, weights and notes there
    are the user's; regenerating refuses (exit 2) and every byte stays."""
    out = tmp_path / "art"
    assert _generate(llama_dir, out).exit_code == 0
    (out / "config.json").write_text((llama_dir / "config.json").read_text())
    (out / "model.safetensors").write_bytes(b"weights")
    (out / "notes").mkdir()
    (out / "notes" / "todo.md").write_text("mine")
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    res = _generate(llama_dir, out, "--sp")
    doc = json.loads(res.stdout)
    assert res.exit_code == 2 and doc["findings"][0]["code"] == "generate.out_not_bundle"
    assert "config.json, model.safetensors, notes" in doc["findings"][0]["message"]
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["art"]


def test_a_file_shadowing_an_artifact_name_is_not_deleted(tmp_path) -> None:
    """Only regular files count as the bundle's own: a link or a directory named like one
    (``__init__.py/``) is someone else's."""
    target = tmp_path / "art"
    write_bundle(target, _bundle("a = 1\n"))
    os.remove(target / "__init__.py")
    (target / "__init__.py").mkdir()
    (target / "__init__.py" / "keep").write_text("mine")
    with pytest.raises(BundleTargetError, match=r"__init__\.py"):
        write_bundle(target, _bundle("b = 2\n"))
    assert (target / "__init__.py" / "keep").read_text() == "mine"


def test_a_symlinked_out_is_followed_and_kept(tmp_path) -> None:
    """OUT a link to a bundle dir: the bundle is written where it points, the link stays a
    link to it (nothing stale behind it)."""
    real = tmp_path / "v1"
    write_bundle(real, _bundle("a = 1\n"))
    link = tmp_path / "latest"
    link.symlink_to(real, target_is_directory=True)
    rendered = _bundle("b = 2\n")
    write_bundle(link, rendered)
    assert link.is_symlink() and Path(os.readlink(link)) == real
    assert {p.name: p.read_bytes() for p in real.iterdir()} == rendered
    assert (link / META_NAME).read_bytes() == rendered[META_NAME]


def test_cleanup_leaves_staging_dirs_it_did_not_make(tmp_path) -> None:
    """A live writer's staging dir and a foreign dir with the same prefix survive a
    write; a dead writer's is removed."""
    import socket
    import subprocess
    import sys

    target = tmp_path / "art"
    host = socket.gethostname()
    live = tmp_path / f".hpcodegen_tmp_art_abc.{host}-{os.getppid()}"
    foreign = tmp_path / ".hpcodegen_tmp_art_mine"
    dead_pid = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True).stdout.strip()
    dead = tmp_path / f".hpcodegen_tmp_art_xyz.{host}-{dead_pid}"
    for path in (live, foreign, dead):
        path.mkdir()
        (path / "keep").write_text("x")
    recover_bundle(target)
    write_bundle(target, _bundle("a = 1\n"))
    assert live.is_dir() and foreign.is_dir() and not dead.exists()
