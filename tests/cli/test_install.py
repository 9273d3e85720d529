"""The wheel as a user installs it: core only (no torch), the typer floor, LICENSE, hooks.

One wheel build and one fresh venv (``--without-pip``; the dev venv's pip installs into it)
serve every test here, ~25 s in all. The venv gets the *lowest* typer pyproject allows, so
the floor is exercised against today's click.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "llama_tp2"
CONFIG = ROOT / "examples" / "configs" / "llama"
PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]


def _typer_floor() -> str:
    text = (ROOT / "pyproject.toml").read_text()
    match = re.search(r'"typer>=([0-9.]+)"', text)
    assert match, "pyproject.toml pins no typer floor"
    return match[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # build from a copy: no build/ left in the checkout, no stale build/lib in the wheel
    src = tmp_path_factory.mktemp("src") / "hpcodegen"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".venv", ".git", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", "out"))
    subprocess.run([*PIP, "wheel", "--no-deps", "-w", str(out), str(src)], check=True,
                   timeout=300, capture_output=True)
    (path,) = out.glob("hpcodegen-*.whl")
    return path


@pytest.fixture(scope="module")
def core_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    venv = tmp_path_factory.mktemp("core") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    floor = _typer_floor()
    pins = [ln for ln in (ROOT / "constraints.txt").read_text().splitlines()
            if not ln.startswith("typer==")]
    constraints = venv.parent / "constraints.txt"
    constraints.write_text("\n".join([*pins, f"typer=={floor}"]) + "\n")
    subprocess.run([*PIP, "--python", str(venv / "bin" / "python"), "install",
                    "-c", str(constraints), str(wheel)], check=True, timeout=300,
                   capture_output=True)
    return venv


def _installed(venv: Path) -> dict[str, str]:
    proc = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"),
                           "list", "--format", "json"], check=True, capture_output=True,
                          text=True, timeout=120)
    return {p["name"].lower(): p["version"] for p in json.loads(proc.stdout)}


def test_plain_install_resolves_no_torch(core_venv: Path) -> None:
    installed = _installed(core_venv)
    heavy = {"torch", "transformers", "libcst", "safetensors", "nvidia-cublas-cu12"}
    assert not heavy & set(installed), installed
    assert installed["typer"] == _typer_floor()


def test_gate_verbs_work_in_the_plain_install(core_venv: Path, tmp_path: Path) -> None:
    exe = str(core_venv / "bin" / "hpcodegen")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([exe, *args], capture_output=True, text=True, timeout=60,
                              cwd=tmp_path)

    for args in (["verify", str(EXAMPLE)], ["inspect-plan", str(EXAMPLE)], ["--help"],
                 ["verify", "--help"], ["verify", str(EXAMPLE), "--hf-config", str(CONFIG),
                                        "--skip", "model"]):
        proc = run(*args)
        assert proc.returncode == 0, (args, proc.stdout, proc.stderr)
        assert "Traceback" not in proc.stderr
    schema = run("schema")
    assert schema.returncode == 0 and json.loads(schema.stdout)["type"] == "object"
    missing = run("generate", "--model", str(CONFIG), "--tp", "2", "-o", str(tmp_path / "o"))
    assert missing.returncode == 2 and "hpcodegen[runtime]" in missing.stderr
    launch = run("launch", str(EXAMPLE), "--nproc", "2", "--json")
    assert launch.returncode == 2 and "hpcodegen[runtime]" in launch.stdout


def test_wheel_ships_every_package_file(wheel: Path) -> None:
    """Packages are found, not listed: every source and data file of the package is in the
    wheel (``cli/`` and ``schemas/`` under ``hpcodegen/``), and nothing at the top level
    but ``hpcodegen`` and its metadata."""
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = set()
    for src, dest in (("hpcodegen", "hpcodegen"), ("cli", "hpcodegen/cli"),
                      ("schemas", "hpcodegen/schemas")):
        for path in (ROOT / src).rglob("*"):
            if path.suffix in {".py", ".json", ".yaml"} and "__pycache__" not in path.parts:
                expected.add(f"{dest}/{path.relative_to(ROOT / src).as_posix()}")
    expected.discard("hpcodegen/generate/examples.py")  # dev-only (setup.py)
    assert "hpcodegen/checkpoint/export.py" in expected
    assert not expected - names, sorted(expected - names)
    tops = {n.split("/")[0] for n in names} - {"hpcodegen"}
    assert len(tops) == 1 and re.fullmatch(r"hpcodegen-[0-9.]+\.dist-info", tops.pop())


def test_wheel_has_license_and_no_dev_modules(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    licenses = [n for n in names if n.endswith("/LICENSE")]
    assert licenses, names
    text = zipfile.ZipFile(wheel).read(licenses[0]).decode()
    assert "Apache License" in text and "Version 2.0" in text
    assert "hpcodegen/generate/examples.py" not in names
    assert "hpcodegen/schemas/codegen_meta.schema.json" in names
    assert not [n for n in names if n.startswith("cli/")]  # installs as hpcodegen.cli
    metadata = zipfile.ZipFile(wheel).read(
        next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    core = [ln for ln in metadata.splitlines()
            if ln.startswith("Requires-Dist:") and "extra ==" not in ln]
    assert not [ln for ln in core if re.search(r"\b(torch|transformers)\b", ln)], core
