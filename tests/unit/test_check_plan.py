"""The ``plan`` check: semantics of a frozen plan that the schema cannot express."""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
sys.path.append(str(FIXTURES))
import verify_fixtures as vf  # noqa: E402

ATTN = "model.layers.0.self_attn"


def plan(meta: dict[str, Any]) -> Any:
    return vf.run_check("plan", meta)


@pytest.mark.parametrize("gen", ["g2", "g3"])
def test_reference_metas_pass_with_ep_keys_and_list_matches(gen: str) -> None:
    result = plan(vf.qwen3_moe_meta(gen))
    assert result.status == "pass"
    assert vf.codes(result, "error") == set() and vf.codes(result, "warning") == set()
    assert ("plan.negative_shard_dim", "/param_plan/lm_head/out_src/output/tp") in vf.codes(
        result, "info")


@pytest.mark.parametrize("gen", ["g2", "g3"])
def test_reference_targets_are_foreign_unless_trusted(gen: str) -> None:
    """The existing system's own factories in its own metas: a warning, not silently trusted;
    the same names in a meta hpcodegen wrote are errors; trusted, they are clean (the
    ``targets`` check; its codes keep their ``plan.`` prefix)."""
    meta = vf.qwen3_moe_meta(gen)
    result = vf.run_check("targets", meta, allowed_targets=())
    found = {w for c, w in vf.codes(result, "warning") if c == "plan.foreign_system_target"}
    # its MoE compute is its own code; its all-gather CP attention (sdpa_qkv) is a registry
    # name of hpcodegen's own CP attention (same algorithm), so it is no foreign target
    assert any(w.endswith("/local_compute_fn/_target_") for w in found)
    assert not any("inner_wrapper" in w for w in found)
    assert not vf.codes(result, "error")
    ours = dict(meta, generator={"name": "hpcodegen", "version": "0"})
    result = vf.run_check("targets", ours, allowed_targets=())
    assert "plan.foreign_target" in {c for c, _ in vf.codes(result, "error")}
    result = vf.run_check("targets", meta)  # trusted: --allow-target hyper_parallel
    assert not {c for c, _ in vf.codes(result, "warning") if "target" in c}


def test_llama_meta_passes() -> None:
    result = plan(vf.llama_meta())
    assert result.status == "pass" and not vf.codes(result, "error")


def test_unknown_top_level_key_is_info() -> None:
    meta = vf.llama_meta()
    meta["trainer_notes"] = "x"
    result = plan(meta)
    assert result.status == "pass"
    assert ("plan.unknown_key", "/trainer_notes") in vf.codes(result, "info")


def test_empty_plan_is_an_error_even_without_coverage_claim() -> None:
    meta = vf.llama_meta()
    meta.update(param_plan={}, boundary_classes={}, tied_pairs=[], frozen_sharded_params=[])
    meta["covered"]["sharding_plan"] = False
    assert vf.codes(plan(meta), "error") == {("plan.empty", "/param_plan")}


def test_duplicate_injection_target_and_unplanned_list_member() -> None:
    meta = vf.qwen3_moe_meta("g3")
    meta["injections"][0]["match"] = [ATTN, "model.layers.9.self_attn"]
    meta["injections"].append({"match": ATTN, "inner_target": "self"})
    assert vf.codes(plan(meta), "error") == {
        ("plan.injection_unplanned", "/injections/0/match/1"),
        ("plan.injection_duplicate", "/injections/2/match"),
        # layer 1's attention lost its CP wrapper (the cp rules, hpcodegen/checks/cp.py)
        ("plan.cp_unwrapped_attention", "/param_plan/model.layers.1.self_attn"),
    }


def test_tied_pairs_with_other_placements_and_self_tie_are_errors() -> None:
    meta = vf.llama_meta()
    meta["param_plan"]["lm_head"]["params"]["weight"] = {"tp": "S(1)"}
    meta["tied_pairs"].append(["lm_head.weight", "lm_head.weight"])
    meta["frozen_sharded_params"] = sorted(meta["frozen_sharded_params"])
    result = plan(meta)
    assert ("plan.tied_placements_differ", "/tied_pairs/0/1") in vf.codes(result, "error")
    assert ("plan.tied_self", "/tied_pairs/1") in vf.codes(result, "error")


def test_frozen_sharded_params_must_agree_with_the_plan() -> None:
    meta = vf.llama_meta()
    meta["frozen_sharded_params"].remove("lm_head.weight")
    meta["frozen_sharded_params"].append("model.norm.weight")
    last = len(meta["frozen_sharded_params"]) - 1
    assert vf.codes(plan(meta), "warning") == {
        ("plan.frozen_sharded_missing", "/param_plan/lm_head/params/weight"),
        ("plan.frozen_sharded_replicated", f"/frozen_sharded_params/{last}"),
    }


