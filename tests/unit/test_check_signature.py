"""The ``signature`` check: the artifact was made for the model of ``--hf-config``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
sys.path.append(str(FIXTURES))
import verify_fixtures as vf  # noqa: E402


def sig(meta: dict[str, Any], config: dict[str, Any] | None) -> Any:
    return vf.run_check("signature", meta, hf_config=config)


def test_skipped_without_config() -> None:
    result = sig(vf.llama_meta(), None)
    assert result.status == "skipped" and "--hf-config" in result.reason


def test_ours_passes_and_foreign_is_skipped_with_info() -> None:
    assert sig(vf.llama_meta(), dict(vf.LLAMA_CONFIG)).findings == []
    result = sig(vf.qwen3_moe_meta("g3"), dict(vf.QWEN3_MOE_CONFIG))
    assert result.status == "pass"
    (f,) = result.findings
    assert (f.code, f.severity.value) == ("signature.foreign", "info")
    assert f.message.startswith("skipped: foreign generator")


def test_changed_config_names_each_field_and_the_signature() -> None:
    config = dict(vf.LLAMA_CONFIG, vocab_size=512, num_key_value_heads=4)
    result = sig(vf.llama_meta(), config)
    assert vf.codes(result, "error") == {
        ("signature.structure", "/source/structure/vocab_size"),
        ("signature.structure", "/source/structure/num_key_value_heads"),
        ("signature.mismatch", "/signature"),
    }
    by_code = {f.where: f for f in result.findings}
    assert by_code["/source/structure/vocab_size"].message == "vocab_size: artifact 256, config 512"
    assert ("differing fields: structure.num_key_value_heads, structure.vocab_size"
            in by_code["/signature"].message)


def test_foreign_meta_still_compares_architecture_and_structure() -> None:
    config = dict(vf.QWEN3_MOE_CONFIG, architectures=["Qwen3ForCausalLM"], model_type="qwen3",
                  num_experts=8)
    assert vf.codes(sig(vf.qwen3_moe_meta("g3"), config), "error") == {
        ("signature.architecture", "/source/architecture"),
        ("signature.model_type", "/source/model_type"),
        ("signature.structure", "/source/structure/num_experts"),
    }


def test_config_without_a_recorded_field_or_architectures_warns() -> None:
    config = {k: v for k, v in vf.QWEN3_MOE_CONFIG.items()
              if k not in ("architectures", "head_dim")}
    result = sig(vf.qwen3_moe_meta("g3"), config)
    assert vf.codes(result, "warning") == {
        ("signature.no_architecture", "/architectures/0"),
        ("signature.structure_unset", "/source/structure/head_dim"),
    }


def test_plan_edit_with_matching_config_is_named_as_such() -> None:
    meta = vf.llama_meta()
    meta["param_plan"]["lm_head"]["params"]["weight"]["tp"] = "S(1)"
    (f,) = sig(meta, dict(vf.LLAMA_CONFIG)).findings
    assert f.code == "signature.mismatch" and "plan itself was edited" in f.message


# --- sub-config structure (composite models keep their shapes in text_config, ...) ---------

VISION = {"hidden_size": 32, "num_hidden_layers": 2, "image_size": 8,
          "encoder": {"num_attention_heads": 2}, "id2label": {"0": "a"}}
COMPOSITE = {k: v for k, v in vf.LLAMA_CONFIG.items()
             if k not in ("hidden_size", "num_hidden_layers")} | {
    "text_config": {"hidden_size": 64, "num_hidden_layers": 2, "num_local_experts": 4},
    "vision_config": VISION, "rope_parameters": {"rope_theta": 10000.0}}


def composite_meta(config: dict[str, Any] = COMPOSITE) -> dict[str, Any]:
    """An hpcodegen meta whose source (so signature) was made from ``config``."""
    from hpcodegen.hf import source_from_config

    meta = vf.llama_meta()
    meta["source"].update(source_from_config(config))
    return vf._sign(meta)


def test_structure_records_every_sub_config_under_its_dotted_path() -> None:
    from hpcodegen.hf import STRUCTURE_FIELDS, structure_config, structure_of

    structure = structure_of(dict(COMPOSITE, **{"bad.key": {"hidden_size": 1}}))
    top = [k for k in STRUCTURE_FIELDS if k in COMPOSITE]
    assert list(structure) == [
        *top, "text_config.hidden_size", "text_config.num_hidden_layers",
        "text_config.num_local_experts", "vision_config.hidden_size",
        "vision_config.num_hidden_layers", "vision_config.encoder.num_attention_heads"]
    assert structure_of(dict(reversed(COMPOSITE.items()))) == structure  # file order is moot
    nested = structure_config(structure)
    assert nested["vision_config"]["encoder"] == {"num_attention_heads": 2}
    assert structure_of(nested) == structure


def test_a_drifted_sub_config_field_is_named_by_its_dotted_path() -> None:
    meta = composite_meta()
    assert sig(meta, COMPOSITE).findings == []
    for field, value in (("num_hidden_layers", 3), ("hidden_size", 128)):
        config = dict(COMPOSITE, text_config=dict(COMPOSITE["text_config"], **{field: value}))
        result = sig(meta, config)
        where = f"/source/structure/text_config.{field}"
        assert vf.codes(result, "error") == {("signature.structure", where),
                                              ("signature.mismatch", "/signature")}
        by_code = {f.code: f.message for f in result.findings}
        assert by_code["signature.structure"].startswith(f"text_config.{field}: artifact ")
        assert f"differing fields: structure.text_config.{field}" in by_code["signature.mismatch"]
    deep = dict(COMPOSITE, vision_config=dict(VISION, encoder={"num_attention_heads": 4}))
    assert ("signature.structure", "/source/structure/vision_config.encoder.num_attention_heads"
            ) in vf.codes(sig(meta, deep), "error")


def test_sub_config_aliases_and_fields_the_artifact_never_saw() -> None:
    meta = composite_meta()
    text = {k: v for k, v in COMPOSITE["text_config"].items() if k != "num_local_experts"}
    aliased = dict(COMPOSITE, text_config=dict(text, num_experts=4))
    result = sig(meta, aliased)  # the count under another name: the field compares equal
    assert vf.codes(result, "error") == {("signature.mismatch", "/signature")}
    (f,) = [f for f in result.findings if f.code == "signature.mismatch"]
    assert "structure.text_config.num_experts, structure.text_config.num_local_experts" \
        in f.message
    result = sig(meta, dict(aliased, text_config=dict(text, num_experts=8)))
    (f,) = [f for f in result.findings if f.code == "signature.structure"]
    assert f.message == ("text_config.num_local_experts (the config's "
                         "text_config.num_experts): artifact 4, config 8")
    added = dict(COMPOSITE, audio_config={"hidden_size": 16})
    (f,) = sig(meta, added).findings
    assert f.code == "signature.mismatch" and "structure.audio_config.hidden_size" in f.message


def test_metas_with_top_level_structure_only() -> None:
    """Foreign metas record the top level only and pass; an hpcodegen meta written before
    sub-configs were recorded passes with a warning that they went unchecked."""
    qwen = dict(vf.QWEN3_MOE_CONFIG, vision_config=VISION)
    (f,) = sig(vf.qwen3_moe_meta("g3"), qwen).findings
    assert f.code == "signature.foreign"
    legacy = vf.llama_meta()  # signed over the top-level structure only
    config = dict(vf.LLAMA_CONFIG, vision_config=VISION)
    result = sig(legacy, config)
    assert result.status == "pass"
    (f,) = result.findings
    assert (f.code, f.severity.value, f.where) == (
        "signature.top_level_only", "warning", "/source/structure")
    assert "shapes in vision_config were not compared" in f.message
    edited = vf.llama_meta()
    edited["param_plan"]["lm_head"]["params"]["weight"]["tp"] = "S(1)"
    assert vf.codes(sig(edited, config), "error") == {("signature.mismatch", "/signature")}
