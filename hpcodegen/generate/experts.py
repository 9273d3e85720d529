"""``--ep E``: shard the experts of every MoE layer over E ranks (lazy torch: a meta model).

Each ``experts`` module (HF ``moe_tp_experts``) keeps its tp placements and gains
``ep: S(0)`` on every parameter (packed ``[E, ...]`` weights: rank ``r`` of the ep group holds
experts ``r*E/ep .. (r+1)*E/ep - 1``), and an injection that makes it a region form whose
``local_compute_fn`` is :func:`hpcodegen.runtime.moe.ep_dispatch` (the all_to_all token
dispatch), with ``ep_size``: the way the existing system writes its MoE metas.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hpcodegen.errors import PlanError, error
from hpcodegen.generate.hf_plan import Assignment
from hpcodegen.generate.styles import Kind

#: the registered dispatch factory (``hpcodegen.runtime.moe``)
EP_DISPATCH_TARGET = "hpcodegen.runtime.moe.ep_dispatch"


def moe_experts(assignments: Mapping[str, Assignment]) -> list[str]:
    """The ``experts`` modules of the plan, sorted."""
    return sorted(a.fqn for a in assignments.values() if a.kind is Kind.MOE_EXPERTS)


def shard_experts(model: Any, plan: dict[str, dict[str, Any]], experts: list[str], ep: int,
                  injections: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Add ``ep: S(0)`` to every expert parameter and the dispatch injection (in place);
    returns the injection list, sorted by module.

    Raises:
        PlanError: the model has no experts module, or its expert count does not divide ``ep``.
    """
    if not experts:
        raise PlanError([error("generate.ep_without_experts", "--ep",
                               f"--ep {ep}: the model has no mixture-of-experts layer "
                               "(no HF plan rule with style moe_tp_experts)",
                               hint="generate without --ep")])
    by_match = {r["match"]: dict(r) for r in injections}
    for fqn in experts:
        module = model.get_submodule(fqn)
        entry = plan.setdefault(fqn, {})
        params = entry.setdefault("params", {})
        for name, p in module.named_parameters(recurse=False):
            if p.dim() == 0 or p.shape[0] % ep:
                raise PlanError([error(
                    "generate.ep_indivisible", f"{fqn}.{name}",
                    f"{int(p.shape[0]) if p.dim() else 0} experts do not divide over "
                    f"--ep {ep}", expected=f"an expert count divisible by {ep}")])
            params[name] = {**params.get(name, {"tp": "R"}), "ep": "S(0)"}
        record = by_match.setdefault(fqn, {"match": fqn})
        record["local_compute_fn"] = {"_target_": EP_DISPATCH_TARGET}
        record["ep_size"] = ep
    return [by_match[k] for k in sorted(by_match)]
