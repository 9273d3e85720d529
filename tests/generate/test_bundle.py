"""Atomic, reproducible bundles: same inputs -> same bytes; a failed or killed write leaves
the previous bundle intact; ``--check`` names each drifted file."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from hpcodegen.cli.app import app, register_verbs
from typer.testing import CliRunner

from hpcodegen.artifact.bundle import (
    BundleTargetError,
    diff_bundle,
    recover_bundle,
    render_bundle,
    write_bundle,
)
from hpcodegen.artifact.digest import bytes_digest
from hpcodegen.artifact.load import META_NAME

register_verbs()


def _bundle(text: str) -> dict[str, bytes]:
    files = {"modeling_x_gen_npu.py": text.encode(), "__init__.py": b'"""x"""\n'}
    roles = {"modeling_x_gen_npu.py": "modeling", "__init__.py": "init"}
    return render_bundle(files, roles, {"codegen_version": "0.1.1", "signature": "abc"})


def _snapshot(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


def test_render_hashes_outputs_and_writes_meta_last(tmp_path: Path) -> None:
    rendered = _bundle("a = 1\n")
    meta = json.loads(rendered[META_NAME])
    assert meta["outputs"]["modeling"] == bytes_digest(b"a = 1\n")
    assert META_NAME not in meta["outputs"] and "init" in meta["outputs"]
    assert rendered[META_NAME].endswith(b"}\n")
    seen: list[list[str]] = []
    write_bundle(tmp_path / "art", rendered, _after_stage=lambda s: seen.append(
        sorted(p.name for p in s.iterdir())))
    assert seen == [sorted(rendered)]
    assert _snapshot(tmp_path / "art") == rendered


@pytest.mark.parametrize("exc", [RuntimeError("disk full"), KeyboardInterrupt()])
def test_failure_after_staging_keeps_previous_bundle(tmp_path: Path, exc: BaseException) -> None:
    target = tmp_path / "art"
    write_bundle(target, _bundle("old = 1\n"))
    before = _snapshot(target)

    def fail(stage: Path) -> None:
        raise exc

    with pytest.raises(type(exc)):
        write_bundle(target, _bundle("new = 2\n"), _after_stage=fail)
    assert _snapshot(target) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["art"]  # staging removed


@pytest.mark.timeout(400)
def test_kill_after_staging_keeps_previous_bundle(tmp_path: Path) -> None:
    target = tmp_path / "art"
    write_bundle(target, _bundle("old = 1\n"))
    before = _snapshot(target)
    script = (
        "import os, signal, sys\n"
        "from pathlib import Path\n"
        "from hpcodegen.artifact.bundle import render_bundle, write_bundle\n"
        "r = render_bundle({'m.py': b'new = 2\\n'}, {'m.py': 'modeling'}, {'signature': 'x'})\n"
        "write_bundle(Path(sys.argv[1]), r,\n"
        "             _after_stage=lambda s: os.kill(os.getpid(), signal.SIGKILL))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script, str(target)], timeout=300)
    assert proc.returncode == -signal.SIGKILL
    assert _snapshot(target) == before
    assert len(list(tmp_path.glob(".hpcodegen_tmp_art_*"))) == 1  # the killed writer's stage
    write_bundle(target, _bundle("next = 3\n"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["art"]  # stale stage cleaned


def test_recover_moves_aside_bundle_back(tmp_path: Path) -> None:
    target = tmp_path / "art"
    write_bundle(target, _bundle("old = 1\n"))
    before = _snapshot(target)
    os.rename(target, tmp_path / ".hpcodegen_old_art_x")  # killed between the two renames
    recover_bundle(target)
    assert _snapshot(target) == before


def test_replacing_drops_obsolete_files(tmp_path: Path) -> None:
    """A file the previous bundle recorded (and its bytecode) goes; one it did not record
    is not the bundle's to delete: the write is refused and it stays."""
    target = tmp_path / "art"
    files = {"modeling_x_gen_npu.py": b"a = 1\n", "configuration_x.py": b"c = 1\n"}
    write_bundle(target, render_bundle(files, {"modeling_x_gen_npu.py": "modeling"}, {}))
    (target / "__pycache__").mkdir()
    (target / "__pycache__" / "modeling_x_gen_npu.cpython-311.pyc").write_bytes(b"\0")
    rendered = _bundle("b = 2\n")
    assert "configuration_x.py: not part of the regenerated bundle" in diff_bundle(target,
                                                                                  rendered)
    write_bundle(target, rendered)
    assert _snapshot(target) == rendered
    assert oct(target.stat().st_mode & 0o777) != oct(0o700)
    (target / "stale.py").write_text("x")
    with pytest.raises(BundleTargetError, match=r"stale\.py"):
        write_bundle(target, _bundle("c = 3\n"))
    assert (target / "stale.py").read_text() == "x"


