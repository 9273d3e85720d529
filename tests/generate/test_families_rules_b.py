"""generate on the GPT-style families that transformers ships no tp plan for (batch b).

``hpcodegen/generate/rules/<model_type>.yaml`` split their decoder layers; numerics are in
tests/runtime/test_family_parity_rules_b.py on real gloo ranks. Tiny configs:
tests/fixtures/families (bench/coverage.py's shrinking rule; gpt_neo and gpt_bigcode_mha
by hand: GPT-Neo's attention_types must match its layer count, GPTBigCode's default is
multi-query; Mllama's cross-attention layer moved to layer 1 so that 2 layers hold one).
BLT, Fuyu and Mllama are composites: rules by stack, by sub-model, by layer kind.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from artifact_memo import build_bundle

from hpcodegen.errors import PlanError
from hpcodegen.generate.sources.package_rules import (
    PackageRules,
    package_rules,
    rerooted,
    unsplit_fields,
)
from hpcodegen.hf import read_hf_config
from hpcodegen.plan.tp_divisible import tp_divisibility

pytestmark = pytest.mark.slow

FAMILIES = Path(__file__).resolve().parents[1] / "fixtures" / "families"
RULES_B = ["bloom", "gpt_bigcode", "gpt_bigcode_mha", "gpt-sw3", "openai-gpt", "gptj",
           "codegen", "mpt", "ctrl", "gpt_neo", "xlnet", "git", "trocr", "blt", "fuyu", "mllama"]
#: the families the structural seeds split (no rule file; BLOOM, CTRL, XLNet, TrOCR and GIT
#: with the dataflow's: pair_seeds.py, attention_seeds.py); a fused projection's row order
#: read from the traced forward (fused_seeds.py) adds its own note
SEEDED = frozenset({"gptj", "codegen", "gpt_neo", "bloom", "ctrl", "xlnet", "trocr", "git",
                    "gpt-sw3", "openai-gpt", "fuyu"})
FUSED = frozenset({"gpt-sw3", "openai-gpt", "fuyu"})


def plan_of(family: str, tp: int = 2, notes: list[str] | None = None,
            **overrides: object) -> dict:
    config, _ = read_hf_config(FAMILIES / family)
    for scope in [config, *(v for v in config.values() if isinstance(v, dict))]:
        kv = scope.get("num_key_value_heads")  # GQA kv heads (BLT's every stack) -> tp
        if isinstance(kv, int) and kv > 1 and kv % tp:
            scope["num_key_value_heads"] = tp
    config.update(overrides)
    warned: list = []  # every family here splits its layers: no generate.no_layer_split
    files = build_bundle(config, tp, False, None, family, notes=notes, warnings=warned)
    assert not warned, [w.render() for w in warned]
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
    assert len(notes) == 1 + (family in FUSED), notes
    # found by the structural seeds (hpcodegen/generate/seeds/seeds.py), else a rule file's
    assert notes[0].startswith("structural seeds:") if family in SEEDED else \
        "no base_model_tp_plan" in notes[0], notes
    split = _layer_split(plan)
    assert any("attn" in n or "attention" in n for n in split) or family == "xlnet", split
    assert any(w in n for n in split for w in ("mlp", "ffn", "fc", "ff.", "intermediate")), split


def test_a_model_type_built_from_gpt2_classes_gets_the_same_plan_by_structure() -> None:
    """GPT-SW3 is GPT2LMHeadModel: no rule file for either; the traced forward packs c_attn
    (split into three blocks) as for GPT-2, and --sp is refused by the shape run (both
    view their output by the full input shape), as OpenAI-GPT's."""
    notes: list[str] = []
    plan = plan_of("gpt-sw3", notes=notes)
    assert notes[1].startswith("fused projections:"), notes
    assert plan["transformer.h.0.attn"]["params"]["c_attn.weight"] == {"tp": "SS(1,3)"}
    assert plan == plan_of("gpt2")
    assert package_rules({"model_type": "gpt-sw3"}, "gpt2") is None
    for family in ("gpt-sw3", "openai-gpt"):
        config, _ = read_hf_config(FAMILIES / family)
        with pytest.raises(PlanError, match=r"transformer \(\w+Model\) does not run on its "
                                            r"rank's slice of the sequence") as info:
            build_bundle(config, 2, True, None, family)
        assert {f.code for f in info.value.findings} == {"generate.sp_shapes"}


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
    assert config["num_key_value_heads"] == 1 and set(unsplit_fields(config)) == {
        "num_attention_heads", "num_key_value_heads"}
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


