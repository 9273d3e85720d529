"""Where generate's plan comes from: transformers' plan or the structural seeds, the
package rules and the recipe, in that order of precedence (lazy torch: a meta model).

:func:`plan_sources` lifts them into ``param_plan`` entries and injection records;
:func:`model_rules` picks the package rules of a model (its model_type, the package its
classes come from, or a composite's sub-models). Split out of
:mod:`hpcodegen.generate.api`.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from hpcodegen.generate.layouts.experts import moe_experts, shard_experts
from hpcodegen.generate.layouts.layouts import LayoutReport, after_package_rules, megatron_layouts
from hpcodegen.generate.layouts.lift import lift_plan
from hpcodegen.generate.layouts.tied import tied_pairs, unify_tied_placements
from hpcodegen.generate.layouts.unplanned import replicate_uncovered
from hpcodegen.generate.seeds.fused_seeds import FusedSeeds, fused_seeds
from hpcodegen.generate.seeds.pair_seeds import finish_plan, refined_seeds, seed_flow
from hpcodegen.generate.seeds.seeds import plans_layers, seeds_note, structural_seeds
from hpcodegen.generate.sources.hf_plan import expand_rules, hf_rules
from hpcodegen.generate.sources.package_rules import (
    PackageRules,
    merged_rules,
    package_rules,
    rerooted,
)
from hpcodegen.generate.sources.recipe import apply_recipe, recipe_modules
from hpcodegen.plan.draft import DraftPlan


def tied_pairs_of(config: Mapping[str, Any], model: Any) -> list[list[str]]:
    """``[[source, tied]]`` parameter FQN pairs: every parameter the built model holds
    under two names (:func:`hpcodegen.generate.layouts.tied.tied_pairs`; transformers ties what the
    config asks for when it builds the model, embeddings and LM-head biases alike)."""
    del config  # the model, built from it, already says what is tied
    return tied_pairs(model)


def rules_scope(config: Mapping[str, Any], model: Any) -> Mapping[str, Any]:
    """The config the package rules are chosen and conditioned by: the text sub-config when
    the model was built from it (a composite config's causal LM: ``llama4`` ->
    ``llama4_text``), else the config itself."""
    text = config.get("text_config")
    built = getattr(getattr(model, "config", None), "model_type", None)
    if isinstance(text, Mapping) and built == text.get("model_type") != config.get("model_type"):
        return text
    return config


def plan_sources(model: Any, sp: bool, recipe: Sequence[Mapping[str, Any]] | None,
                 rules: PackageRules | None, ep: int = 1, loss_parallel: bool = False,
                 notes: list[str] | None = None
                 ) -> tuple[DraftPlan, list, list[str], LayoutReport]:
    """The lifted plan (a draft, ordered by FQN) and injection records: HF plan, package
    rules, recipe, in that order of precedence (last wins); experts split over ``ep``;
    every trainable parameter no rule names is replicated; the aliases of a tied parameter
    take its one sharded placement.
    The third value lists the ``experts`` modules (HF ``moe_tp_experts``), the fourth what
    the Megatron layouts pass split and kept (:mod:`hpcodegen.generate.layouts.layouts`).

    An HF plan rule that matches no module of this config (a hybrid's attention rules on a
    config without attention layers, a rule for another variant) is skipped, as transformers
    skips it, and named in ``notes``; a recipe rule matching nothing stays an error.
    """
    fqns = list(dict(model.named_modules()))
    params = [name for name, _ in model.named_parameters(remove_duplicate=False)]
    overridden = recipe_modules(recipe or [], fqns)
    hf, shipped = merged_rules(hf_rules(model), rules)
    shipped_modules = set(expand_rules(shipped, fqns, params, overridden, strict=False))
    unmatched: list[str] = []
    assignments = expand_rules(hf, fqns, params, overridden | shipped_modules, strict=False,
                               unmatched=unmatched)
    if unmatched and notes is not None:
        notes.append(f"HF plan: {len(unmatched)} rule(s) match no module of this config and "
                     f"are skipped (as transformers skips them): {', '.join(unmatched)}")
    replaced = rules is not None and rules.replace_hf_plan
    flow_of = functools.cache(lambda: seed_flow(model))  # one trace, for every pass
    seeding = not replaced and not plans_layers(model, hf)
    flow = flow_of() if seeding else None
    fused = fused_seeds(model, overridden | shipped_modules, sp, flow) if seeding else \
        FusedSeeds()
    assignments.update(fused.assignments)
    taken = overridden | shipped_modules | set(fused.assignments)
    seeds, paired = refined_seeds(model, hf, replaced, taken,
                                  structural_seeds(model, hf, replaced, taken, flow), flow)
    seeds = fused.settle(model, assignments, seeds)
    assignments.update(seeds)
    if notes is not None:
        if seeding and flow is None:
            notes.append("structural seeds: the model's forward does not run on meta "
                         "tensors, so no block is matched by the order of its calls (MLPs "
                         "by shape, projections split one by one); those stay replicated")
        notes.extend(seeds_note(model, seeds, paired.notes()) + fused.notes())
    layouts = megatron_layouts(model, assignments,
                               overridden | shipped_modules | paired.uncalled, flow_of)
    layouts.config_heads.update(fused.divide)
    if notes is not None:
        notes.extend(layouts.notes())
    assignments.update(expand_rules(shipped, fqns, params, overridden,
                                    origin="package", strict=False))
    after_package_rules(model, assignments, layouts, sp, ep)
    plan = lift_plan(model, assignments, sp, loss_parallel)
    finish_plan(plan, paired)
    for fqn, attrs in layouts.config_heads.items():
        if fqn in plan and attrs:
            plan[fqn].add_names("tp_divide_attrs", attrs)
    injections = apply_recipe(plan, list(rules.recipe) if rules else [], fqns)
    injections += apply_recipe(plan, recipe or [], fqns)
    injections += layouts.injections(plan)
    experts = moe_experts(assignments)
    if ep > 1:
        injections = shard_experts(model, plan, experts, ep, injections, sp)
    replicate_uncovered(model, plan, sp)
    unify_tied_placements(model, plan, sp)
    plan.sort()
    return plan, injections, experts, layouts


def model_rules(config: Mapping[str, Any], model: Any, tp: int) -> PackageRules | None:
    """The package rules of ``model``: those of its model_type (or of its modeling package),
    else those of the sub-models a composite builds from another family's classes (a
    language model at ``model.language_model`` built from family X's classes: X.yaml, its
    rules moved under it), so a family is described once, wherever it is embedded."""
    family = modeling_family(type(model))
    rules = package_rules(rules_scope(config, model), family, tp)
    if rules is not None:
        return rules
    own = getattr(getattr(model, "config", None), "model_type", None)
    found: list[PackageRules] = []
    taken: list[str] = []
    for fqn, sub in model.named_modules():
        sub_config = getattr(sub, "config", None)
        sub_family = modeling_family(type(sub))
        if (not fqn or sub_family in (None, family) or not hasattr(sub_config, "to_dict")
                or not hasattr(sub, "base_model_prefix")  # a model, not one of its layers
                or any(fqn.startswith(t + ".") for t in taken)):
            continue
        sub_rules = package_rules(sub_config.to_dict(), sub_family, tp)
        if sub_rules is None:
            continue
        prefix = getattr(sub, "base_model_prefix", "") or ""
        base = "" if prefix and hasattr(sub, prefix) else prefix  # a whole LM: rules as is
        found.append(rerooted(sub_rules, base, fqn, str(own)))
        taken.append(fqn)
    if len(found) <= 1:
        return found[0] if found else None
    return PackageRules(", ".join(r.file for r in found),
                        tuple(w for r in found for w in r.reasons), False,
                        tuple(x for r in found for x in r.tp_plan),
                        tuple(x for r in found for x in r.recipe),
                        tuple(x for r in found for x in r.unsplit_fields),
                        next((r.no_sp for r in found if r.no_sp), None))


def modeling_family(cls: type) -> str | None:
    """The transformers package that defines ``cls`` (``gpt2`` for GPT2LMHeadModel), None
    for a class from elsewhere: the key of the package rules of model_types that reuse
    another family's classes."""
    parts = cls.__module__.split(".")
    if len(parts) >= 3 and parts[:2] == ["transformers", "models"]:
        return parts[2]
    return None