def test_rejects_non_plain_names() -> None:
    with pytest.raises(ValueError, match="plain names"):
        render_bundle({"../x.py": b""}, {}, {})


@pytest.mark.slow
def test_cli_generate_reproducible_and_check(tmp_path: Path, llama_dir: Path) -> None:
    runner = CliRunner()
    a, b = tmp_path / "a", tmp_path / "b"
    for out in (a, b):
        res = runner.invoke(app, ["generate", "--model", str(llama_dir), "--tp", "2", "--sp",
                                  "-o", str(out)])
        assert res.exit_code == 0, res.output
    assert _snapshot(a) == _snapshot(b)
    res = runner.invoke(app, ["generate", "--model", str(llama_dir), "--tp", "2", "--sp",
                              "-o", str(a), "--check"])
    assert res.exit_code == 0 and "up to date" in res.output
    modeling = next(a.glob("modeling_*.py"))
    modeling.write_text(modeling.read_text() + "# drift\n")
    os.remove(a / "__init__.py")
    res = runner.invoke(app, ["generate", "--model", str(llama_dir), "--tp", "2", "--sp",
                              "-o", str(a), "--check"])
    assert res.exit_code == 1
    assert f"{modeling.name}: bytes differ from the regenerated bundle" in res.output
    assert "__init__.py: missing on disk" in res.output
    shutil.rmtree(b)
    res = runner.invoke(app, ["generate", "--model", str(llama_dir), "--tp", "2",
                              "-o", str(a)])  # overwrite in place, without --sp
    assert res.exit_code == 0
    assert json.loads((a / META_NAME).read_text())["parallel_dims"]["sequence_parallel"] is False


def test_refuses_to_replace_a_non_bundle_directory(tmp_path: Path, llama_dir: Path) -> None:
    target = tmp_path / "project"
    target.mkdir()
    (target / "precious.txt").write_text("keep")
    with pytest.raises(BundleTargetError, match="non-empty directory"):
        write_bundle(target, _bundle("a = 1\n"))
    assert (target / "precious.txt").read_text() == "keep"
    res = CliRunner().invoke(app, ["generate", "--model", str(llama_dir), "--tp", "2",
                                   "-o", str(target)])
    assert res.exit_code == 2
    assert "refusing to replace it" in res.output
    assert (target / "precious.txt").read_text() == "keep"



def test_unusable_out_is_refused_before_the_build(tmp_path: Path, llama_dir: Path,
                                                  monkeypatch) -> None:
    """-o a file or under a file: exit 2 naming -o, before the model is built."""
    import hpcodegen.generate.api as gen_api

    afile = tmp_path / "afile"
    afile.write_text("x")
    monkeypatch.setattr(gen_api, "build_bundle", lambda *a: pytest.fail("built anyway"))
    for out, needle in ((afile, f"-o: {afile} exists and is not a directory"),
                        (afile / "sub" / "x", f"-o: {afile} is a file: it cannot hold x")):
        res = CliRunner().invoke(app, ["generate", "--model", str(llama_dir), "--tp", "2",
                                       "-o", str(out)])
        assert res.exit_code == 2 and needle in res.output, res.output


def test_write_failure_is_a_usage_error_naming_out(tmp_path: Path, monkeypatch) -> None:
    """An OSError while publishing (read-only fs, permissions) is exit 2, not 'internal error'."""
    import hpcodegen.generate.publish.publish as gen_publish
    from hpcodegen.errors import UsageError

    def refuse(target, rendered):
        raise PermissionError(13, "Permission denied", str(target.parent))

    monkeypatch.setattr(gen_publish, "write_bundle", refuse)
    with pytest.raises(UsageError, match=r"-o: cannot write .*: Permission denied"):
        gen_publish.publish(tmp_path / "out", {"codegen_meta.json": b"{}"})
