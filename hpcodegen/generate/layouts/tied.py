"""Tied parameters get one placement (imports torch: reads a meta-device model).

A tied parameter is one tensor under several names (an embedding and the LM head, BERT's
``cls.predictions.bias`` and ``cls.predictions.decoder.bias``). The runtime makes every
alias share one local shard again after sharding (phase D), so every name must be planned
with the same placement, or the runtime refuses the plan. The rules differ by entry: the
output head's or the embedding's boundary shards its name, while an alias that no rule named
was planned replicated (``R``) in a parameter-only entry. As the reference system normalises
tied placements (``Shard`` takes precedence), the sharded placement is propagated to such
aliases; two different sharded placements, or a replicated alias that a boundary computes
with, cannot be reconciled and are refused, naming the names.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from hpcodegen.errors import PlanError, error
from hpcodegen.generate.layouts.entries import embedding_transitions
from hpcodegen.placement import REPLICATE, Shard
from hpcodegen.plan.draft import DraftPlan
from hpcodegen.plan.entry import join_fqn


def tied_groups(model: Any) -> list[list[str]]:
    """The names of every parameter the model holds under more than one name (in the
    model's parameter order), one list per tensor."""
    by_id: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(param), []).append(name)
    return [names for names in by_id.values() if len(names) > 1]


def tied_pairs(model: Any) -> list[list[str]]:
    """``[[first name, alias]]`` for every alias of a tied parameter (sorted)."""
    return sorted([names[0], alias] for names in tied_groups(model) for alias in names[1:])


def unify_tied_placements(model: Any, plan: DraftPlan, sp: bool = False) -> list[str]:
    """Give every alias of a tied parameter the one sharded placement its names carry;
    returns the aliases changed.

    An embedding alias whose weight becomes row-sharded (``S(0)``) becomes a vocab-parallel
    boundary like the one it is tied to (its lookup would otherwise miss rows: the runtime
    installs the masked lookup and its reduction only on such a boundary).

    Raises:
        PlanError: two names carry different sharded placements, or a name that must take
            the shard is planned replicated inside a boundary (its module computes with it).
    """
    where: dict[str, tuple[str, str]] = {}
    for fqn, entry in plan.items():
        for rel in entry.placements("params"):
            where[join_fqn(fqn, rel)] = (fqn, rel)
    changed: list[str] = []
    problems = []
    for names in tied_groups(model):
        planned = {n: dict(plan[where[n][0]].placement("params", where[n][1]) or {})
                   for n in names if n in where}
        sharded = {_key(p): p for p in planned.values()
                   if any(v != REPLICATE for v in p.values())}
        if not sharded or len({_key(p) for p in planned.values()}) == 1:
            continue
        listed = ", ".join(f"{n} {_show(p)}" for n, p in planned.items())
        if len(sharded) > 1:
            problems.append(error(
                "generate.tied_placements", names[0],
                f"tied parameters (one tensor) are planned with different sharded placements: "
                f"{listed}", hint="give every name of the tensor one placement with a recipe "
                                  "rule (params)"))
            continue
        target = next(iter(sharded.values()))
        blocked = [n for n, p in planned.items()
                   if p != target and plan[where[n][0]].boundary]
        if blocked:
            problems.append(error(
                "generate.tied_placements", blocked[0],
                f"tied parameters (one tensor) are planned {_show(target)} and replicated "
                f"inside the boundary {where[blocked[0]][0] or '<root>'}, which computes with "
                f"the whole tensor: {listed}",
                hint="shard the boundary's use of it too, or untie the weights "
                     "(tie_word_embeddings: false)"))
            continue
        for name, placement in planned.items():
            if placement != target:
                fqn, rel = where[name]
                entry = plan[fqn]
                entry.place("params", rel, target)
                if rel == "weight" and target.get("tp") == Shard(0) and not entry.boundary \
                        and isinstance(model.get_submodule(fqn), nn.Embedding):
                    embedding_transitions(entry, model.get_submodule(fqn), sp)
                entry.remove_name("partial_grad_params", rel)
                changed.append(name)
    if problems:
        raise PlanError(problems)
    return changed


def _key(placement: Mapping[str, Any]) -> tuple:
    return tuple(sorted(placement.items()))


def _show(placement: Mapping[str, Any]) -> str:
    return "{" + ", ".join(f"{k}: {v}" for k, v in sorted(placement.items())) + "}"
