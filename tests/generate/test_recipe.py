"""Recipe schema and rule semantics (pure: no model is built)."""

from __future__ import annotations

import pytest

from hpcodegen.errors import PlanError
from hpcodegen.generate.sources.recipe import apply_recipe, recipe_schema, validate_recipe
from hpcodegen.placement import PLACEMENT_PATTERN
from hpcodegen.plan.draft import DraftPlan, entries_to_json

FQNS = ["", "model", "model.layers.0.mlp", "model.layers.0.mlp.down_proj",
        "model.layers.1.mlp", "model.layers.1.mlp.down_proj", "lm_head"]


def _plan() -> dict:
    return {f"model.layers.{i}.mlp": {
        "params": {"down_proj.weight": {"tp": "S(1)"}, "down_proj.bias": {"tp": "R"}},
        "deferred_bias_params": ["down_proj.bias"], "partial_grad_params": ["down_proj.bias"],
        "is_boundary": True} for i in (0, 1)}


def test_schema_uses_the_placement_grammar() -> None:
    named = recipe_schema()["$defs"]["named_placement"]
    assert named["additionalProperties"]["pattern"] == PLACEMENT_PATTERN


def test_valid_recipe_passes_and_invalid_one_names_pointers() -> None:
    rules = [{"match": ["model.**.mlp"], "params": {"w": {"tp": "SS(0,2)"}},
              "injections": {"inner_wrapper": {"_target_": "pkg.mod.fn"}}}]
    assert validate_recipe(rules) == rules
    with pytest.raises(PlanError) as info:
        validate_recipe([{"params": {}}, {"match": "x", "out_src": {"o": {"tp": "S(x)"}}}])
    where = [f.where for f in info.value.findings]
    assert where == ["/0", "/1/out_src/o/tp"]
    assert info.value.exit_code == 1
    with pytest.raises(PlanError):
        validate_recipe({"rules": []})  # a list of rules, not an object


def test_rules_apply_in_order_and_win_over_the_hf_plan() -> None:
    draft = DraftPlan.from_json(_plan())
    rules = [
        {"match": "model.layers.*.mlp", "out_dst": {"output": {"tp": "R"}}},
        {"match": "model.layers.*.mlp.down_proj",
         "params": {"bias": {"tp": "R"}, "weight": {"tp": "S(1)"}}, "is_boundary": False},
        {"match": "lm_head", "injections": {"inner_target": "self"}},
        {"match": "lm_head", "injections": {"inner_wrapper": "sdpa_hf"}},
    ]
    injections = apply_recipe(draft, rules, FQNS)
    plan = entries_to_json(draft.view())
    assert plan["model.layers.0.mlp"] == {"params": {}, "is_boundary": True,
                                          "out_dst": {"output": {"tp": "R"}}}
    assert plan["model.layers.1.mlp.down_proj"]["params"]["bias"] == {"tp": "R"}
    assert injections == [{"match": "lm_head", "inner_target": "self",
                           "inner_wrapper": "sdpa_hf"}]


def test_rule_matching_nothing_names_index() -> None:
    with pytest.raises(PlanError, match=r"recipe rule 1 \(match 'model\.nope'\)"):
        apply_recipe(DraftPlan.from_json(_plan()),
                     [{"match": "lm_head"}, {"match": "model.nope"}], FQNS)
