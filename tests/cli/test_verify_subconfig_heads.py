"""A BLT artifact against a config whose per-stack head counts tp cannot divide, through the
real CLI (its entry point, in this process): verify (its model check, and for foreign
modeling code the pure config rule that needs no model) and inspect-plan refuse it, naming
the config field and the stack, by the rule generate refuses it with."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import inproc
import pytest

from hpcodegen.artifact.bundle import write_bundle
from hpcodegen.generate.api import build_bundle
from hpcodegen.hf import read_hf_config
from hpcodegen.inspect.options import InspectOptions
from hpcodegen.inspect.run import mesh_fit_findings
from hpcodegen.plan.codec import plan_from_meta

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
sys.path.append(str(FIXTURES))
import verify_fixtures as vf  # noqa: E402


@pytest.fixture(scope="module")
def blt(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("blt")
    config, _ = read_hf_config(FIXTURES / "families" / "blt")
    write_bundle(root / "art", build_bundle(config, 2, False, None, "blt"))
    bad = json.loads(json.dumps(config))
    bad["global_config"].update(num_attention_heads=6, num_key_value_heads=3)
    return {"art": root / "art", "good": vf.write_config(root / "good", config),
            "bad": vf.write_config(root / "bad", bad)}


def _verify(art: Path, config: Path, *extra: str) -> tuple[int, dict[str, Any], str]:
    proc = inproc.run("verify", art, "--hf-config", config, "--json", *extra)  # this process
    assert "Traceback" not in proc.stderr + proc.stdout
    (doc,) = json.loads(proc.stdout)["artifacts"]
    return proc.returncode, doc["checks"], proc.stderr


def _heads(check: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for f in check["findings"] if f["code"] == "model.heads_not_divisible"]


@pytest.mark.timeout(400)
def test_verify_refuses_a_stack_config_whose_heads_tp_cannot_divide(
        blt: dict[str, Path]) -> None:
    code, checks, _ = _verify(blt["art"], blt["good"])
    assert code == 0 and checks["model"]["status"] == "pass"
    code, checks, _ = _verify(blt["art"], blt["bad"])
    assert code == 1 and checks["model"]["status"] == "fail"
    (found,) = _heads(checks["model"])
    assert found["path"] == "/parallel_dims/tp_size"
    assert found["file"].endswith("codegen_meta.json") and found["expected"] == "a multiple of 2"
    assert found["message"].startswith("global_config.num_key_value_heads = 3 is not "
                                       "divisible by tp_size = 2")
    assert "model.global_transformer.layers.0.self_attn" in found["message"]


@pytest.mark.timeout(400)
def test_foreign_modeling_code_still_gets_the_config_rule(blt: dict[str, Path],
                                                          tmp_path: Path) -> None:
    """Foreign modeling code is never built: the pure rule alone fails it; a config that
    fits leaves the check skipped as before."""
    import shutil

    art = tmp_path / "foreign"
    shutil.copytree(blt["art"], art)
    meta = vf.read_meta(art)
    meta["source"]["module_name"] = "their_models.blt"
    vf.save_meta(art, meta)
    _, checks, _ = _verify(art, blt["good"], "--only", "model")
    assert checks["model"]["status"] == "skipped"
    code, checks, _ = _verify(art, blt["bad"], "--only", "model")
    assert code == 1 and checks["model"]["status"] == "fail"
    assert len(_heads(checks["model"])) == 1
    assert any(f["code"] == "model.foreign_source" for f in checks["model"]["findings"])


def test_inspect_plan_applies_the_same_rule(blt: dict[str, Path]) -> None:
    meta = vf.read_meta(blt["art"])
    opts = InspectOptions(path=str(blt["art"]), hf_config=str(blt["bad"]))
    (found,) = mesh_fit_findings(plan_from_meta(meta), opts)
    assert found.code == "inspect.heads_not_divisible"
    assert found.file == str(blt["bad"])
    assert "global_config.num_key_value_heads = 3" in found.message
    assert mesh_fit_findings(plan_from_meta(meta), InspectOptions(path=str(blt["art"]),
                                                  hf_config=str(blt["good"]))) == []
