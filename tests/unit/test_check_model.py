"""The ``model`` check: the plan fits the transformers model built on the meta device."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
sys.path.append(str(FIXTURES))
import verify_fixtures as vf  # noqa: E402

pytestmark = pytest.mark.timeout(400)
MLP = "model.layers.0.mlp"


def model(meta: dict[str, Any], config: dict[str, Any] | None) -> Any:
    """The model check's rule findings; the derivation's own statements (``derive.*``
    infos: what was derived how, which sums the runtime makes) are tested in
    tests/cli/test_gate_propagation.py, and its errors stay here."""
    return vf.without_derive_infos(vf.run_check("model", meta, hf_config=config))


def test_skipped_without_config() -> None:
    result = model(vf.llama_meta(), None)
    assert result.status == "skipped" and "--hf-config" in result.reason


@pytest.mark.parametrize("gen", ["g2", "g3"])
def test_moe_plan_with_expert_parameters_fits(gen: str) -> None:
    result = model(vf.qwen3_moe_meta(gen), dict(vf.QWEN3_MOE_CONFIG))
    assert result.status == "pass" and result.findings == []


def test_entry_that_is_a_parameter_itself() -> None:
    meta = vf.qwen3_moe_meta("g3")
    del meta["param_plan"][MLP]["params"]["experts.gate_up_proj"]
    meta["param_plan"][f"{MLP}.experts.gate_up_proj"] = {"params": {"": {"ep": "S(0)"}}}
    assert model(meta, dict(vf.QWEN3_MOE_CONFIG)).findings == []
    meta["param_plan"][f"{MLP}.experts"] = {"params": {"": {"ep": "S(0)"}}}
    assert vf.codes(model(meta, dict(vf.QWEN3_MOE_CONFIG))) == {
        ("model.missing_param", f"/param_plan/{MLP}.experts/params/")}


def test_uneven_shard_is_a_warning() -> None:
    config = dict(vf.LLAMA_CONFIG, vocab_size=255)
    result = model(vf.llama_meta(), config)
    assert result.status == "pass"
    assert vf.codes(result) == {
        ("model.uneven_dim", "/parallel_dims/tp_size"),
        ("model.uneven_shard", "/param_plan/model.embed_tokens/params/weight/tp"),
        ("model.uneven_shard", "/param_plan/lm_head/params/weight/tp"),
    }
    assert result.findings[0].message.startswith("vocab_size = 255 is not divisible by tp_size")
    assert "dim 0 of size 255 does not divide into 2" in result.findings[1].message


def test_kv_heads_must_divide_tp() -> None:
    meta = vf.llama_meta(tp=4)
    result = model(meta, dict(vf.LLAMA_CONFIG))
    (f,) = [f for f in result.findings if f.code == "model.heads_not_divisible"]
    assert f.message == ("num_key_value_heads = 2 is not divisible by tp_size = 4 "
                         "(key/value heads are split over tp)")


def test_heads_in_text_config_must_divide_tp() -> None:
    """Multimodal configs keep the head counts in text_config (the rule generate refuses by)."""
    from hpcodegen.plan.tp_divisible import tp_divisibility

    config = {"text_config": {"num_attention_heads": 6, "num_key_value_heads": 4}}
    (f,) = tp_divisibility(config, 4, "model", "/parallel_dims/tp_size")
    assert (f.code, f.where, f.severity.value) == (
        "model.heads_not_divisible", "/parallel_dims/tp_size", "error")
    assert f.message.startswith("text_config.num_attention_heads = 6 is not divisible")


def test_unknown_model_type_is_a_finding() -> None:
    config = dict(vf.LLAMA_CONFIG, model_type="no_such_model")
    (f,) = model(vf.llama_meta(), config).findings
    assert (f.code, f.where) == ("config.unknown_model_type", "/model_type")


def test_schema_invalid_plan_skips() -> None:
    meta = vf.llama_meta()
    meta["param_plan"]["lm_head"] = []
    result = model(meta, dict(vf.LLAMA_CONFIG))
    assert result.status == "skipped" and "schema" in result.reason


def test_tp_divide_attrs_exist_and_divide() -> None:
    meta = vf.qwen3_moe_meta("g3", layers=1)
    attn = meta["param_plan"]["model.layers.0.self_attn"]
    attn["tp_divide_attrs"] = ["num_key_value_groups", "num_heads", "is_causal"]
    assert vf.codes(model(meta, dict(vf.QWEN3_MOE_CONFIG, num_hidden_layers=1))) == {
        ("model.missing_attr", "/param_plan/model.layers.0.self_attn/tp_divide_attrs/1"),
        ("model.indivisible_attr", "/param_plan/model.layers.0.self_attn/tp_divide_attrs/2"),
    }


def test_config_findings_name_the_config_file(tmp_path) -> None:
    """A config transformers cannot build is reported against config.json, not the meta."""
    import io
    import json

    from hpcodegen.verify import run_verify

    config = dict(vf.LLAMA_CONFIG)
    config.pop("architectures", None)
    (tmp_path / "config.json").write_text(json.dumps(config))
    out = io.StringIO()
    run_verify([FIXTURES.parents[1] / "examples" / "llama_tp2"], hf_config=tmp_path, only=["model"],
               output="json", stdout=out, stderr=io.StringIO())
    (f,) = json.loads(out.getvalue())["artifacts"][0]["checks"]["model"]["findings"]
    assert (f["code"], f["path"]) == ("config.no_architecture", "/architectures")
    assert f["file"] == str(tmp_path / "config.json")
