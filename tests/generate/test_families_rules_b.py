"""generate on the GPT-style families that transformers ships no tp plan for (batch b).

``hpcodegen/generate/rules/<model_type>.yaml`` split their decoder layers; numerics are in
tests/runtime/test_family_parity_rules_b.py on real gloo ranks. Tiny configs:
tests/fixtures/families (bench/coverage.py's shrinking rule; gpt_neo and gpt_bigcode_mha
by hand: GPT-Neo's attention_types must match its layer count, GPTBigCode's default is
multi-query).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcodegen.errors import PlanError
from hpcodegen.generate.api import build_bundle
from hpcodegen.generate.package_rules import package_rules, unsplit_fields
from hpcodegen.hf import read_hf_config
from hpcodegen.plan.tp_divisible import tp_divisibility

pytestmark = pytest.mark.slow

FAMILIES = Path(__file__).resolve().parents[1] / "fixtures" / "families"
RULES_B = ["bloom", "gpt_bigcode", "gpt_bigcode_mha", "gpt-sw3", "openai-gpt", "gptj",
           "codegen", "mpt", "ctrl", "gpt_neo", "xlnet", "git", "trocr"]


def plan_of(family: str, tp: int = 2, notes: list[str] | None = None,
            **overrides: object) -> dict:
    config, _ = read_hf_config(FAMILIES / family)
    config.update(overrides)
    files = build_bundle(config, tp, False, None, family, notes=notes)
    return json.loads(files["codegen_meta.json"])["param_plan"]


def _layer_split(plan: dict) -> set[str]:
    """Full names of the sharded parameters of the first decoder layer."""
    return {f"{fqn}.{name}" for fqn, entry in plan.items() if ".0." in f"{fqn}."
            for name, p in (entry.get("params") or {}).items() if p.get("tp", "R") != "R"}


@pytest.mark.parametrize("family", RULES_B)
@pytest.mark.parametrize("tp", [2, 4])
def test_package_rules_split_the_decoder_layers(family: str, tp: int) -> None:
    notes: list[str] = []
    plan = plan_of(family, tp, notes)
    assert len(notes) == 1 and "no base_model_tp_plan" in notes[0], notes
    split = _layer_split(plan)
    assert any("attn" in n or "attention" in n for n in split) or family == "xlnet", split
    assert any(w in n for n in split for w in ("mlp", "ffn", "fc", "ff.", "intermediate")), split


def test_a_model_type_built_from_another_familys_classes_reuses_its_rules() -> None:
    """GPT-SW3 is GPT2LMHeadModel: gpt2.yaml, and generate says why."""
    notes: list[str] = []
    plan = plan_of("gpt-sw3", notes=notes)
    assert "hpcodegen/generate/rules/gpt2.yaml" in notes[0]
    assert "gpt-sw3 is built from the classes of transformers.models.gpt2" in notes[0]
    assert plan["transformer.h.0.attn"]["params"]["c_attn.weight"] == {"tp": "SS(1,3)"}
    assert package_rules({"model_type": "gpt-sw3"}) is None  # no file of its own
    assert package_rules({"model_type": "gpt-sw3"}, "gpt2") is not None


def test_multi_query_keeps_its_one_kv_head_whole() -> None:
    """GPTBigCode multi_query: c_attn gathered (q|k|v unequal blocks), c_proj split-input;
    its num_key_value_heads = 1 need not divide tp (unsplit_fields); multi-head: heads
    split per head (interleaved c_attn), num_heads divided."""
    mq = plan_of("gpt_bigcode")
    c_attn = mq["transformer.h.0.attn.c_attn"]
    assert c_attn["params"]["weight"] == {"tp": "S(0)"}
    assert c_attn["out_dst"] == {"output": {"tp": "R"}}
    assert mq["transformer.h.0.attn.c_proj"]["in_dst"] == {"input": {"tp": "S(-1)"}}
    config, _ = read_hf_config(FAMILIES / "gpt_bigcode")
    assert config["num_key_value_heads"] == 1 and unsplit_fields(config) == (
        "num_key_value_heads",)
    assert tp_divisibility(config, 2, "model", unsplit=unsplit_fields(config)) == []
    assert tp_divisibility(config, 2, "model")  # without the rule: refused
    mha = plan_of("gpt_bigcode_mha")["transformer.h.0.attn"]
    assert mha["params"]["c_attn.weight"] == {"tp": "S(0)"}
    assert "num_heads" in mha["tp_divide_attrs"]


def test_kv_heads_of_a_split_attention_must_still_divide_tp() -> None:
    """The exemption is the rule's: multi-head GPTBigCode splits its kv heads."""
    with pytest.raises(PlanError, match="num_key_value_heads = 3"):
        plan_of("gpt_bigcode_mha", num_key_value_heads=3)


def test_alibi_slices_per_rank_where_the_bias_is_heads_first() -> None:
    """MPT's (n_heads, 1, seq) ALiBi bias: R -> S(0) at the attention, heads packed q|k|v.
    BLOOM's batch-major bias cannot be sliced: projections gathered / split-input."""
    attn = plan_of("mpt")["transformer.blocks.0.attn"]
    assert attn["in_dst"]["position_bias"] == {"tp": "S(0)"}
    assert attn["params"]["Wqkv.weight"] == {"tp": "SS(0,3)"}
    assert attn["tp_divide_attrs"] == ["n_heads"]
    bloom = plan_of("bloom")
    assert bloom["transformer.h.0.self_attention.query_key_value"]["out_dst"] == {
        "output": {"tp": "R"}}
    assert bloom["transformer.h.0.mlp.dense_4h_to_h"]["out_src"] == {"output": {"tp": "P(sum)"}}


def test_bloom_slow_but_exact_keeps_the_attention_replicated() -> None:
    plan = plan_of("bloom", slow_but_exact=True, pretraining_tp=2)
    assert not any("self_attention" in n for n in _layer_split(plan))
    assert any("dense_h_to_4h" in n for n in _layer_split(plan))


def test_every_attention_input_is_a_boundary_input() -> None:
    """CTRL's attention takes the normed states as v, k and q: all three R -> R, so the
    gradient of each is reduced over tp."""
    attn = plan_of("ctrl")["transformer.h.0.multi_head_attention"]
    assert set(attn["in_src"]) == set(attn["in_dst"]) == {"v", "k", "q"}


@pytest.mark.parametrize("family", ["bloom", "mpt", "ctrl", "trocr", "openai-gpt", "xlnet"])
def test_sp_is_refused_where_the_rules_cannot_run_it(family: str) -> None:
    """--sp crashed at run time for these (masks or ALiBi built from the sharded sequence, a
    residual input left sequence-sharded, ...); generate refuses it (the rules' no_sp),
    naming the rules file and why."""
    config, _ = read_hf_config(FAMILIES / family)
    with pytest.raises(PlanError, match=r"--sp cannot run with these rules: \w") as info:
        build_bundle(config, 2, True, None, family)
    assert info.value.findings[0].file.startswith("hpcodegen/generate/rules/")


@pytest.mark.parametrize("family", ["gpt_bigcode", "gpt_bigcode_mha", "gptj", "codegen",
                                    "gpt_neo"])
def test_sp_generates_where_it_runs(family: str) -> None:
    """Parity with --sp on gloo for these: tests/runtime/test_family_parity_rules_b.py."""
    config, _ = read_hf_config(FAMILIES / family)
    assert build_bundle(config, 2, True, None, family)