def test_bloom_slow_but_exact_splits_no_projection_it_reads_by_weight() -> None:
    """slow_but_exact with pretraining_tp > 1 reads dense.weight and dense_4h_to_h.weight
    itself (F.linear on slices sized by the weight it holds), never calling them: no
    boundary of theirs would run, so neither they nor their partners are split (the rule
    file this replaced split the MLP there, and its logits were 0.03 off on gloo), and
    generate warns that no layer is split."""
    config, _ = read_hf_config(FAMILIES / "bloom")
    config.update(slow_but_exact=True, pretraining_tp=2)
    warned: list = []
    meta = json.loads(build_bundle(config, 2, False, None, "bloom", warnings=warned)[
        "codegen_meta.json"])
    assert not _layer_split(meta["param_plan"])
    assert [w.code for w in warned] == ["generate.no_layer_split"]
    split = _layer_split(plan_of("bloom"))
    assert any("self_attention" in n for n in split) and any("mlp" in n for n in split)


def test_residual_inside_the_mlp_keeps_the_shard_flowing_between_its_projections() -> None:
    """BLOOM's MLP adds its residual itself: no region; dense_h_to_4h's output stays
    sharded on its last dim into dense_4h_to_h, whose partial output is all-reduced."""
    mlp = "transformer.h.0.mlp"
    plan = plan_of("bloom")
    assert mlp not in plan or not plan[mlp].get("is_boundary")
    assert plan[f"{mlp}.dense_h_to_4h"]["out_dst"] == {"output": {"tp": "S(-1)"}}
    assert plan[f"{mlp}.dense_4h_to_h"]["in_src"] == {"input": {"tp": "S(-1)"}}


def test_every_attention_input_is_a_boundary_input() -> None:
    """CTRL's attention takes the normed states as v, k and q: all three R -> R, so the
    gradient of each is reduced over tp."""
    attn = plan_of("ctrl")["transformer.h.0.multi_head_attention"]
    assert set(attn["in_src"]) == set(attn["in_dst"]) == {"v", "k", "q"}


@pytest.mark.parametrize("family", ["mpt", "mllama"])
def test_sp_is_refused_where_the_rules_cannot_run_it(family: str) -> None:
    """--sp crashed at run time for these (masks or ALiBi built from the sharded sequence, a
    residual input left sequence-sharded, ...); generate refuses it (the rules' no_sp),
    naming the rules file and why."""
    config, _ = read_hf_config(FAMILIES / family)
    with pytest.raises(PlanError, match=r"--sp cannot run with these rules: \w") as info:
        build_bundle(config, 2, True, None, family)
    assert info.value.findings[0].file.startswith("hpcodegen/generate/rules/")


@pytest.mark.parametrize(("family", "module"), [
    ("bloom", "transformer.h.0.self_attention"), ("ctrl", "transformer"),
    ("trocr", "model.decoder.layers.0.self_attn"), ("xlnet", "transformer")])
def test_sp_is_refused_by_structure_where_no_rule_file_says_why(family: str, module: str
                                                                  ) -> None:
    """Seeded families have no no_sp text: the --sp checks refuse them from the plan and
    the model (a shape run on the sharded sequence: ALiBi built from it; XLNet's own
    parameters computing on a slice; TrOCR's attention region inside the layer that
    gathers the sequence for fc1/fc2), naming the first module that goes wrong."""
    config, _ = read_hf_config(FAMILIES / family)
    with pytest.raises(PlanError) as info:
        build_bundle(config, 2, True, None, family)
    (found, *_) = info.value.findings
    assert found.code in ("generate.sp_shapes", "generate.sp_replicated_compute",
                          "generate.sp_nested_gather"), found
    assert found.where == module, found


@pytest.mark.parametrize("family", ["gpt_bigcode", "gpt_bigcode_mha", "gptj", "codegen",
                                    "gpt_neo"])
def test_sp_generates_where_it_runs(family: str) -> None:
    """Parity with --sp on gloo for these: tests/runtime/test_family_parity_rules_b.py."""
    config, _ = read_hf_config(FAMILIES / family)
    assert build_bundle(config, 2, True, None, family)


