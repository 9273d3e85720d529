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
