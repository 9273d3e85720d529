"""docs/ci.md is usable as written: every pin is a commit of this repository's history (the
page's convention: full SHAs, hpcodegen has no release tags), the hooks its pre-commit
example names exist at that commit, and its GitHub Actions job, the offline checks, the
model checks and the drift step, runs as written against the pinned commit's code."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CI_DOC = ROOT / "docs" / "ci.md"
#: `hpcodegen[extra] @ git+URL@REF` and pre-commit's `rev: REF`
_PIN = re.compile(r"hpcodegen(?:\[[a-z,]+\])? @ git\+\S+?@([^\s\"'\\]+)|^\s*rev:\s*(\S+)", re.M)
_SHA = re.compile(r"[0-9a-f]{40}")


def _git(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, timeout=300,
                          **kw)


def _require_history() -> None:
    if shutil.which("git") is None or _git("rev-parse", "HEAD").returncode != 0:
        pytest.skip("not a git checkout: the pins are checked where the history is")
    if _git("rev-parse", "--is-shallow-repository").stdout.strip() == b"true":
        pytest.skip("a shallow clone lacks the history the pins name")


def _yaml_blocks(text: str) -> list[str]:
    return re.findall(r"```yaml\n(.*?)```", text, re.S)


def pins(text: str) -> list[str]:
    """Every ref a page pins hpcodegen to, in order."""
    return [a or b for a, b in _PIN.findall(text)]


def _job() -> dict:
    (block,) = [b for b in _yaml_blocks(CI_DOC.read_text()) if "jobs:" in b]
    return yaml.safe_load(block)["jobs"]["verify"]


def test_every_pin_is_a_full_sha_of_this_history() -> None:
    _require_history()
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    found = {page.name: pins(page.read_text()) for page in pages}
    assert len(found["ci.md"]) >= 4  # two pip installs, two pre-commit repos
    for page, refs in found.items():
        for ref in refs:
            assert _SHA.fullmatch(ref), f"{page} pins {ref!r}: pin a full commit SHA"
            assert _git("cat-file", "-e", f"{ref}^{{commit}}").returncode == 0, (
                f"{page} pins {ref}, which is no commit of this repository")
            assert _git("merge-base", "--is-ancestor", ref, "HEAD").returncode == 0, (
                f"{page} pins {ref}, which is not in this branch's history (rebased or "
                "squashed away?): pin a commit of the history")
    assert len(set(found["ci.md"])) == 1, "one pin per page: the job and pre-commit agree"


def test_pinned_hooks_exist_at_the_pinned_commit() -> None:
    _require_history()
    (config,) = [yaml.safe_load(b) for b in _yaml_blocks(CI_DOC.read_text())
                 if "repos:" in b]
    for repo in config["repos"]:
        shown = _git("show", f"{repo['rev']}:.pre-commit-hooks.yaml", text=True)
        assert shown.returncode == 0, shown.stderr
        published = {hook["id"]: hook for hook in yaml.safe_load(shown.stdout)}
        for hook in repo["hooks"]:
            assert hook["id"] in published, (repo["rev"], hook["id"])
            assert published[hook["id"]]["entry"].startswith("hpcodegen verify")


def _pinned_tree(ref: str, dest: Path) -> Path:
    """The pinned commit's package as an install lays it out (``cli/`` and ``schemas/``
    become ``hpcodegen.cli`` and ``hpcodegen.schemas``, as pyproject's package-dir says)."""
    archive = dest / "src.tar"
    with open(archive, "wb") as out:
        assert subprocess.run(["git", "-C", str(ROOT), "archive", ref], stdout=out,
                              timeout=300).returncode == 0
    src = dest / "src"
    with tarfile.open(archive) as tar:  # our own history: trusted, but filtered where we can
        try:
            tar.extractall(src, filter="data")
        except TypeError:  # a Python without extraction filters
            tar.extractall(src)
    pkg = dest / "pkg"
    shutil.copytree(src / "hpcodegen", pkg / "hpcodegen")
    shutil.copytree(src / "cli", pkg / "hpcodegen" / "cli")
    shutil.copytree(src / "schemas", pkg / "hpcodegen" / "schemas")
    return pkg


def _shim(pkg: Path, bindir: Path) -> None:
    """``hpcodegen`` on PATH, running the pinned commit's code (what the pip install of the
    pinned commit gives the job)."""
    bindir.mkdir()
    exe = bindir / "hpcodegen"
    exe.write_text("#!/bin/sh\n"
                   f'PYTHONPATH="{pkg}" exec "{sys.executable}" -c '
                   '"from hpcodegen.cli.app import main; main()" "$@"\n')
    exe.chmod(0o755)


def _run_step(script: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """A step's ``run`` as GitHub's default shell on Linux runs it: ``bash -e``."""
    return subprocess.run(["bash", "-e", "-c", script], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.slow
def test_the_actions_job_runs_as_written_at_the_pinned_commit(tmp_path: Path) -> None:
    _require_history()
    steps = _job()["steps"]
    runs = [s for s in steps if "run" in s]
    installs = [s for s in runs if "pip install" in s["run"]]
    assert len(installs) == 2
    (ref,) = set(pins("\n".join(s["run"] for s in installs)))
    pkg = _pinned_tree(ref, tmp_path)
    _shim(pkg, tmp_path / "bin")
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}",
           "NO_COLOR": "1", "COLUMNS": "80"}
    env.pop("HPCODEGEN_DEBUG", None)
    where = subprocess.run([sys.executable, "-c", "import hpcodegen; print(hpcodegen.__file__)"],
                           env={**env, "PYTHONPATH": str(pkg)}, capture_output=True, text=True,
                           timeout=300, cwd=tmp_path)
    assert where.stdout.startswith(str(pkg)), where  # the pinned code runs, not the checkout's
    # the layout the page describes, generated as a user would with the pinned commit
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "examples" / "configs" / "llama", repo / "configs" / "llama")
    (repo / "artifacts").mkdir()
    made = _run_step("hpcodegen generate --model configs/llama --tp 2 --sp "
                     "-o artifacts/llama_tp2 -q", repo, env)  # one is enough: each step loops
    assert made.returncode == 0, made.stderr
    (repo / "artifacts" / "llama_tp2.model").write_text("llama")
    for step in runs:
        if step in installs:
            continue
        done = _run_step(step["run"], repo, env)
        assert done.returncode == 0, (step["name"], done.stdout, done.stderr)
    assert (repo / "verify-offline.xml").is_file()
    assert (repo / "verify-llama_tp2.xml").is_file()
    # the drift step fails, naming the file, once an artifact drifts
    (drift,) = [s for s in runs if "generate --check" in s["run"]]
    modeling = next((repo / "artifacts" / "llama_tp2").glob("modeling_*_gen_npu.py"))
    modeling.write_text(modeling.read_text() + "# edited\n")
    done = _run_step(drift["run"], repo, env)
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert f"artifacts/llama_tp2/{modeling.name}: bytes differ" in done.stdout
