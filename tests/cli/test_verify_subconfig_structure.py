"""A composite model's artifact (Mllama: shapes in ``text_config`` and ``vision_config``)
against configs whose sub-configs drifted, through the real CLI: generate records every
sub-config's shape fields under dotted paths, and ``verify --hf-config`` fails a drifted one,
naming the dotted field, while staying torch-free. The runtime gate refuses it too."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hpcodegen.artifact.bundle import write_bundle
from hpcodegen.generate.api import build_bundle
from hpcodegen.hf import read_hf_config

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
sys.path.append(str(FIXTURES))
import verify_fixtures as vf  # noqa: E402

pytestmark = pytest.mark.timeout(400)

DRIFTS = [("text_config", "num_hidden_layers", 3), ("text_config", "hidden_size", 128),
          ("text_config", "vocab_size", 512), ("text_config", "num_attention_heads", 8),
          ("vision_config", "num_hidden_layers", 3)]


@pytest.fixture(scope="module")
def mllama(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("mllama")
    config, _ = read_hf_config(FIXTURES / "families" / "mllama")
    write_bundle(root / "art", build_bundle(config, 2, False, None, "mllama"))
    return {"root": root, "art": root / "art", "config": config,
            "good": vf.write_config(root / "good", config)}


def _drifted(mllama: dict[str, Any], sub: str, field: str, value: Any) -> Path:
    config = copy.deepcopy(mllama["config"])
    config[sub][field] = value
    return vf.write_config(mllama["root"] / f"{sub}-{field}", config)


def _verify(art: Path, config: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    """verify's JSON verdict; ``-X importtime`` shows it imported neither torch nor
    transformers."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "hpcodegen", "verify",
                           str(art), "--hf-config", str(config), "--json", *extra],
                          capture_output=True, text=True, timeout=300)
    assert "Traceback" not in proc.stdout
    imported = {line.split("|")[-1].strip() for line in proc.stderr.splitlines()
                if line.startswith("import time:")}
    assert "torch" not in imported and "transformers" not in imported
    (doc,) = json.loads(proc.stdout)["artifacts"]
    return proc.returncode, doc["checks"]


def test_generate_records_each_sub_configs_shape_under_its_dotted_path(
        mllama: dict[str, Any]) -> None:
    structure = vf.read_meta(mllama["art"])["source"]["structure"]
    text, vision = mllama["config"]["text_config"], mllama["config"]["vision_config"]
    for sub, field, _ in DRIFTS:
        assert structure[f"{sub}.{field}"] == mllama["config"][sub][field]
    assert structure["text_config.num_key_value_heads"] == text["num_key_value_heads"]
    assert structure["vision_config.hidden_size"] == vision["hidden_size"]


def test_unchanged_config_passes(mllama: dict[str, Any]) -> None:
    code, checks = _verify(mllama["art"], mllama["good"], "--skip", "model")
    assert code == 0, checks
    assert checks["signature"]["status"] == "pass" and checks["signature"]["findings"] == []


@pytest.mark.parametrize(("sub", "field", "value"), DRIFTS)
def test_a_drifted_sub_config_fails_naming_the_dotted_field(
        mllama: dict[str, Any], sub: str, field: str, value: Any) -> None:
    code, checks = _verify(mllama["art"], _drifted(mllama, sub, field, value),
                           "--only", "signature")
    assert code == 1 and checks["signature"]["status"] == "fail"
    found = {f["code"]: f for f in checks["signature"]["findings"]}
    assert set(found) == {"signature.structure", "signature.mismatch"}
    dotted, recorded = f"{sub}.{field}", mllama["config"][sub][field]
    assert found["signature.structure"]["path"] == f"/source/structure/{dotted}"
    assert found["signature.structure"]["message"] == (
        f"{dotted}: artifact {recorded}, config {value}")
    assert f"differing fields: structure.{dotted}" in found["signature.mismatch"]["message"]


def test_the_runtime_gate_refuses_a_drifted_pretrained_config(mllama: dict[str, Any]) -> None:
    """``parallelize_from_generated(..., hf_config=config object)`` compares the recorded
    sub-config fields of ``to_dict()`` (which adds every default) and refuses a drift."""
    from transformers import AutoConfig

    from hpcodegen.errors import PlanError
    from hpcodegen.runtime.api import load_verified_meta

    data = copy.deepcopy(mllama["config"])
    config = AutoConfig.for_model(data.pop("model_type"), **data)
    load_verified_meta(mllama["art"], config)
    config.text_config.num_hidden_layers = 3
    with pytest.raises(PlanError) as exc:
        load_verified_meta(mllama["art"], config)
    assert "/source/structure/text_config.num_hidden_layers" in str(exc.value)
    # the text sub-config alone (what ``MllamaForCausalLM(...).config`` is) names no
    # architecture: a clear refusal saying which config to pass instead
    with pytest.raises(PlanError) as exc:
        load_verified_meta(mllama["art"], config.text_config)
    (finding,) = exc.value.findings
    assert finding.code == "runtime.config_without_architecture"
    assert "MllamaTextConfig" in finding.message and "not a sub-config" in finding.hint


def test_inspect_reads_sub_config_heads_from_the_recorded_structure(
        mllama: dict[str, Any]) -> None:
    """Without ``--hf-config`` inspect-plan's mesh fit reads the meta's ``source.structure``;
    the dotted fields are nested back, so a composite's text heads are checked too."""
    from hpcodegen.inspect.options import InspectOptions
    from hpcodegen.inspect.run import mesh_fit_findings
    from hpcodegen.plan.codec import plan_from_meta

    meta = vf.read_meta(mllama["art"])
    opts = InspectOptions(path=str(mllama["art"]))
    assert mesh_fit_findings(plan_from_meta(meta), opts) == []
    meta["source"]["structure"]["text_config.num_key_value_heads"] = 3
    (found,) = mesh_fit_findings(plan_from_meta(meta), opts)
    assert found.code == "inspect.heads_not_divisible"
    assert "text_config.num_key_value_heads = 3" in found.message
