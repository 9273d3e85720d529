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
from hpcodegen.generate.sources.hf_plan import Assignment
from hpcodegen.generate.sources.styles import Kind
from hpcodegen.placement import REPLICATE, Shard
from hpcodegen.plan.draft import DraftPlan

#: the registered dispatch factory (``hpcodegen.runtime.moe``)
EP_DISPATCH_TARGET = "hpcodegen.runtime.moe.ep_dispatch"


def moe_experts(assignments: Mapping[str, Assignment]) -> list[str]:
    """The ``experts`` modules of the plan, sorted."""
    return sorted(a.fqn for a in assignments.values() if a.kind is Kind.MOE_EXPERTS)


def shard_experts(model: Any, plan: DraftPlan, experts: list[str], ep: int,
                  injections: list[dict[str, Any]], sp: bool = False) -> list[dict[str, Any]]:
    """Add ``ep: S(0)`` to every expert parameter and the dispatch injection (in place);
    returns the injection list, sorted by module.

    With ``sp`` the dispatch works on the rank's slice of the tokens: the region's inputs
    and output stay sharded (identity transitions), and the dispatch itself gathers, over
    tp, the rows its tp-split experts compute and reduce-scatters their partial results
    (:func:`hpcodegen.runtime.moe.ep_dispatch`), as Megatron's all-to-all token dispatcher
    does with expert tensor parallelism.

    Raises:
        PlanError: the model has no experts module, its expert count does not divide ``ep``,
            or its forward takes no routing (:func:`routed_inputs_check`).
    """
    if not experts:
        raise PlanError([error("generate.ep_without_experts", "--ep",
                               f"--ep {ep}: the model has no mixture-of-experts layer "
                               "(no HF plan rule with style moe_tp_experts)",
                               hint="generate without --ep")])
    by_match = {r["match"]: dict(r) for r in injections}
    for fqn in experts:
        module = model.get_submodule(fqn)
        routed_inputs_check(fqn, module, ep)
        entry = plan.entry(fqn)
        params = entry.placements("params")
        for name, p in module.named_parameters(recurse=False):
            if p.dim() == 0 or p.shape[0] % ep:
                raise PlanError([error(
                    "generate.ep_indivisible", f"{fqn}.{name}",
                    f"{int(p.shape[0]) if p.dim() else 0} experts do not divide over "
                    f"--ep {ep}", expected=f"an expert count divisible by {ep}")])
            params[name] = {**params.get(name, {"tp": REPLICATE}), "ep": Shard(0)}
        entry.set_placements("params", params)
        if sp:
            entry.set_placements("in_dst", entry.placements("in_src"))
            entry.set_placements("out_src", entry.placements("out_dst"))
        record = by_match.setdefault(fqn, {"match": fqn})
        record["local_compute_fn"] = {"_target_": EP_DISPATCH_TARGET}
        record["ep_size"] = ep
    return [by_match[k] for k in sorted(by_match)]


def routed_inputs_check(fqn: str, module: Any, ep: int) -> None:
    """The dispatch needs transformers' routed contract: ``forward(hidden_states,
    expert_indices, routing_weights)``, each token sent only to its chosen experts and
    scaled at home. An experts module taking only the hidden states (Llama-4's: every
    expert runs every token, pre-scaled by the router) has no routing to dispatch.

    Raises:
        PlanError: the forward takes fewer than three inputs.
    """
    import inspect

    params = list(inspect.signature(type(module).forward).parameters.values())[1:]
    names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(names) < 3:
        raise PlanError([error(
            "generate.ep_unrouted_experts", fqn,
            f"--ep {ep}: {type(module).__name__}.forward({', '.join(names)}) takes no expert "
            "indices and routing weights, so there is no per-token routing to dispatch over "
            "the ep ranks", expected="forward(hidden_states, expert_indices, routing_weights)",
            hint="generate without --ep (the experts stay sharded over tp)")])
