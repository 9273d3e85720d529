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
                          text=True, timeout=300, cwd=ROOT)


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
                          text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 2 and "hpcodegen[hub]" in proc.stdout + proc.stderr


#: the gate verbs under a meta-path finder that refuses the runtime extra's modules and
#: every submodule of them (as a core-only install: typer, rich and jsonschema alone)
CORE_ONLY = """
import importlib.abc
import sys

HEAVY = ("yaml", "torch", "transformers", "safetensors", "libcst")


class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HEAVY:
            raise ModuleNotFoundError(f"No module named {name!r} (core-only install)",
                                      name=name)
        return None


sys.meta_path.insert(0, Refuse())
from hpcodegen.cli.app import main
sys.argv = ["hpcodegen", *sys.argv[1:]]
try:
    main()
finally:
    loaded = sorted(n for n in sys.modules if n.split(".")[0] in HEAVY)
    print("LOADED", loaded, file=sys.stderr)
"""


def _core_only(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", CORE_ONLY, *args], capture_output=True,
                          text=True, timeout=300, cwd=ROOT)


def test_gate_verbs_need_only_the_core_for_a_rule_file_family(mpt_tp2: Path
                                                               ) -> None:
    """verify and inspect-plan (the tp divisibility checks included, which once read the
    generator's YAML rules) run on a rule-file family's artifact with yaml, torch,
    transformers, safetensors and libcst unimportable, and load none of them."""
    art = str(mpt_tp2)
    for args in (["verify", art], ["verify", art, "--json"], ["inspect-plan", art],
                 ["inspect-plan", art, "--mesh", "tp=4"], ["inspect-plan", art, "--json"],
                 ["verify", art, "--hf-config", str(ROOT / "tests/fixtures/families/mpt"),
                  "--skip", "model"]):
        proc = _core_only(*args)
        assert proc.returncode == 0, (args, proc.stdout[-2000:], proc.stderr[-2000:])
        assert "Traceback" not in proc.stderr and "LOADED []" in proc.stderr, (args,
                                                                               proc.stderr)


def test_gate_verbs_need_only_the_core_for_every_example() -> None:
    examples = sorted(str(p) for p in (ROOT / "examples").iterdir()
                      if (p / "codegen_meta.json").is_file())
    assert len(examples) >= 5
    proc = _core_only("verify", *examples)
    assert proc.returncode == 0 and "LOADED []" in proc.stderr, proc.stderr[-2000:]
    for example in examples:
        for args in (["inspect-plan", example], ["inspect-plan", example, "--mesh", "tp=4"]):
            proc = _core_only(*args)
            assert proc.returncode in (0, 1), (args, proc.stderr[-2000:])
            assert "Traceback" not in proc.stderr and "internal error" not in proc.stdout
            assert "LOADED []" in proc.stderr, (args, proc.stderr[-2000:])
