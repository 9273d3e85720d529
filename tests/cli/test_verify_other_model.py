"""An artifact of another model against ``--hf-config``: the signature check says so and the
model check is skipped with one line saying why, instead of a cascade of follow-on errors;
``--only model`` still fails (one error)."""

from __future__ import annotations

import io
import json
from pathlib import Path

from hpcodegen.verify import run_verify

REPO = Path(__file__).resolve().parents[2]
QWEN3 = REPO / "examples" / "qwen3_tp2"
LLAMA_CONFIG = REPO / "examples" / "configs" / "llama"


def _verify(*paths: Path, **kwargs) -> tuple[int, dict]:
    out = io.StringIO()
    code = run_verify(list(paths), output="json", stdout=out, stderr=io.StringIO(), **kwargs)
    return code, json.loads(out.getvalue())


def test_another_models_artifact_skips_the_model_check_saying_why() -> None:
    code, doc = _verify(QWEN3, hf_config=LLAMA_CONFIG)
    assert code == 1
    checks = doc["artifacts"][0]["checks"]
    assert checks["signature"]["status"] == "fail"
    codes = {f["code"] for f in checks["signature"]["findings"]}
    assert {"signature.architecture", "signature.model_type"} <= codes
    model = checks["model"]
    assert model["status"] == "skipped" and model["findings"] == []
    assert "another model's" in model["reason"] and "Qwen3ForCausalLM" in model["reason"]
    assert not [f for f in doc["findings"] if f["code"].startswith("model.")]


def test_only_model_still_fails_once() -> None:
    code, doc = _verify(QWEN3, hf_config=LLAMA_CONFIG, only=["model"])
    assert code == 1
    (finding,) = doc["findings"]
    assert finding["code"] == "model.other_model" and finding["path"] == "/source/architecture"
    assert finding["expected"] == "LlamaForCausalLM"


def test_the_same_models_config_still_runs_the_model_check(tmp_path: Path) -> None:
    """Only another architecture or model type skips it: a changed shape of the same model
    runs the model check as before."""
    config = json.loads((REPO / "examples" / "configs" / "qwen3" / "config.json").read_text())
    config["num_hidden_layers"] = 1
    (tmp_path / "config.json").write_text(json.dumps(config))
    code, doc = _verify(QWEN3, hf_config=tmp_path)
    assert code == 1
    checks = doc["artifacts"][0]["checks"]
    assert checks["model"]["status"] == "fail", checks["model"]
    assert any(f["code"].startswith("model.") for f in checks["model"]["findings"])
