"""generate on dense families that transformers ships no TP plan for (package rules, set A).

Each family's tiny fixture must come out with its decoder layers split at tp 2 and tp 4, the
rule file (or the structural seeds) named in generate's notes; the config variants a rule
treats apart are checked here, their numerics in tests/runtime/test_family_parity_rules_a.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from artifact_memo import build_bundle

from hpcodegen.errors import PlanError
from hpcodegen.generate.sources.package_rules import package_rules
from hpcodegen.hf import read_hf_config

pytestmark = pytest.mark.slow

FAMILIES = Path(__file__).resolve().parents[1] / "fixtures" / "families"
#: family fixture -> the decoder layer 0 prefix
LAYER0 = {
    "opt": "model.decoder.layers.0", "biogpt": "biogpt.layers.0", "xglm": "model.layers.0",
    "stablelm": "model.layers.0", "persimmon": "model.layers.0", "diffllama": "model.layers.0",
    "lfm2": "model.layers.0", "lfm3": "model.layers.0",
    "gpt_neox_japanese": "gpt_neox_japanese.layers.0", "modernbert-decoder": "model.layers.0",
    "bitnet": "model.layers.0", "cpmant": "cpmant.encoder.layers.0",
    "musicgen": "model.decoder.layers.0", "musicgen_melody": "model.decoder.layers.0",
    "moshi": "model.layers.0", "xlstm": "backbone.blocks.0",
}
#: the families whose layout the structural seeds find (hpcodegen/generate/seeds/seeds.py; OPT,
#: BioGPT and XGLM with the dataflow's, pair_seeds.py and attention_seeds.py), and the row
#: order of a fused projection the traced forward reads (fused_seeds.py)
SEEDED = frozenset({"stablelm", "bitnet", "modernbert-decoder", "opt", "biogpt", "xglm",
                    "persimmon", "gpt_neox_japanese"})


def plan_of(family: str, tp: int = 2, notes: list[str] | None = None,
            **overrides: Any) -> dict[str, Any]:
    config, _ = read_hf_config(FAMILIES / family)
    if tp == 4:  # heads and kv heads must divide tp: 4 kv heads (as bench/coverage.py)
        config.update({k: 4 for k in ("num_key_value_heads",) if k in config})
    config.update(overrides)
    warned: list = []  # every family here splits its layers: no generate.no_layer_split
    files = build_bundle(config, tp, False, None, family, notes=notes, warnings=warned)
    assert not warned, [w.render() for w in warned]
    return json.loads(files["codegen_meta.json"])["param_plan"]


def sharded_in(plan: dict[str, Any], prefix: str) -> set[str]:
    """``fqn.param`` of every tp-sharded parameter under ``prefix``."""
    return {f"{fqn}.{rel}" for fqn, entry in plan.items() if fqn.startswith(prefix)
            for rel, p in (entry.get("params") or {}).items() if p.get("tp", "R") != "R"}


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("family", sorted(LAYER0))
def test_decoder_layers_are_split_by_the_package_rules(family: str, tp: int) -> None:
    notes: list[str] = []
    plan = plan_of(family, tp, notes)
    if family in SEEDED:  # found from the model's structure: no rule file; a fused block
        # (ModernBERT's Wi, Persimmon's query_key_value) is packed or split by its rows
        assert notes[0].startswith("structural seeds:"), notes
        assert all(n.startswith(("Megatron layout:", "fused projections:"))
                   for n in notes[1:]), notes
    else:
        assert len(notes) == 1
        assert f"hpcodegen/generate/rules/{family}.yaml" in notes[0]
        assert "no base_model_tp_plan" in notes[0]
    assert sharded_in(plan, LAYER0[family] + "."), (family, "layer 0 not split")


def test_opt_mlp_keeps_the_shard_between_fc1_and_fc2() -> None:
    """fc1/fc2 live in the decoder layer (residuals, norms): no region; fc1's output stays
    sharded on its last dim into fc2, whose partial output is all-reduced."""
    plan = plan_of("opt")
    fc1, fc2 = plan["model.decoder.layers.0.fc1"], plan["model.decoder.layers.0.fc2"]
    assert fc1["params"] == {"weight": {"tp": "S(0)"}, "bias": {"tp": "S(0)"}}
    assert fc1["out_src"] == fc1["out_dst"] == {"output": {"tp": "S(-1)"}}
    assert fc2["in_src"] == fc2["in_dst"] == {"input": {"tp": "S(-1)"}}
    assert fc2["out_src"] == {"output": {"tp": "P(sum)"}} and fc2["deferred_bias_params"] == [
        "bias"]
    assert "model.decoder.layers.0" not in plan
    assert plan["model.decoder.layers.0.self_attn"]["tp_divide_attrs"] == ["num_heads"]


def test_xglm_divides_the_embed_dim_its_attention_reshapes_with() -> None:
    attn = plan_of("xglm")["model.layers.0.self_attn"]
    assert attn["tp_divide_attrs"] == ["embed_dim", "num_heads"]


def test_head_counts_read_by_a_helper_method_are_divided() -> None:
    """Persimmon's forward calls self._split_heads, which views with self.num_heads."""
    attn = plan_of("persimmon")["model.layers.0.self_attn"]
    assert attn["tp_divide_attrs"] == ["num_heads"]
    assert attn["params"]["query_key_value.weight"] == {"tp": "S(0)"}
    assert {"q_layernorm.weight", "k_layernorm.weight"} <= set(attn["partial_grad_params"])


