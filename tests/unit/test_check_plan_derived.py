"""The ``plan`` check derives what the placements decide and refuses a meta that declares
otherwise (issue 23): partial gradients, partial outputs, ``tp_rank0_params``, ``ep_size``,
transitions the runtime cannot run. Hand edits of generated metas, as an attacker or a
careless reviewer would make them; the signature is recomputed."""

from __future__ import annotations

import copy
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
sys.path.append(str(FIXTURES))
import verify_fixtures as vf  # noqa: E402

ATTN = "model.layers.0.self_attn"
NORM = "model.layers.0.input_layernorm"


def _errors(meta: dict[str, Any]) -> set[tuple[str, str]]:
    return vf.codes(vf.run_check("plan", vf._sign(meta)), "error")


def _example(name: str) -> dict[str, Any]:
    return json.loads((EXAMPLES / name / "codegen_meta.json").read_text())


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.glob("*_tp*")))
def test_every_generated_example_agrees_with_the_derivation(name: str) -> None:
    assert _errors(_example(name)) == set()


def _set(fqn: str, key: str, value: Any) -> Callable[[dict], None]:
    def edit(meta: dict) -> None:
        meta["param_plan"][fqn][key] = value
    return edit


def _drop(fqn: str, key: str) -> Callable[[dict], None]:
    return lambda meta: meta["param_plan"][fqn].pop(key)


def _out_partial_from_replicated(meta: dict) -> None:
    """lm_head with its weight replicated, yet a partial output reduced over tp."""
    head = meta["param_plan"]["lm_head"]
    head["params"]["weight"]["tp"] = "R"
    head["out_src"]["output"]["tp"] = "P(sum)"
    head["out_dst"]["output"]["tp"] = "R"


CASES: dict[str, tuple[str, Callable[[dict], None], tuple[str, str]]] = {
    # whole gradients summed over tp
    "a full-gradient norm listed (no sp)": (
        "llama_tp2", _set("model.norm", "partial_grad_params", ["weight"]),
        ("plan.partial_grad_full", "/param_plan/model.norm/partial_grad_params")),
    "a sharded weight listed": (
        "llama_tp2", _set(ATTN, "partial_grad_params", ["q_proj.weight"]),
        ("plan.partial_grad_sharded", f"/param_plan/{ATTN}/partial_grad_params")),
    # partial gradients left alone
    "an sp norm unlisted": (
        "llama_tp2_sp", _drop(NORM, "partial_grad_params"),
        ("plan.partial_grad_missing", f"/param_plan/{NORM}/partial_grad_params")),
    "a qwen3 q_norm unlisted": (
        "qwen3_tp2", _set(ATTN, "partial_grad_params", ["k_norm.weight"]),
        ("plan.partial_grad_missing", f"/param_plan/{ATTN}/partial_grad_params")),
    # outputs
    "a partial output from replicated weights": (
        "llama_tp2", _out_partial_from_replicated,
        ("plan.partial_output_unsplit", "/param_plan/lm_head/out_src/output/tp")),
    "a norm's output declared partial": (
        "llama_tp2", lambda m: m["param_plan"]["model.norm"]["out_src"]["output"].update(
            tp="P(sum)"),
        ("plan.partial_output_unsplit", "/param_plan/model.norm/out_src/output/tp")),
    "a redistribution to Partial": (
        "llama_tp2", lambda m: m["param_plan"]["lm_head"]["out_dst"]["output"].update(
            tp="P(sum)"),
        ("plan.invalid_redistribute", "/param_plan/lm_head/out_dst/output")),
    # tp rank 0
    "rank-0 parameters of an unsplit boundary": (
        "llama_tp2", _set("model.norm", "tp_rank0_params", ["weight"]),
        ("plan.rank0_unsplit", "/param_plan/model.norm/tp_rank0_params")),
    "a sharded rank-0 parameter": (
        "llama_tp2", _set(ATTN, "tp_rank0_params", ["o_proj.weight"]),
        ("plan.rank0_sharded", f"/param_plan/{ATTN}/tp_rank0_params")),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_hand_edit_the_placements_contradict_is_refused(case: str) -> None:
    example, edit, want = CASES[case]
    meta = _example(example)
    edit(meta)
    assert want in _errors(meta)


def test_every_replicated_parameter_of_a_rank0_region_is_listed() -> None:
    """An experts region split over tp with two whole biases, one listed: the other would
    be applied to each rank's partial output (counted tp times)."""
    meta = vf.llama_meta()
    mlp = meta["param_plan"]["model.layers.0.mlp"]
    mlp["params"].update({"up_bias": {"tp": "R"}, "down_bias": {"tp": "R"}})
    mlp["tp_rank0_params"] = ["down_bias"]
    mlp["partial_grad_params"] = ["down_bias", "up_bias"]
    assert ("plan.rank0_incomplete", "/param_plan/model.layers.0.mlp/tp_rank0_params") in \
        _errors(meta)
    mlp["tp_rank0_params"] = ["down_bias", "up_bias"]
    assert not {c for c, _ in _errors(meta) if c.startswith("plan.rank0")}


def _experts(meta: dict, ep_size: int, injection_size: int | None) -> dict:
    meta = copy.deepcopy(meta)
    meta["parallel_dims"]["ep_size"] = ep_size
    mlp = meta["param_plan"]["model.layers.0.mlp"]
    for named in mlp["params"].values():
        named["ep"] = "S(0)"
    if injection_size is not None:
        meta["injections"] = [{"match": "model.layers.0.mlp", "ep_size": injection_size,
                               "local_compute_fn": {
                                   "_target_": "hpcodegen.runtime.moe.ep_dispatch"}}]
    return meta


def test_expert_placements_and_ep_size_agree() -> None:
    base = vf.llama_meta()
    assert not {c for c, _ in _errors(_experts(base, 2, 2)) if c.startswith("plan.ep")}
    assert "plan.ep_placement_without_ep" in {c for c, _ in _errors(_experts(base, 1, None))}
    assert "plan.ep_size_mismatch" in {c for c, _ in _errors(_experts(base, 1, 2))}
    assert "plan.ep_size_mismatch" in {c for c, _ in _errors(_experts(base, 4, 2))}
    assert "plan.ep_dispatch_mismatch" in {c for c, _ in _errors(_experts(base, 2, None))}
    dense = copy.deepcopy(base)
    dense["parallel_dims"]["ep_size"] = 2
    assert "plan.ep_without_experts" in {c for c, _ in _errors(dense)}


def test_another_generators_meta_is_noted_not_refused() -> None:
    """The existing system writes no partial_grad_params and may keep ep placements at
    ep 1: noted (info) and warned, never an error, so its real metas still validate."""
    meta = vf.qwen3_moe_meta("g3")
    result = vf.run_check("plan", meta)
    assert result.status == "pass"
    meta = _experts(vf.llama_meta(), 1, None)
    meta.pop("generator")
    found = vf.run_check("plan", meta)
    assert "plan.ep_placement_without_ep" in {c for c, _ in vf.codes(found, "warning")}
    assert not {c for c, _ in vf.codes(found, "error") if c.startswith("plan.ep")}
