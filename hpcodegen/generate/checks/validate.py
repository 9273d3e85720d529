"""Checks a plan must pass before it is frozen: coverage, class contracts, divisibility.

Each failure is a :class:`~hpcodegen.errors.PlanError` (exit 1) naming the parameter, the
module or the config field, so nothing is skipped silently.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Set
from dataclasses import replace
from typing import Any

from hpcodegen.errors import Finding, PlanError, Severity, error
from hpcodegen.plan.codec import entry_to_json
from hpcodegen.plan.coverage import params_planned_twice, trainable_names, uncovered
from hpcodegen.plan.entry import contract_differences, join_fqn
from hpcodegen.plan.tp_divisible import MISSING, divide_attr_findings, tp_divisibility
from hpcodegen.plan.types import PlanEntry

#: the typed entries of generate's draft plan (:meth:`hpcodegen.plan.draft.DraftPlan.view`)
Entries = Mapping[str, PlanEntry]


def check_divisible(config: Mapping[str, Any], tp: int, unsplit: Collection[str] = (),
                    plan: Entries | None = None) -> None:
    """Refuse a config whose sizes do not divide ``tp``: PlanError naming the fields.

    The rule is :func:`hpcodegen.plan.tp_divisible.tp_divisibility`, the one verify's
    ``model`` check and inspect-plan apply; with ``plan``, the head counts of the
    sub-configs and held configs it divides too. Its warnings (an MLP width or vocab that
    torch would shard unevenly) are refused here: the generator only emits even shards.
    """
    problems = [replace(f, severity=Severity.ERROR)
                for f in tp_divisibility(config, tp, "generate", unsplit=unsplit,
                                         plan=plan)]
    if problems:
        raise PlanError(problems)


def check_even_shards(model: Any, plan: Entries, tp: int) -> None:
    """Refuse a plan with a tp shard of uneven size (:func:`uneven_shards`) or a
    ``tp_divide_attrs`` count tp does not divide (:func:`indivisible_attrs`): PlanError."""
    problems = uneven_shards(model, plan, tp) + indivisible_attrs(model, plan, tp)
    if problems:
        raise PlanError(problems)


def uneven_shards(model: Any, plan: Entries, tp: int) -> list[Finding]:
    """An error for every parameter the plan shards on tp (``S(d)``, ``SS(d,f)``) whose dim
    does not divide evenly (``SS(d,f)``: into ``f`` blocks, each split over tp).

    The config-size rule (:func:`check_divisible`) misses dims no config field names (a
    packed projection of unequal blocks, Mamba-2's ``in_proj``); torch would shard them
    unevenly and a gathered output could not be all-gathered (gloo aborts the rank).
    """
    from hpcodegen.placement import StridedShard, shard_dim

    found: list[Finding] = []
    params = dict(model.named_parameters(remove_duplicate=False))
    for fqn, entry in plan.items():
        for rel, named in (entry.params or {}).items():
            placement = named.get("tp")
            param = params.get(join_fqn(fqn, rel))
            if placement is None or param is None:
                continue
            dim = shard_dim(placement)
            if dim is None or tp < 2 or not -param.dim() <= dim < param.dim():
                continue
            factor = placement.split_factor if isinstance(placement, StridedShard) else 1
            size = int(param.shape[dim])
            if size % (factor * tp):
                blocks = f" in {factor} blocks" if factor > 1 else ""
                found.append(error(
                    "generate.uneven_shard", join_fqn(fqn, rel),
                    f"{placement} splits dim {dim} of size {size}{blocks} over tp_size = {tp} "
                    "unevenly; the generator only emits even shards",
                    expected=f"a size divisible by {factor * tp}",
                    hint="choose a tp size that divides it"))
    return found


def indivisible_attrs(model: Any, plan: Entries, tp: int) -> list[Finding]:
    """An error for every ``tp_divide_attrs`` count of the built model that is missing or
    that tp does not divide: :func:`hpcodegen.plan.tp_divisible.divide_attr_findings`, the
    rule verify's ``model`` check and the runtime apply, on the modules themselves (BLT's
    stacks size their attention by sub-configs of their own)."""
    def resolve(fqn: str, attr: str) -> Any:
        try:  # through modules or a held object (xLSTM's ``mlstm_layer.config.num_heads``)
            value = model.get_submodule(fqn)
            for part in attr.split("."):
                value = getattr(value, part)
        except AttributeError:
            return MISSING
        return value

    if tp <= 1:
        return []
    return divide_attr_findings(plan, tp, resolve, "generate")


def check_coverage(model: Any, plan: Entries) -> None:
    """Every planned parameter is planned once and exists; every trainable one is covered.

    Coverage is :func:`hpcodegen.plan.coverage.uncovered` (the reference's rule: equal to a
    planned key or below one, tied weights counted once), the one verify's ``model`` check
    applies.
    """
    problems: list[Finding] = [
        error("generate.param_twice", full, f"parameter planned by both {first!r} and {second!r}")
        for full, first, second in params_planned_twice(plan)
    ]
    planned = {join_fqn(fqn, rel): fqn for fqn, entry in plan.items()
               for rel in entry.params or ()}
    for name in uncovered(trainable_names(model), planned):
        problems.append(error(
            "generate.param_not_covered", name,
            "trainable parameter is not covered by the plan",
            hint="add it with a recipe rule (params)"))
    params = dict(model.named_parameters(remove_duplicate=False))
    for full, fqn in planned.items():
        if full not in params:
            problems.append(error("generate.param_missing", f"/param_plan/{fqn}",
                                  f"planned parameter {full!r} does not exist in the model"))
    if problems:
        raise PlanError(problems)


def check_class_contracts(plan: Entries,
                          classes: Mapping[str, str], defined: Set[str] | None = None) -> None:
    """Every boundary FQN of one class carries the same contract (the emitter writes one).

    The rule is :func:`hpcodegen.plan.entry.contract_differences`, the one verify applies,
    to the classes the modeling file defines (``defined``; None: every class). A class it
    does not define (``nn.Linear``) is wrapped per instance, so its FQNs may differ.
    The rule compares the entries as the meta will write them (the codec's JSON).
    """
    first: dict[str, str] = {}
    problems = []
    for fqn, entry in plan.items():
        if not entry.boundary:
            continue
        cls = classes[fqn]
        if defined is not None and cls not in defined:
            continue
        if cls not in first:
            first[cls] = fqn
            continue
        other = plan[first[cls]]
        diff = contract_differences(entry_to_json(entry), entry_to_json(other))
        if diff:
            problems.append(error(
                "generate.class_contract", fqn,
                f"class {cls}: {fqn} and {first[cls]} declare different {', '.join(diff)}",
                hint="one class has one generated forward; give every instance the same "
                     "transitions"))
    if problems:
        raise PlanError(problems)


def check_sequence_parallel(plan: Entries,
                            classes: Mapping[str, str], per_token: Collection[str] = ()
                            ) -> None:
    """With ``--sp``: refuse a module whose replicated compute would see only its rank's
    slice of the sequence
    (:func:`hpcodegen.generate.layouts.unplanned.sequence_sharded_compute`), one finding per
    class, so that no plan the runtime cannot execute exactly is frozen.

    Modules inside a ``per_token`` module are accepted: a mixture-of-experts block (the
    parent of an ``experts`` module) routes each token on its own (transformers' experts
    take one row, expert indices and weights per token), so its router and gates compute
    the rank's tokens exactly; their gradient is partial, which the plan declares."""
    from hpcodegen.generate.layouts.unplanned import sequence_sharded_compute
    from hpcodegen.generate.sources.globs import relative_to

    seen: dict[str, list[str]] = {}
    for fqn in sequence_sharded_compute(plan):
        if any(relative_to(fqn, block) not in (None, "") for block in per_token):
            continue
        seen.setdefault(classes.get(fqn, "?"), []).append(fqn)
    problems = []
    for cls, fqns in sorted(seen.items(), key=lambda kv: kv[1][0]):
        more = f" (and {len(fqns) - 1} more)" if len(fqns) > 1 else ""
        problems.append(error(
            "generate.sp_replicated_compute", fqns[0],
            f"{fqns[0]} ({cls}){more}: no tp rule splits it (its parameters are replicated), "
            "so with sequence parallelism (--sp) it would run on its rank's slice of the "
            "sequence only; a token-mixing module (attention, convolution, recurrence) "
            "there is not exact",
            hint="split it with a recipe rule (--recipe), or generate without --sp"))
    if problems:
        raise PlanError(problems)
