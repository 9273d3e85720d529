"""Hand-edited metas that installed and ran wrong now fail the gate (issue 23): verify
``--strict --hf-config`` and launch refuse them before any rank starts; a recipe value
generate accepts gives a meta its own verify accepts (or generate refuses it)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hpcodegen.artifact.digest import meta_signature

pytestmark = pytest.mark.timeout(400)
REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "examples" / "configs" / "llama"


def _cli(*args: Any) -> tuple[int, dict]:
    """The CLI in this process (torch and transformers load once for the whole file)."""
    from hpcodegen.cli.app import app, register_verbs
    from typer.testing import CliRunner

    register_verbs()
    res = CliRunner().invoke(app, [*map(str, args), "--json"], catch_exceptions=False)
    return res.exit_code, json.loads(res.stdout)


def _launch(*args: Any) -> tuple[int, dict]:
    proc = subprocess.run([sys.executable, "-m", "hpcodegen", "launch", *map(str, args),
                           "--json"], capture_output=True, text=True, cwd=REPO, timeout=300,
                          env={**os.environ, "NO_COLOR": "1"})
    return proc.returncode, json.loads(proc.stdout)


def _artifact(tmp: Path, example: str, edit: Callable[[dict], None]) -> Path:
    art = tmp / example
    shutil.copytree(REPO / "examples" / example, art)
    meta = json.loads((art / "codegen_meta.json").read_text())
    edit(meta)
    meta["signature"] = meta_signature(meta)
    (art / "codegen_meta.json").write_text(json.dumps(meta, indent=2))
    return art


def _errors(doc: dict) -> set[str]:
    return {f["code"] for a in doc["artifacts"] for c in a["checks"].values()
            for f in c["findings"] if f["severity"] == "error"}


def _full_norm_listed(meta: dict) -> None:
    meta["param_plan"]["model.norm"]["partial_grad_params"] = ["weight"]


def _row_split_head(meta: dict) -> None:
    meta["param_plan"]["lm_head"]["params"]["weight"]["tp"] = "S(1)"
    meta["frozen_sharded_params"] = sorted(meta["frozen_sharded_params"])


def _layer_gathers_sequence(meta: dict) -> None:
    """The decoder layer declared to take the whole sequence under --sp, while the attention
    inside it still gathers (and re-scatters) its own: right shapes, wrong values."""
    seq, whole = {"hidden_states": {"tp": "S(1)"}}, {"hidden_states": {"tp": "R"}}
    meta["param_plan"]["model.layers.0"] = {
        "is_boundary": True, "in_src": seq, "in_dst": whole, "out_names": ["output"],
        "out_src": {"output": {"tp": "R"}}, "out_dst": {"output": {"tp": "S(1)"}}}


@pytest.mark.parametrize(("example", "edit", "code", "at_launch"), [
    ("llama_tp2", _full_norm_listed, "plan.partial_grad_full", True),
    ("llama_tp2_sp", _layer_gathers_sequence, "plan.sp_nested_gather", True),
    ("llama_tp2", _row_split_head, "model.leaf_output", False),
])
def test_a_contradicting_meta_fails_the_gate(tmp_path, example, edit, code,
                                             at_launch) -> None:
    art = _artifact(tmp_path, example, edit)
    exit_code, doc = _cli("verify", art, "--hf-config", CONFIG, "--strict")
    assert exit_code == 1 and code in _errors(doc), doc
    if at_launch:  # the runtime's own checks: refused before any process starts
        exit_code, doc = _launch(art, "--nproc", "2", "--device", "cpu", "--model-dir",
                                 CONFIG)
        assert exit_code == 1 and code in {f["code"] for f in doc["findings"]}
        assert doc.get("pids") in (None, [])


@pytest.mark.parametrize(("rule", "code"), [
    ('- match: "model.norm"\n  partial_grad_params: [weight]\n', "plan.partial_grad_full"),
    ('- match: "lm_head"\n  params: {weight: {tp: "S(1)"}}\n', "model.leaf_output"),
    ('- match: "lm_head"\n  params: {weight: {tp: "R"}}\n'
     '  out_src: {output: {tp: "P(sum)"}}\n', "plan.partial_output_unsplit"),
])
def test_generate_refuses_a_recipe_its_verify_would_refuse(tmp_path, rule, code) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(rule)
    exit_code, doc = _cli("generate", "--model", CONFIG, "--tp", "2", "--recipe", recipe,
                          "-o", tmp_path / "out")
    assert exit_code == 1 and code in {f["code"] for f in doc["findings"]}, doc
    assert not (tmp_path / "out").exists()