def test_mesh_axes_against_parallel_dims() -> None:
    meta = vf.qwen3_moe_meta("g3")
    meta["mesh_dim_names"] = ["cp", "tp", "dp", "cp"]
    meta["parallel_dims"]["cp_size"] = 1
    result = plan(meta)
    assert ("plan.fsdp_axis", "/mesh_dim_names/2") in vf.codes(result, "warning")
    assert ("plan.duplicate_axis", "/mesh_dim_names/3") in vf.codes(result, "error")
    assert ("plan.size_one_axis", "/mesh_dim_names/0") in vf.codes(result, "info")


def test_ep_key_is_known_but_a_stray_axis_is_not() -> None:
    meta = vf.qwen3_moe_meta("g3")
    meta["param_plan"]["lm_head"]["params"]["weight"]["sp"] = "R"
    assert vf.codes(plan(meta), "error") == {
        ("plan.unknown_axis", "/param_plan/lm_head/params/weight/sp")}


def test_non_identity_boundary_without_class_warns() -> None:
    meta = vf.llama_meta()
    del meta["boundary_classes"][ATTN]
    result = plan(meta)
    assert vf.codes(result, "warning") == {("plan.boundary_without_class", f"/param_plan/{ATTN}")}


def test_deferred_bias_paths_are_relative_to_the_entry() -> None:
    meta = vf.llama_meta(layers=1)
    meta["param_plan"][ATTN]["deferred_bias_params"] = ["o_proj.bias"]
    assert vf.codes(plan(meta), "error") == {
        ("plan.deferred_bias_params_unplanned", f"/param_plan/{ATTN}/deferred_bias_params/0")}
    meta["param_plan"][ATTN]["params"]["o_proj.bias"] = {"tp": "R"}
    assert not vf.codes(plan(meta), "error")


def test_one_class_one_contract() -> None:
    meta = vf.llama_meta(layers=2)
    meta["param_plan"][ATTN]["deferred_bias_params"] = ["o_proj.bias"]
    assert ("plan.class_contract_differs", "/param_plan/model.layers.1.self_attn") in vf.codes(
        plan(meta), "error")


def test_special_handler_on_a_planned_parameter_passes() -> None:
    meta = vf.llama_meta()
    meta["special_handlers"] = {"model.embed_tokens.weight": "vocab_parallel"}
    assert not vf.codes(plan(meta), "error")


def test_entrypoint_missing_warns() -> None:
    meta = vf.llama_meta()
    meta["entrypoints"] = {}
    assert vf.codes(plan(meta), "warning") == {
        ("plan.no_entrypoint", "/entrypoints/parallelize")}


@pytest.mark.parametrize("broken", [
    {"param_plan": []}, {"param_plan": {"a": []}}, {"param_plan": {"a": {"params": [1]}}},
    {"param_plan": {"a": {"in_src": {"x": "R"}}}}, {"injections": {"match": 1}},
    {"injections": [{"match": 3}]}, {"tied_pairs": [1, [None, 2]]}, {"mesh_dim_names": 5},
    {"boundary_classes": {"a": 1}}, {"parallel_dims": []}, {"frozen_sharded_params": [1]},
])
def test_schema_invalid_shapes_never_crash(broken: dict[str, Any]) -> None:
    meta = copy.deepcopy(vf.llama_meta())
    meta.update(broken)
    result = plan(meta)
    assert not any(f.code.endswith(".internal") for f in result.findings)


@pytest.mark.parametrize("field", ["source", "parallel_dims", "generator", "param_plan"])
def test_signature_inputs_of_the_wrong_type_never_crash(field: str) -> None:
    meta = vf.llama_meta()
    meta[field] = ["not", "an", "object"]
    meta["generator"] = meta["generator"] if field != "generator" else {"name": "hpcodegen",
                                                                        "version": []}
    for name in ("plan", "targets", "outputs", "source", "signature"):
        result = vf.run_check(name, meta, hf_config=dict(vf.LLAMA_CONFIG))
        assert not any(f.code.endswith(".internal") for f in result.findings), result.findings


def test_a_parameter_planned_by_two_entries_is_an_error() -> None:
    meta = vf.llama_meta()
    meta["param_plan"][f"{ATTN}.q_proj"] = {"params": {"weight": {"tp": "S(1)"}},
                                            "is_boundary": False}
    errors = vf.codes(plan(meta), "error")
    assert ("plan.param_twice", f"/param_plan/{ATTN}.q_proj/params") in errors
