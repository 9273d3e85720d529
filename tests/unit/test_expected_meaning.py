"""``expected`` means one thing in every finding (docs/json.md): what the check expected to
find at the finding's location (``path`` in ``file``), the value that would have passed there.
A check of the artifact against the model names the config's or the model's value, in the
CLI's findings and in the Python API's exceptions alike."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest

from hpcodegen.errors import PlanError
from hpcodegen.verify import run_verify

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


def _findings(art: Path, config: Path, **kwargs) -> dict[str, dict]:
    out = io.StringIO()
    run_verify([art], hf_config=config, output="json", stdout=out, stderr=io.StringIO(),
               **kwargs)
    return {f["code"]: f for f in json.loads(out.getvalue())["findings"]}


def test_signature_expects_the_configs_values() -> None:
    found = _findings(EXAMPLES / "qwen3_tp2", EXAMPLES / "configs" / "llama",
                      only=["signature"])
    arch = found["signature.architecture"]
    assert (arch["path"], arch["expected"]) == ("/source/architecture", "LlamaForCausalLM")
    assert found["signature.model_type"]["expected"] == "'llama'"
    assert found["signature.structure"]["expected"] == "4"  # the config's heads


def test_model_check_expects_the_models_class(tmp_path: Path) -> None:
    art = tmp_path / "art"
    shutil.copytree(EXAMPLES / "llama_tp2", art)
    meta = json.loads((art / "codegen_meta.json").read_text())
    meta["boundary_classes"]["lm_head"] = "Embedding"
    (art / "codegen_meta.json").write_text(json.dumps(meta))
    found = _findings(art, EXAMPLES / "configs" / "llama", only=["model"])
    mismatch = found["model.class_mismatch"]
    assert mismatch["path"] == "/boundary_classes/lm_head"
    assert "the plan says Embedding" in mismatch["message"]
    assert mismatch["expected"] == "Linear"  # what the model has at lm_head


def test_python_api_expects_the_configs_architecture() -> None:
    from hpcodegen.runtime.api import load_verified_meta

    config = json.loads((EXAMPLES / "configs" / "qwen3" / "config.json").read_text())
    with pytest.raises(PlanError) as exc:
        load_verified_meta(EXAMPLES / "llama_tp2", config)
    (finding,) = exc.value.findings
    assert (finding.code, finding.where) == ("runtime.architecture", "/source/architecture")
    assert finding.expected == "Qwen3ForCausalLM"
    assert "(expected Qwen3ForCausalLM)" in str(exc.value)
