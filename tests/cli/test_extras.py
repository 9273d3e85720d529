"""The core install is the gate; a verb needing a missing extra names it (exit 2)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "llama_tp2"
CONFIG = ROOT / "examples" / "configs" / "llama"

#: the cases of one module-scoped batch: ``{case: argv}`` in, ``{case: run}`` out
Runs = dict[str, dict[str, Any]]

#: the runtime extra's modules made unimportable (as in a core install)
BLOCKED = """
import sys
HEAVY = ("torch", "transformers", "libcst", "yaml", "safetensors", "psutil")
for name in HEAVY:
    sys.modules[name] = None
"""

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
"""

#: after a prelude: each case through the console script's entry point (``inproc.run``), in
#: one fresh interpreter per batch instead of one per case (each pays ~1 s of imports);
#: a case that raises records its traceback as its stderr; ``loaded``: the HEAVY modules
#: in ``sys.modules`` after the case (cumulative: the first case to load one is named)
BATCH = """
import json
import traceback
sys.path.insert(0, sys.argv[1])
import inproc
results = {}
for case, argv in json.loads(sys.argv[2]).items():
    try:
        proc = inproc.run(*argv)
        run = {"code": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr}
    except BaseException:
        run = {"code": 1, "stdout": "", "stderr": traceback.format_exc()}
    run["loaded"] = sorted(n for n in sys.modules if n.split(".")[0] in HEAVY)
    results[case] = run
with open(sys.argv[3], "w") as out:
    json.dump(results, out)
"""


def _batch(prelude: str, cases: dict[str, list[str]], tmp: Path) -> Runs:
    """Every case of ``cases`` run after ``prelude`` in one fresh interpreter (cwd: the
    checkout): ``{case: {"code", "stdout", "stderr", "loaded"}}``."""
    result = tmp / "runs.json"
    proc = subprocess.run([sys.executable, "-c", prelude + BATCH, str(Path(__file__).parent),
                           json.dumps(cases), str(result)], capture_output=True, text=True,
                          timeout=600, cwd=ROOT)
    assert proc.returncode == 0 and result.is_file(), proc.stderr[-3000:]
    return json.loads(result.read_text())


MISSING_RUNTIME = {
    "generate": ["generate", "--model", str(CONFIG), "--tp", "2", "-o", "/nonexistent/out"],
    "launch": ["launch", str(EXAMPLE), "--nproc", "2"],
    "verify --hf-config": ["verify", str(EXAMPLE), "--hf-config", str(CONFIG)],
    "inspect-plan --hf-config": ["inspect-plan", str(EXAMPLE), "--hf-config", str(CONFIG),
                                 "--batch", "1", "--seq", "8"],
}
CORE_VERBS = {
    "verify": ["verify", str(EXAMPLE)],
    "verify --skip model": ["verify", str(EXAMPLE), "--hf-config", str(CONFIG), "--skip",
                            "model"],
    "inspect-plan": ["inspect-plan", str(EXAMPLE)],
    "schema": ["schema"],
}


@pytest.fixture(scope="module")
def blocked(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    """The runtime-extra cases and the core verbs, with the runtime extra blocked."""
    return _batch(BLOCKED, {**MISSING_RUNTIME, **CORE_VERBS},
                  tmp_path_factory.mktemp("blocked"))


@pytest.mark.parametrize("case", list(MISSING_RUNTIME))
def test_missing_runtime_extra_is_named(case: str, blocked: Runs) -> None:
    proc = blocked[case]
    assert proc["code"] == 2, (case, proc["stderr"])
    assert "hpcodegen[runtime]" in proc["stderr"] and "Traceback" not in proc["stderr"], case


def test_core_verbs_work_without_the_runtime_extra(blocked: Runs) -> None:
    for case in ("verify", "verify --skip model", "inspect-plan"):
        assert blocked[case]["code"] == 0, (case, blocked[case]["stderr"][-2000:])
    schema = blocked["schema"]
    assert schema["code"] == 0 and json.loads(schema["stdout"])["type"] == "object"


def test_hub_id_without_huggingface_hub_names_the_hub_extra(tmp_path: Path) -> None:
    prelude = BLOCKED.replace('"psutil")', '"psutil", "huggingface_hub")')
    assert '"huggingface_hub")' in prelude
    (proc,) = _batch(prelude, {"hub id": ["verify", str(EXAMPLE), "--hf-config",
                                          "some-org/some-model", "--skip", "model"]},
                     tmp_path).values()
    assert proc["code"] == 2 and "hpcodegen[hub]" in proc["stdout"] + proc["stderr"]


def _examples() -> list[str]:
    return sorted(str(p) for p in (ROOT / "examples").iterdir()
                  if (p / "codegen_meta.json").is_file())


@pytest.fixture(scope="module")
def core_only(mpt_tp2: Path, tmp_path_factory: pytest.TempPathFactory) -> Runs:
    """The gate verbs' cases of the two tests below, in one core-only interpreter."""
    art = str(mpt_tp2)
    cases = {" ".join(args): args for args in (
        ["verify", art], ["verify", art, "--json"], ["inspect-plan", art],
        ["inspect-plan", art, "--mesh", "tp=4"], ["inspect-plan", art, "--json"],
        ["verify", art, "--hf-config", str(ROOT / "tests/fixtures/families/mpt"), "--skip",
         "model"], ["verify", *_examples()])}
    for example in _examples():
        for args in (["inspect-plan", example], ["inspect-plan", example, "--mesh", "tp=4"]):
            cases[" ".join(args)] = args
    return _batch(CORE_ONLY, cases, tmp_path_factory.mktemp("core_only"))


def test_gate_verbs_need_only_the_core_for_a_rule_file_family(mpt_tp2: Path, core_only: Runs
                                                               ) -> None:
    """verify and inspect-plan (the tp divisibility checks included, which once read the
    generator's YAML rules) run on a rule-file family's artifact with yaml, torch,
    transformers, safetensors and libcst unimportable, and load none of them."""
    art = str(mpt_tp2)
    for args in (["verify", art], ["verify", art, "--json"], ["inspect-plan", art],
                 ["inspect-plan", art, "--mesh", "tp=4"], ["inspect-plan", art, "--json"],
                 ["verify", art, "--hf-config", str(ROOT / "tests/fixtures/families/mpt"),
                  "--skip", "model"]):
        proc = core_only[" ".join(args)]
        assert proc["code"] == 0, (args, proc["stdout"][-2000:], proc["stderr"][-2000:])
        assert "Traceback" not in proc["stderr"] and proc["loaded"] == [], (args, proc)


def test_gate_verbs_need_only_the_core_for_every_example(core_only: Runs) -> None:
    examples = _examples()
    assert len(examples) >= 5
    proc = core_only[" ".join(["verify", *examples])]
    assert proc["code"] == 0 and proc["loaded"] == [], proc["stderr"][-2000:]
    for example in examples:
        for args in (["inspect-plan", example], ["inspect-plan", example, "--mesh", "tp=4"]):
            proc = core_only[" ".join(args)]
            assert proc["code"] in (0, 1), (args, proc["stderr"][-2000:])
            assert "Traceback" not in proc["stderr"] and "internal error" not in proc["stdout"]
            assert proc["loaded"] == [], (args, proc["stderr"][-2000:])
