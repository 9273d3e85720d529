"""Predicted collectives per boundary, summaries, folding and install-time re-validation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hpcodegen.artifact.load import LoadedMeta
from hpcodegen.inspect.run import readable_plan
from hpcodegen.plan.codec import plan_from_meta
from hpcodegen.plan.fold import fold, format_ranges
from hpcodegen.plan.predict import PredOp, predict_plan, summarize
from hpcodegen.plan.revalidate import live_plan_axes, revalidate

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "inspect"


def load(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / name / "codegen_meta.json").read_text())


def by_fqn(meta: dict[str, Any]) -> dict[str, Any]:
    preds = predict_plan(plan_from_meta(meta))
    return {p.fqn: p for p in preds}


def test_llama_sp_ops_per_boundary() -> None:
    preds = by_fqn(load("llama_tp2_sp"))
    attn = preds["model.layers.1.self_attn"]
    assert attn.form == "tp_collective" and attn.cls == "LlamaAttention"
    assert attn.in_ops == (PredOp("hidden_states", "all_gather", 1, "tp"),)
    assert attn.out_ops == (PredOp("output", "reduce_scatter", 1, "tp", "sum"),)
    assert [(o.kind, o.dim) for o in attn.grad_ops] == [("reduce_scatter", 1), ("all_gather", 1)]
    assert preds["model.layers.0.input_layernorm"].form == "identity"
    assert preds["model.layers.0.input_layernorm"].in_ops == ()
    embed = preds["model.embed_tokens"]
    assert embed.in_ops == (PredOp("input", "identity"),)
    # token ids carry no gradient: only the output's backward all_gather remains
    assert [(o.name, o.kind) for o in embed.grad_ops] == [("output", "all_gather")]


def test_llama_sp_summary() -> None:
    preds = predict_plan(plan_from_meta(load("llama_tp2_sp")))
    s = summarize(preds)
    assert s.forms == {"tp_collective": 6, "identity": 5}
    assert s.per_forward == {("all_gather", "tp", 1): 5, ("reduce_scatter", "tp", 1): 5}
    assert s.per_backward == {("all_gather", "tp", 1): 5, ("reduce_scatter", "tp", 1): 5}
    assert s.opaque == {} and s.problems == ()


def test_llama_no_sp_summary() -> None:
    preds = predict_plan(plan_from_meta(load("llama_tp2")))
    s = summarize(preds)
    # lm_head (loss parallel: R -> R in, S(-1) kept out) is no no-op: its replicated input
    # all-reduces its partial gradient in the backward, so it is a tp_collective
    assert s.forms == {"tp_collective": 6, "params": 5}
    assert s.per_forward == {("all_reduce", "tp", None): 5}
    # the identity inputs of attention, MLP and lm_head all-reduce their partial gradients
    # (Megatron f)
    assert s.per_backward == {("all_reduce", "tp", None): 5}


def test_cp_tp_generic_and_opaque() -> None:
    preds = by_fqn(load("moe_cp2_tp2"))
    attn = preds["model.layers.2.self_attn"]
    assert attn.form == "generic" and attn.reasons == ("inner_wrapper injection",)
    assert attn.opaque == (("inner_wrapper", "hpcodegen.injections.sdpa_cp"),)
    norm = preds["model.norm"]
    assert [(o.axis, o.kind, o.dim) for o in norm.out_ops] == [("cp", "all_gather", 1),
                                                               ("tp", "all_gather", 1)]
    # replicated gradient back to S(1) on both axes: local chunks, no communication
    assert [(o.axis, o.kind) for o in norm.grad_ops] == [("cp", "chunk"), ("tp", "chunk")]
    s = summarize(list(preds.values()))
    assert s.opaque[("local_compute_fn", "hpcodegen.injections.ep_experts")] == [
        f"model.layers.{i}.mlp" for i in range(3)]
    assert s.forms["params"] == 3
    assert s.per_forward[("all_gather", "cp", 1)] == 1


def test_unreadable_entry_is_a_finding() -> None:
    """inspect-plan's plan without verify's gate: an entry the codec refuses is left out
    with an error naming it, the others are predicted."""
    meta = {"mesh_dim_names": ["tp"], "param_plan": {
        "a": {"in_src": {"x": {"tp": "Shard(1)"}}, "in_dst": {"x": {"tp": "R"}}},
        "b": "not an object",
        "c": {"in_src": {"x": "S(1)"}, "in_dst": {"x": {"tp": "R"}}},
        "d": {"in_src": {"x": {"tp": "S(1)"}}, "in_dst": {"x": {"tp": "R"}}},
    }}
    plan, problems = readable_plan(LoadedMeta(meta, Path("m.json"), Path(".")))
    assert list(plan.entries) == ["d"]
    assert [f.where for f in problems] == ["/param_plan/a", "/param_plan/b", "/param_plan/c"]
    assert all(f.code == "inspect.bad_entry" for f in problems)
    assert "cannot classify 'a': placement 'Shard(1)'" in problems[0].message
    assert [p.fqn for p in predict_plan(plan)] == ["d"]


def test_invalid_redistribution_is_a_warning() -> None:
    meta = {"mesh_dim_names": ["tp"], "param_plan": {
        "m": {"in_src": {"x": {"tp": "R"}}, "in_dst": {"x": {"tp": "P(sum)"}}}}}
    preds = predict_plan(plan_from_meta(meta))
    s = summarize(preds)
    assert preds[0].form == "generic"
    assert [f.code for f in s.problems] == ["inspect.invalid_redistribute"]
    assert s.per_forward == {}


# --- folding ----------------------------------------------------------------------------------

def test_format_ranges() -> None:
    assert format_ranges([0, 1, 2, 3]) == "0..3"
    assert format_ranges([5, 0, 1, 2, 7, 8]) == "0..2,5,7..8"
    assert format_ranges([4]) == "4"


def test_fold_layers_and_expand() -> None:
    preds = predict_plan(plan_from_meta(load("llama_tp2_sp")))
    rows = fold(preds)
    labels = {r.label: r.count for r in rows}
    assert labels["model.layers.{0..1}.self_attn"] == 2
    assert labels["model.layers.{0..1}.input_layernorm"] == 2
    assert labels["lm_head"] == 1
    assert sum(r.count for r in rows) == len(preds)
    assert [r.label for r in fold(preds, expand=True)] == [p.fqn for p in preds]


def _meta_grid(layers: int, experts: int, skip: tuple[int, int] | None = None) -> dict[str, Any]:
    e = {"in_src": {"x": {"tp": "S(1)"}}, "in_dst": {"x": {"tp": "R"}}}
    plan = {f"model.layers.{i}.mlp.experts.{j}": e for i in range(layers) for j in range(experts)
            if (i, j) != skip}
    return {"mesh_dim_names": ["tp"], "param_plan": plan}


def test_fold_full_grid_is_one_row() -> None:
    preds = predict_plan(plan_from_meta(_meta_grid(4, 3)))
    rows = fold(preds)
    assert [(r.label, r.count) for r in rows] == [("model.layers.{0..3}.mlp.experts.{0..2}", 12)]


def test_fold_partial_grid_splits_on_first_index() -> None:
    preds = predict_plan(plan_from_meta(_meta_grid(3, 2, skip=(1, 1))))
    rows = fold(preds)
    assert sum(r.count for r in rows) == 5
    assert {r.label for r in rows} == {"model.layers.0.mlp.experts.{0..1}",
                                       "model.layers.1.mlp.experts.0",
                                       "model.layers.2.mlp.experts.{0..1}"}


def test_fold_keeps_different_contracts_apart() -> None:
    meta = load("llama_tp2_sp")
    meta["injections"] = [{"match": "model.layers.1.self_attn", "inner_wrapper": "sdpa_hf"}]
    preds = predict_plan(plan_from_meta(meta))
    labels = [r.label for r in fold(preds)]
    assert "model.layers.0.self_attn" in labels and "model.layers.1.self_attn" in labels
    assert "model.layers.{0..1}.mlp" in labels


def test_fold_leading_zero_is_not_an_index() -> None:
    meta = {"mesh_dim_names": ["tp"], "param_plan": {
        n: {"in_src": {"x": {"tp": "S(1)"}}, "in_dst": {"x": {"tp": "R"}}}
        for n in ("h.01.a", "h.1.a")}}
    preds = predict_plan(plan_from_meta(meta))
    assert len(fold(preds)) == 2


# --- re-validation on a live mesh -------------------------------------------------------------

def test_live_plan_axes_keep_live_order_and_overlap() -> None:
    cp_tp = plan_from_meta({"mesh_dim_names": ["cp", "tp"]})
    assert live_plan_axes(cp_tp, ("tp", "dp", "cp")) == ("tp", "cp")
    assert live_plan_axes(cp_tp, ("tp",)) == ("tp",)
    assert live_plan_axes(plan_from_meta({}), ("dp", "tp")) == ("dp", "tp")


def test_same_mesh_or_larger_tp_changes_nothing() -> None:
    meta = load("llama_tp2_sp")
    assert revalidate(plan_from_meta(meta), ("tp",), {"tp": 2}) == []
    assert revalidate(plan_from_meta(meta), ("dp", "tp"), {"dp": 8, "tp": 4}) == []


def test_tp_of_size_one_is_a_no_op_install() -> None:
    """As the runtime: no plan axis of size > 1 -> nothing installed, forwards as generated."""
    changes = revalidate(plan_from_meta(load("llama_tp2_sp")), ("tp",), {"tp": 1})
    assert {c.fqn for c in changes} == {"model.embed_tokens", "lm_head",
                                        *(f"model.layers.{i}.{m}" for i in range(2)
                                          for m in ("self_attn", "mlp"))}
    assert all((c.frozen_form, c.live_form, c.effective_form)
               == ("tp_collective", "identity", "identity") for c in changes)
    assert "exact no-op" in changes[0].reason
    changes = revalidate(plan_from_meta(load("llama_tp2_sp")), ("cp",), {"cp": 2})
    assert changes[0].effective_form == "identity"


def test_mesh_without_tp_has_no_lowerer() -> None:
    meta = load("llama_tp2_sp")
    meta["mesh_dim_names"] = ["cp", "tp"]  # a plan over cp and tp, run where only cp is live
    changes = revalidate(plan_from_meta(meta), ("cp",), {"cp": 2})
    # nothing moves on cp: the generated forwards run as they are (their tp calls no-ops)
    assert changes and all(c.effective_form == "identity" for c in changes)
    assert "every transition is identity" in changes[0].reason


def test_dropping_cp_makes_generic_lowerable_but_it_stays_generic() -> None:
    changes = revalidate(plan_from_meta(load("moe_cp2_tp2")), ("tp",), {"tp": 4})
    assert [(c.fqn, c.frozen_form, c.live_form, c.effective_form) for c in changes] == [
        ("model.norm", "generic", "tp_collective", "generic")]


def test_frozen_identity_that_the_live_mesh_would_need_is_flagged() -> None:
    meta = {"parallel_dims": {"tp_size": 2}, "param_plan": {
        "m": {"in_src": {"x": {"cp": "S(1)"}}, "in_dst": {"x": {"cp": "R"}}}}}
    changes = revalidate(plan_from_meta(meta), ("cp", "tp"), {"cp": 2, "tp": 2})
    assert [(c.frozen_form, c.live_form, c.effective_form) for c in changes] == [
        ("identity", "generic", "identity")]


@pytest.mark.parametrize("name", ["llama_tp2", "llama_tp2_sp", "moe_cp2_tp2"])
def test_revalidate_on_the_frozen_mesh_is_empty(name: str) -> None:
    meta = load(name)
    axes = tuple(meta["mesh_dim_names"])
    sizes = {a: meta["parallel_dims"][f"{a}_size"] for a in axes}
    assert revalidate(plan_from_meta(meta), axes, sizes) == []


def test_partial_grad_params_are_a_separate_backward_sync() -> None:
    meta = load("llama_tp2_sp")
    preds = predict_plan(plan_from_meta(meta))
    s = summarize(preds)
    listed = sum(len(e.get("partial_grad_params", ())) for e in meta["param_plan"].values())
    # one flattened all_reduce sums them all (runtime/grad_buckets.py)
    assert listed == 5 and s.grad_sync == {("all_reduce", "tp", None): 1}
    assert s.grad_sync_params == listed
    assert ("all_reduce", "tp", None) not in s.per_backward  # not a boundary transition
    by = {p.fqn: p for p in preds}
    assert by["model.norm"].grad_sync == ("weight",) and by["lm_head"].grad_sync == ()
    assert summarize(predict_plan(plan_from_meta(load("llama_tp2")))).grad_sync == {}


def test_splitting_boundary_with_identity_transitions_reduces_its_input_grad() -> None:
    """lm_head of a loss-parallel plan (weight S(0), input R -> R, output S(-1) -> S(-1)):
    every transition is identity forward, but the replicated input's gradient is partial, so
    the boundary is a tp_collective whose input all-reduces in the backward (it used to be
    classified identity and flagged by ``unreduced_grad_findings``)."""
    from hpcodegen.plan.predict import unreduced_grad_findings

    meta = load("llama_tp2")
    preds = predict_plan(plan_from_meta(meta))
    lm_head = {p.fqn: p for p in preds}["lm_head"]
    assert lm_head.form == "tp_collective"
    assert [o.kind for o in lm_head.grad_ops if o.communicates] == ["all_reduce"]
    assert unreduced_grad_findings(plan_from_meta(meta), preds, tp_live=True) == []


def test_nested_identity_inside_a_splitting_boundary_is_fine() -> None:
    meta = {"mesh_dim_names": ["tp"], "param_plan": {
        "blk": {"params": {"w": {"tp": "S(0)"}}, "in_src": {"x": {"tp": "R"}},
                "in_dst": {"x": {"tp": "R"}}, "out_src": {"output": {"tp": "P(sum)"}},
                "out_dst": {"output": {"tp": "R"}}},
        "blk.proj": {"params": {"weight": {"tp": "S(0)"}}, "in_src": {"input": {"tp": "R"}},
                     "in_dst": {"input": {"tp": "R"}}, "out_src": {"output": {"tp": "S(-1)"}},
                     "out_dst": {"output": {"tp": "S(-1)"}}},
    }}
    from hpcodegen.plan.predict import unreduced_grad_findings

    preds = predict_plan(plan_from_meta(meta))
    assert unreduced_grad_findings(plan_from_meta(meta), preds, tp_live=True) == []
    assert {p.fqn: p.form for p in preds}["blk.proj"] == "identity"  # blk reduces it
    del meta["param_plan"]["blk"]
    preds = predict_plan(plan_from_meta(meta))
    # alone, blk.proj reduces its own input gradient (promoted to a tp_collective)
    assert {p.fqn: p.form for p in preds}["blk.proj"] == "tp_collective"
    assert unreduced_grad_findings(plan_from_meta(meta), preds, tp_live=True) == []
