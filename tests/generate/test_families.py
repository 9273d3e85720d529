"""generate on the dense families whose plans used to fail, one per class of failure.

Tiny configs (tests/fixtures/families, built by ``bench/coverage.py``'s shrinking rule from
each config class's defaults): the lifted plan is checked here, numerics in
tests/runtime/test_family_parity.py on real gloo ranks.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from artifact_memo import build_bundle

from hpcodegen.errors import PlanError
from hpcodegen.generate.api import GenerateArgs, run_generate
from hpcodegen.generate.sources.package_rules import PackageRules, _holds, package_rules
from hpcodegen.hf import read_hf_config

pytestmark = pytest.mark.slow

FAMILIES = Path(__file__).resolve().parents[1] / "fixtures" / "families"


def plan_of(family: str, tp: int = 2, sp: bool = False, recipe=None,
            notes: list[str] | None = None) -> dict:
    config, _ = read_hf_config(FAMILIES / family)
    if tp == 4:  # heads and kv heads must divide tp: 4 kv heads (as bench/coverage.py)
        config.update({k: 4 for k in ("num_key_value_heads", "num_kv_heads") if k in config})
    warned: list = []  # every family here splits its layers: no generate.no_layer_split
    files = build_bundle(config, tp, sp, recipe, family, notes=notes, warnings=warned)
    assert not warned, [w.render() for w in warned]
    return json.loads(files["codegen_meta.json"])["param_plan"]


def test_gathered_colwise_and_split_rowwise_are_their_own_boundaries() -> None:
    """Phi-3's fused qkv with 4 query and 2 key/value heads (no strided shard keeps each
    rank's query heads with their key/value heads): gathered output, then a rowwise taking
    R -> S(-1). Its fused gate_up is split per block (tests/generate/test_layouts.py)."""
    plan = plan_of("phi3")
    qkv = plan["model.layers.0.self_attn.qkv_proj"]
    assert qkv["params"] == {"weight": {"tp": "S(0)"}}
    assert qkv["out_src"] == {"output": {"tp": "S(-1)"}} and qkv["out_dst"] == {
        "output": {"tp": "R"}}
    o = plan["model.layers.0.self_attn.o_proj"]
    assert o["params"] == {"weight": {"tp": "S(1)"}}
    assert o["in_src"] == {"input": {"tp": "R"}} and o["in_dst"] == {"input": {"tp": "S(-1)"}}
    assert o["out_src"] == {"output": {"tp": "P(sum)"}} and o["out_dst"] == {
        "output": {"tp": "R"}}
    assert "model.layers.0.self_attn" not in plan  # the attention itself is replicated


def test_mixed_regions_and_gathered_pairs() -> None:
    """GLM-4: a colwise/rowwise attention region next to its fused gate_up MLP, which the
    HF plan gathers and the Megatron layout splits per block (a region too)."""
    plan = plan_of("glm4")
    assert plan["model.layers.0.self_attn"]["params"]["o_proj.weight"] == {"tp": "S(1)"}
    assert plan["model.layers.0.mlp"]["params"] == {
        "gate_up_proj.weight": {"tp": "SS(0,2)"}, "down_proj.weight": {"tp": "S(1)"}}


def test_a_fused_qkv_cut_into_three_blocks_is_packed_and_says_so() -> None:
    """GPT-2: no HF plan, no rule file; Conv1D sharded on its columns, q|k|v packed in three
    blocks (its forward splits c_attn's output by split_size: fused_seeds.py)."""
    notes: list[str] = []
    plan = plan_of("gpt2", notes=notes)
    assert notes[0].startswith("structural seeds:") and len(notes) == 2
    assert notes[1].startswith("fused projections: 2 block(s) split by the row order")
    attn = plan["transformer.h.0.attn"]
    assert attn["params"]["c_attn.weight"] == {"tp": "SS(1,3)"}  # Conv1D: (in, out)
    assert attn["params"]["c_attn.bias"] == {"tp": "SS(0,3)"}
    assert attn["params"]["c_proj.weight"] == {"tp": "S(0)"}
    assert attn["deferred_bias_params"] == ["c_proj.bias"]
    assert {"c_attn.nf", "split_size"} <= set(attn["tp_divide_attrs"])
    mlp = plan["transformer.h.0.mlp"]
    assert mlp["params"]["c_fc.weight"] == {"tp": "S(1)"} and "c_fc.nf" in mlp["tp_divide_attrs"]
    # position embeddings: no rule names them, so they are replicated
    assert plan["transformer.wpe"] == {"params": {"weight": {"tp": "R"}}, "is_boundary": False}


def test_generate_cli_prints_the_package_rules(tmp_path: Path) -> None:
    out, err = io.StringIO(), io.StringIO()
    code = run_generate(GenerateArgs(FAMILIES / "mamba", 2, tmp_path / "a"), out, err)
    assert code == 0, err.getvalue()
    assert "package rules hpcodegen/generate/rules/mamba.yaml (replace the HF " \
           "plan" in out.getvalue()
    out = io.StringIO()  # no rule file: the structural seeds say what they split
    code = run_generate(GenerateArgs(FAMILIES / "hunyuan_v1_dense", 2, tmp_path / "b"),
                        out, err)
    assert code == 0, err.getvalue()
    assert "structural seeds: transformers ships no TP plan for this model" in out.getvalue()


def test_fused_qkv_row_order_follows_the_config() -> None:
    """Falcon (no rule file): multi-query's fused rows (q heads, then one k and one v) keep
    the attention replicated; grouped kv heads ([q.., k, v] per group) split it colwise."""
    mq = plan_of("falcon")
    assert "transformer.h.0.self_attention" not in mq or not any(
        p.get("tp") != "R" for p in mq["transformer.h.0.self_attention"]["params"].values())
    assert mq["transformer.h.0.mlp"]["params"]["dense_h_to_4h.weight"] == {"tp": "S(0)"}
    gqa = plan_of("falcon_gqa")
    attn = gqa["transformer.h.0.self_attention"]
    assert attn["params"]["query_key_value.weight"] == {"tp": "S(0)"}
    assert {"num_heads", "num_kv_heads"} <= set(attn["tp_divide_attrs"])


def test_when_compares_config_fields() -> None:
    assert _holds({"a": True, "b": [False, None]}, {"a": True})
    assert not _holds({"a": True}, {"a": False})
    rules = package_rules({"model_type": "xlstm", "weight_mode": "single", "use_bias": True})
    assert isinstance(rules, PackageRules) and rules.replace_hf_plan
    assert "backbone.blocks.*.mlstm_layer.q" in dict(rules.tp_plan)
    assert package_rules({"model_type": "llama"}) is None
    assert package_rules({"model_type": "../schemas/x"}) is None


def test_user_recipe_wins_over_the_structural_seeds() -> None:
    """A recipe rule on the modules the seeds split replaces them (here: MLP replicated)."""
    recipe = [{"match": ["transformer.h.*.mlp.c_fc", "transformer.h.*.mlp.c_proj"],
               "params": {"weight": {"tp": "R"}, "bias": {"tp": "R"}}}]
    plan = plan_of("gpt2", recipe=recipe)
    assert plan["transformer.h.0.mlp.c_fc"]["params"]["weight"] == {"tp": "R"}
    assert "transformer.h.0.mlp" not in plan
    assert plan["transformer.h.0.attn"]["params"]["c_attn.weight"] == {"tp": "SS(1,3)"}


def test_unnamed_trainable_params_are_replicated_with_partial_grads() -> None:
    """Apertus' xIELU alpha_p/alpha_n sit between up_proj (colwise) and down_proj: R, and
    their gradient is partial over tp; with --sp too."""
    for sp in (False, True):
        mlp = plan_of("apertus", sp=sp)["model.layers.0.mlp"]
        assert mlp["params"]["act_fn.alpha_p"] == {"tp": "R"}
        assert {"act_fn.alpha_p", "act_fn.alpha_n"} <= set(mlp["partial_grad_params"])


def test_scaled_embedding_class_is_vocab_parallel() -> None:
    """Gemma's scaled word embedding (a class of the generated file) is row-sharded with a
    partial output reduced by its own boundary: the shape the runtime executes."""
    plan = plan_of("gemma")
    emb = plan["model.embed_tokens"]
    assert emb["params"] == {"weight": {"tp": "S(0)"}}
    assert emb["out_src"] == {"output": {"tp": "P(sum)"}}


@pytest.mark.parametrize("family", ["phi3", "gpt_neox", "falcon_gqa", "apertus", "gemma3_text",
                                    "cohere_compass_text"])
def test_tp4_and_sp(family: str) -> None:
    assert plan_of(family, tp=4)
    if family != "gpt2":  # refused: test_sp_refuses_a_model_that_reshapes_by_the_full_length
        assert plan_of(family, sp=True)


def test_rope_by_layer_type_decoder_splits_its_layers() -> None:
    """Cohere Compass (RoPE keyed by layer type, parallel attention + MLP): heads and MLP
    split over tp like any HF-planned decoder."""
    plan = plan_of("cohere_compass_text")
    attn = plan["model.layers.1.self_attn"]["params"]
    assert attn["q_proj.weight"] == {"tp": "S(0)"} and attn["o_proj.weight"] == {"tp": "S(1)"}
    mlp = plan["model.layers.1.mlp"]["params"]
    assert mlp["gate_proj.weight"] == {"tp": "S(0)"} and mlp["down_proj.weight"] == {"tp": "S(1)"}


def test_sp_refuses_a_model_that_reshapes_by_the_full_length() -> None:
    """GPT-2's model forward views its output by ``input_ids.shape``: on one rank's slice
    of the sequence the logits come back misshapen. The fake-tensor dry run of the plan's
    sequence transitions finds it at generate time and names the module."""
    with pytest.raises(PlanError, match=r"transformer \(GPT2Model\).*shape \(1, 16, 256\)"
                       r" instead of \(2, 8, 256\)") as exc:
        plan_of("gpt2", sp=True)
    assert {f.code for f in exc.value.findings} == {"generate.sp_shapes"}


def test_sp_refuses_replicated_compute_on_a_sequence_slice() -> None:
    """Falcon's multi-query attention has no rule (its fused q|k|v holds one kv head): with
    --sp it would attend within its rank's slice of the sequence. generate refuses, naming
    the module, instead of freezing a plan the runtime cannot execute exactly."""
    assert plan_of("falcon")  # without --sp: replicated attention is exact
    with pytest.raises(PlanError, match=r"self_attention\.dense \(FalconLinear\).*--sp") as exc:
        plan_of("falcon", sp=True)
    assert {f.code for f in exc.value.findings} == {"generate.sp_replicated_compute"}


def test_layer_norm_subclass_is_a_norm_with_every_gradient_partial_under_sp() -> None:
    """Nemotron's ``LayerNorm1P`` (a ``nn.LayerNorm`` subclass, weight and bias): a norm
    boundary like RMSNorm, both gradients partial with --sp (each rank sees its slice)."""
    plan = plan_of("nemotron", sp=True)
    norm = plan["model.layers.0.input_layernorm"]
    assert norm["in_src"] == {"input": {"tp": "S(1)"}}
    assert norm["partial_grad_params"] == ["bias", "weight"]


def test_sp_slices_a_per_token_embedding_after_computing_it_whole() -> None:
    """GPT-BigCode's learned position embedding ``wpe`` is added to the sequence-sharded
    token embedding: with --sp it is a boundary taking this rank's slice of its output."""
    wpe = plan_of("gpt_bigcode", sp=True)["transformer.wpe"]
    assert wpe["params"] == {"weight": {"tp": "R"}}
    assert wpe["out_src"] == {"output": {"tp": "R"}}
    assert wpe["out_dst"] == {"output": {"tp": "S(1)"}}
    assert plan_of("gpt_bigcode")["transformer.wpe"]["is_boundary"] is False  # no --sp


def test_package_rules_and_recipe_enter_the_input_digest() -> None:
    config, _ = read_hf_config(FAMILIES / "gpt2")
    a = json.loads(build_bundle(config, 2, False, None, "gpt2")["codegen_meta.json"])
    recipe = [{"match": "lm_head", "params": {"weight": {"tp": "S(0)"}}}]
    b = json.loads(build_bundle(config, 2, False, recipe, "gpt2")["codegen_meta.json"])
    assert a["yaml_sha256"] != b["yaml_sha256"]


def test_unpaired_rowwise_still_refused() -> None:
    """A colwise child with no closer anywhere is still an error naming the rule."""
    from hpcodegen.generate.layouts.lift import lift_plan
    from hpcodegen.generate.sources.hf_plan import expand_rules
    from hpcodegen.hf import build_meta_model

    config, _ = read_hf_config(FAMILIES / "phi3")
    model = build_meta_model(config)
    fqns = [n for n, _ in model.named_modules()]
    with pytest.raises(PlanError, match="no rowwise child"):
        lift_plan(model, expand_rules([("model.layers.*.mlp.gate_up_proj", "colwise")],
                                      fqns), False)