def test_head_count_attrs_follow_self_method_calls() -> None:
    import torch

    from hpcodegen.generate.seeds.module_facts import head_count_attrs

    class Attn(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.num_heads, self.num_kv_heads, self.unused_heads = 4, 2, 8
            self.proj = torch.nn.Linear(2, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self._split(self.proj(x))

        def _split(self, x: torch.Tensor) -> torch.Tensor:
            return self._view(x).view(self.num_kv_heads, -1)

        def _view(self, x: torch.Tensor) -> torch.Tensor:
            return x.view(-1, self.num_heads)

    assert head_count_attrs(Attn()) == ["num_heads", "num_kv_heads"]


def test_stablelm_qk_layernorm_keeps_the_heads_whole() -> None:
    """qk_layernorm's per-head LayerNorms (a ModuleList zipped with the heads) cannot follow
    a head split: the attention is no region; its projections are split one by one, q/k/v
    gathered before the norms and o_proj reducing its own output."""
    plan = plan_of("stablelm", qk_layernorm=True)
    attn = "model.layers.0.self_attn"
    assert not plan.get(attn, {}).get("is_boundary")
    assert plan[f"{attn}.q_proj"]["out_dst"] == {"output": {"tp": "R"}}
    assert plan[f"{attn}.o_proj"]["in_dst"] == {"input": {"tp": "S(-1)"}}
    assert sharded_in(plan, "model.layers.0.mlp")
    assert sharded_in(plan_of("stablelm", use_qkv_bias=True), "model.layers.0.self_attn") >= {
        "model.layers.0.self_attn.q_proj.bias"}


def test_diffllama_head_pairs_need_kv_heads_a_multiple_of_2_tp() -> None:
    """q/k/v packed in two blocks of heads when each rank can hold whole pairs; else the
    attention stays replicated and the variant says why."""
    attn = plan_of("diffllama")["model.layers.0.self_attn"]  # 8 heads, 4 kv heads, tp 2
    assert attn["params"]["k_proj.weight"] == {"tp": "SS(0,2)"}
    assert attn["params"]["o_proj.weight"] == {"tp": "S(1)"}
    assert "lambda_q1" in attn["partial_grad_params"]
    for tp, kv in ((2, 2), (4, 4)):
        notes: list[str] = []
        plan = plan_of("diffllama", tp, notes, num_key_value_heads=kv)
        assert not sharded_in(plan, "model.layers.0.self_attn"), (tp, kv)
        assert sharded_in(plan, "model.layers.0.mlp") and "multiple of 2 * tp" in notes[0]


def test_a_parameter_returned_untouched_keeps_a_full_gradient() -> None:
    """GPT-NeoX Japanese's last attention returns dense_bias for the layer to add after the
    reduction (the trace sees it returned): replicated, NOT in partial_grad_params (its
    gradient is already whole); with --sp it is refused (added to a sequence slice)."""
    plan = plan_of("gpt_neox_japanese")
    last = plan["gpt_neox_japanese.layers.1.attention"]
    assert last["params"]["dense_bias"] == {"tp": "R"}
    assert "dense_bias" not in last.get("partial_grad_params", [])
    assert "dense_bias" not in plan["gpt_neox_japanese.layers.0.attention"]["params"]
    config, _ = read_hf_config(FAMILIES / "gpt_neox_japanese")
    with pytest.raises(PlanError, match=r"layers\.1\.attention\.dense_bias: with sequence "
                                        r"parallelism") as info:
        build_bundle(config, 2, True, None, "gpt_neox_japanese")
    assert {f.code for f in info.value.findings} == {"generate.sp_returned_param"}


def test_lfm_short_conv_channels_split_with_in_proj() -> None:
    conv = plan_of("lfm2", conv_bias=True)["model.layers.0.conv"]
    assert conv["params"]["in_proj.weight"] == {"tp": "SS(0,3)"}
    assert conv["params"]["conv.weight"] == conv["params"]["conv.bias"] == {"tp": "S(0)"}
    assert conv["params"]["out_proj.weight"] == {"tp": "S(1)"}
    attn = plan_of("lfm3")["model.layers.1.self_attn"]
    assert attn["params"]["g_proj.weight"] == {"tp": "S(0)"}


def test_when_indivisible_reads_the_tp_size() -> None:
    base = {"model_type": "diffllama", "num_attention_heads": 8}
    split = package_rules({**base, "num_key_value_heads": 4}, tp=2)
    assert split is not None and any("q_proj" in g for g, _ in split.tp_plan)
    kept = package_rules({**base, "num_key_value_heads": 4}, tp=4)
    assert kept is not None and not any("q_proj" in g for g, _ in kept.tp_plan)
    assert any("2 * tp" in r for r in kept.reasons)


def test_when_indivisible_must_name_positive_factors(monkeypatch: pytest.MonkeyPatch) -> None:
    from hpcodegen.generate.sources import package_rules as pr

    data = {"tp_plan": {}, "variants": [{"when_indivisible": {"num_key_value_heads": 0}}]}
    monkeypatch.setattr(pr, "_read", lambda _t: ("rules/x.yaml", data))
    with pytest.raises(PlanError, match="when_indivisible"):
        pr.package_rules({"model_type": "x"})


def test_bitnet_sub_norms_run_on_gathered_projections() -> None:
    """attn_sub_norm/ffn_sub_norm normalise the whole attention output / intermediate: the
    projections gather their outputs, o_proj/down_proj split their replicated input."""
    plan = plan_of("bitnet")
    q = plan["model.layers.0.self_attn.q_proj"]
    assert q["params"] == {"weight": {"tp": "S(0)"}} and q["out_dst"] == {"output": {"tp": "R"}}
    o = plan["model.layers.0.self_attn.o_proj"]
    assert o["in_dst"] == {"input": {"tp": "S(-1)"}} and o["params"] == {"weight": {"tp": "S(1)"}}
    assert plan["model.layers.0.self_attn.attn_sub_norm"]["in_src"] == {
        "hidden_states": {"tp": "R"}}


def test_sp_norms_inside_a_sequence_gathering_parent_see_the_whole_sequence() -> None:
    """With --sp the attention / MLP gather the sequence on entry (their projections are
    gathered colwise + split rowwise): the sub-norms inside run on whole sequences, so their
    weight's gradient is whole (not partial) while the layer norms' is partial."""
    config, _ = read_hf_config(FAMILIES / "bitnet")
    meta = json.loads(build_bundle(config, 2, True, None, "bitnet")["codegen_meta.json"])
    plan = meta["param_plan"]
    sub = plan["model.layers.0.self_attn.attn_sub_norm"]
    assert sub["in_src"] == {"hidden_states": {"tp": "R"}} and "partial_grad_params" not in sub
    assert plan["model.layers.0.input_layernorm"]["partial_grad_params"] == ["weight"]
    assert plan["model.layers.0.self_attn"]["in_src"] == {"hidden_states": {"tp": "S(1)"}}


def test_cpmant_position_bias_is_sharded_on_its_heads() -> None:
    plan = plan_of("cpmant")
    assert plan["cpmant.position_bias"] == {
        "params": {"relative_attention_bias": {"tp": "S(1)"}}, "is_boundary": False}
    attn = plan["cpmant.encoder.layers.0.self_att.self_attention"]
    assert attn["in_dst"]["position_bias"] == {"tp": "S(1)"}
    assert attn["in_dst"]["hidden_kv"] == {"tp": "R"} and attn["tp_divide_attrs"] == ["num_heads"]
    ffn = plan["cpmant.encoder.layers.0.ffn.ffn"]
    assert ffn["params"]["w_in.w_0.weight"] == {"tp": "S(0)"}
    assert ffn["params"]["w_out.weight"] == {"tp": "S(1)"}


@pytest.mark.parametrize("family", ["opt", "biogpt", "xglm"])
def test_sp_is_refused_from_the_plan_where_no_rule_file_says_why(family: str) -> None:
    """OPT, BioGPT and XGLM (no rule file since the dataflow seeds split them): their
    decoder layer holds fc1/fc2 and is the boundary that gathers the sequence under --sp,
    while the attention region inside it is lifted sequence-sharded: refused, naming it
    (tests/generate/test_pair_seeds.py has the rule's own test)."""
    config, _ = read_hf_config(FAMILIES / family)
    with pytest.raises(PlanError) as info:
        build_bundle(config, 2, True, None, family)
    (found, *_) = info.value.findings
    assert found.code == "generate.sp_nested_gather", found
    assert found.where == f"{LAYER0[family]}.self_attn", found


@pytest.mark.parametrize("family", ["musicgen", "musicgen_melody"])
def test_musicgen_splits_its_codebook_heads_and_keeps_the_uneven_embeddings(family: str) -> None:
    """MusicGen's decoder has one LM head per codebook: each is gathered colwise. Its
    codebook embeddings have vocab_size + 1 rows (uneven over tp 2): replicated. A model
    type (musicgen_decoder) gets the rules of the package that defines its classes."""
    notes: list[str] = []
    plan = plan_of(family, notes=notes)
    assert f"{family}_decoder is built from the classes of transformers.models.{family}" \
        in notes[0]
    config, _ = read_hf_config(FAMILIES / family)
    for i in range(config["num_codebooks"]):
        head = plan[f"lm_heads.{i}"]
        assert head["params"] == {"weight": {"tp": "S(0)"}}
        assert head["out_src"] == {"output": {"tp": "S(-1)"}}
    embeds = {f"{fqn}.{rel}": p for fqn, entry in plan.items()
              if fqn.startswith("model.decoder.embed_tokens")
              for rel, p in entry["params"].items()}
    assert len(embeds) == config["num_codebooks"]
    assert all(p == {"tp": "R"} for p in embeds.values())
    layer = "model.decoder.layers.0"
    assert plan[f"{layer}.fc1"]["out_dst"] == {"output": {"tp": "S(-1)"}}
    assert plan[f"{layer}.fc2"]["in_src"] == {"input": {"tp": "S(-1)"}}
    with pytest.raises(PlanError, match="sinusoidal position"):
        build_bundle(config, 2, True, None, family)


def test_moshi_attention_wrapped_linears_split_and_odd_embedding_replicated() -> None:
    """Moshi's projections are nn.Linear wrapped in MoshiLinear (`.linear`): the recipe
    places the attention as one boundary over them; fc1 packs gate|up (two halves); the
    embedding has vocab_size + 1 rows: replicated, where the default would be refused as
    an uneven shard."""
    plan = plan_of("moshi")
    attn = plan["model.layers.0.self_attn"]
    assert attn["params"] == {f"{p}_proj.linear.weight": {"tp": "S(1)" if p == "o" else "S(0)"}
                              for p in "qkvo"}
    assert attn["out_src"] == {"output": {"tp": "P(sum)"}}
    assert attn["tp_divide_attrs"] == ["num_heads", "num_key_value_heads"]
    assert plan["model.layers.0.mlp"]["params"]["fc1.weight"] == {"tp": "SS(0,2)"}
    assert plan["model.embed_tokens"]["params"] == {"weight": {"tp": "R"}}
    assert plan["lm_head"]["params"] == {"weight": {"tp": "S(0)"}}


def test_xlstm_splits_its_heads_with_the_config_count_and_the_recurrent_state() -> None:
    """xLSTM's mLSTM layer reshapes by ``config.num_heads``: divided on the layer's own copy
    of the config (tests/runtime/test_divide_attrs.py); its recurrent state enters split on
    the heads and leaves gathered (the cache holds every head); the multi-head norm's
    weight is sharded with v. weight_mode fused packs q|k|v|o unequally: the layer stays
    replicated there, the feed-forward split."""
    layer = plan_of("xlstm")["backbone.blocks.0.mlstm_layer"]
    assert {"config.num_heads", "multihead_norm.num_heads", "v_dim", "qk_dim"} <= set(
        layer["tp_divide_attrs"])
    assert layer["in_dst"]["state"] == {"tp": "S(1)"}
    assert layer["out_src"] == {"output": {"tp": "P(sum)"}, "state": {"tp": "S(1)"}}
    assert layer["out_dst"]["state"] == {"tp": "R"}
    assert layer["params"]["multihead_norm.weight"] == {"tp": "S(0)"}
    assert layer["params"]["igate_preact.bias"] == {"tp": "S(0)"}
    bias = plan_of("xlstm", use_bias=True)["backbone.blocks.0.mlstm_layer"]["params"]
    assert bias["multihead_norm.bias"] == {"tp": "S(0)"} and bias["out_proj.bias"]["tp"] == "R"
    notes: list[str] = []
    fused = plan_of("xlstm", notes=notes, weight_mode="fused")
    assert "q|k|v|o in unequal blocks" in notes[0]
    assert not sharded_in(fused, "backbone.blocks.0.mlstm_layer")
    assert fused["backbone.blocks.0.ffn"]["params"]["proj_up_gate_z.weight"] == {"tp": "SS(0,2)"}
    assert fused["backbone.blocks.0.ffn"]["tp_divide_attrs"] == ["up_proj_dim"]