def test_head_counts_under_other_names_must_divide_tp_where_heads_are_split() -> None:
    """GPT-J's ``n_head`` (no ``num_attention_heads`` in its config.json) splits over tp: 2
    heads at tp 4 are refused naming the field; BLOOM's heads are never split (gathered
    qkv, whole attention core): its rules exempt them."""
    with pytest.raises(PlanError, match="n_head = 2 is not divisible by tp_size = 4"):
        plan_of("gptj", 4, n_head=2)
    with pytest.raises(PlanError, match="n_heads = 2"):
        plan_of("mpt", 4, n_heads=2)
    assert _layer_split(plan_of("bloom", 4, n_head=2))


def test_a_sub_model_of_another_family_is_split_as_that_family() -> None:
    """Fuyu's language model is a PersimmonModel at model.language_model: its fused
    query_key_value (rows per head) is split colwise there, as in Persimmon, by structure."""
    notes: list[str] = []
    plan = plan_of("fuyu", notes=notes)
    assert notes[1].startswith("fused projections:"), notes
    attn = plan["model.language_model.layers.0.self_attn"]
    assert attn["params"]["query_key_value.weight"] == {"tp": "S(0)"}
    assert attn["tp_divide_attrs"] == ["num_heads"]
    assert plan["model.language_model.layers.0.mlp"]["params"]["dense_4h_to_h.weight"] == {
        "tp": "S(1)"}
    assert package_rules({"model_type": "fuyu"}, "fuyu") is None  # no file of its own


def test_rerooted_rules_move_the_base_model_globs_and_drop_the_rest() -> None:
    rules = PackageRules("x.yaml", ("why",), True,
                         (("model.layers.*.mlp.up", "colwise"), ("lm_head", "colwise")),
                         ({"match": ["model.layers.*.mix", "head"], "params": {}},))
    moved = rerooted(rules, "model", "model.language_model", "fuyu")
    assert moved.tp_plan == (("model.language_model.layers.*.mlp.up", "colwise"),)
    assert moved.recipe == ({"match": ["model.language_model.layers.*.mix"], "params": {}},)
    assert not moved.replace_hf_plan and moved.reasons[-1] == "why"
    whole = rerooted(rules, "", "lm", "x")  # a whole causal LM inside: every glob moves
    assert [g for g, _ in whole.tp_plan] == ["lm.model.layers.*.mlp.up", "lm.lm_head"]


def test_blt_splits_every_stack_and_gathers_its_cross_attention() -> None:
    plan = plan_of("blt")
    for stack in ("local_encoder", "global_transformer", "local_decoder", "patcher"):
        attn = plan[f"model.{stack}.layers.0.self_attn"]
        assert attn["params"]["q_proj.weight"] == {"tp": "S(0)"}, stack
        assert set(attn["tp_divide_attrs"]) == {"num_heads", "num_key_value_heads"}
    cross = "model.local_decoder.cross_attn_layers.0"
    assert plan[f"{cross}.k_proj"]["out_dst"] == {"output": {"tp": "R"}}
    assert plan[f"{cross}.o_proj"]["in_dst"] == {"input": {"tp": "S(-1)"}}
    assert plan[f"{cross}.q_norm"]["params"]["weight"] == {"tp": "R"}


def test_head_counts_of_a_stack_with_its_own_config_must_divide_tp() -> None:
    """BLT's stacks size their attention by their own sub-config: the config-size rule
    reads the sub-config of each stack the plan divides (the rule verify and inspect-plan
    apply too) and names it."""
    config, _ = read_hf_config(FAMILIES / "blt")
    for sub in ("encoder_config", "decoder_config", "patcher_config"):
        config[sub]["num_key_value_heads"] = 4
    config["global_config"]["num_key_value_heads"] = 2
    with pytest.raises(PlanError, match="num_key_value_heads = 2 is not divisible by "
                                        "tp_size = 4") as info:
        build_bundle(config, 4, False, None, "blt")
    (found,) = info.value.findings
    assert found.where == "/global_config/num_key_value_heads"
    assert "model.global_transformer.layers.0.self_attn" in found.message


def test_mllama_splits_self_attention_and_gathers_cross_attention() -> None:
    plan = plan_of("mllama")
    assert plan["model.layers.0.self_attn"]["params"]["k_proj.weight"] == {"tp": "S(0)"}
    cross = plan["model.layers.1.cross_attn.k_proj"]
    assert cross["params"]["weight"] == {"tp": "S(0)"}
    assert cross["out_dst"] == {"output": {"tp": "R"}}
    assert plan["model.layers.1.mlp"]["params"]["gate_proj.weight"] == {"tp": "S(0)"}
