"""The core install is the gate; a verb needing a missing extra names it (exit 2)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "llama_tp2"
CONFIG = ROOT / "examples" / "configs" / "llama"

#: runs the CLI with the runtime extra's modules unimportable (as in a core install)
BLOCKED = """
import sys
for name in ("torch", "transformers", "libcst", "yaml", "safetensors", "psutil"):
    sys.modules[name] = None
from hpcodegen.cli.app import main
sys.argv = ["hpcodegen", *sys.argv[1:]]
main()
"""


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", BLOCKED, *args], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)


@pytest.mark.parametrize("args", [
    ["generate", "--model", str(CONFIG), "--tp", "2", "-o", "/nonexistent/out"],
    ["launch", str(EXAMPLE), "--nproc", "2"],
    ["verify", str(EXAMPLE), "--hf-config", str(CONFIG)],
    ["inspect-plan", str(EXAMPLE), "--hf-config", str(CONFIG), "--batch", "1", "--seq", "8"],
])
def test_missing_runtime_extra_is_named(args: list[str]) -> None:
    proc = _run(*args)
    assert proc.returncode == 2, proc.stderr
    assert "hpcodegen[runtime]" in proc.stderr and "Traceback" not in proc.stderr


def test_core_verbs_work_without_the_runtime_extra() -> None:
    assert _run("verify", str(EXAMPLE)).returncode == 0
    assert _run("verify", str(EXAMPLE), "--hf-config", str(CONFIG), "--skip", "model"
                ).returncode == 0
    assert _run("inspect-plan", str(EXAMPLE)).returncode == 0
    schema = _run("schema")
    assert schema.returncode == 0 and json.loads(schema.stdout)["type"] == "object"


def test_hub_id_without_huggingface_hub_names_the_hub_extra() -> None:
    code = BLOCKED.replace('"psutil")', '"psutil", "huggingface_hub")')
    proc = subprocess.run([sys.executable, "-c", code, "verify", str(EXAMPLE), "--hf-config",
                           "some-org/some-model", "--skip", "model"], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 2 and "hpcodegen[hub]" in proc.stdout + proc.stderr
