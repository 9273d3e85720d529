"""The install phases: a checked artifact's plan executed on a model and a live mesh.

:func:`install` is what :meth:`hpcodegen.runtime.artifact.Artifact.parallelize` runs after
its refusals, in the reference's order:

A. shard parameters (each a DTensor of its local shard with the plan's placements, its
   :class:`~hpcodegen.runtime.shards.ShardSpec` recorded); ``tp_divide_attrs``;
B. special handlers;
D. tied weights (after A, which replaced the parameter objects);
C. boundaries, deepest FQN first (last, so they see the final local parameters); on a live
   cp axis the context-parallel state (before the injections, so each attention's
   ``inner_wrapper`` finds it); injection factories bound; expert and partial gradients
   synchronised;

then the model's :class:`~hpcodegen.runtime.shards.ParallelState` and its state-dict hooks,
and last the local views the forwards compute on (:mod:`hpcodegen.runtime.local_views`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torch import nn

from hpcodegen.placement import REPLICATE
from hpcodegen.plan.classify import classify_plan
from hpcodegen.plan.entry import join_fqn
from hpcodegen.plan.types import Plan
from hpcodegen.runtime.boundaries import install_boundaries
from hpcodegen.runtime.experts import ExpertMesh, ExpertParallel
from hpcodegen.runtime.grad_buckets import install_partial_grad_sync
from hpcodegen.runtime.grad_sync import install_grad_scale
from hpcodegen.runtime.handlers import apply_handlers
from hpcodegen.runtime.local_views import install_local_views
from hpcodegen.runtime.mesh import CP, TP, ActiveMesh, to_torch_placements
from hpcodegen.runtime.params import ShardedParam, divide_attrs, shard_parameters
from hpcodegen.runtime.shards import ParallelState, set_parallel_state, spec_of
from hpcodegen.runtime.state_dict import install_state_dict_hooks
from hpcodegen.runtime.tied import tie_weights, tied_pairs

#: ``{param_fqn: (placements over the plan axes, source submesh)}``: FSDP2's view
SourceInfo = dict[str, tuple[tuple[Any, ...], Any]]


@dataclass(frozen=True)
class Resolved:
    """What the refusals resolved before anything was mutated."""

    handlers: Mapping[str, Any]
    injections: Mapping[str, Any]


def install(model: nn.Module, plan: Plan, active: ActiveMesh,
            resolved: Resolved, expert: ExpertMesh | None = None) -> SourceInfo:
    """Phases A, B, D, C (module docstring); returns the source info."""
    frozen = classify_plan(plan)
    live = classify_plan(plan, active.axes, active.sizes)
    pairs = tied_pairs(model, plan)  # before Phase A replaces the tied parameter objects
    sharded = shard_parameters(model, plan, active, expert)
    divide_attrs(model, plan, active)
    apply_handlers(model, resolved.handlers, active)
    tie_weights(model, pairs, {k: v.placements for k, v in sharded.items()})
    install_boundaries(model, plan, active, frozen, live, sharded)
    experts = {p.fqn for p in plan.parameters() if p.is_expert}
    if expert is not None:
        _bind_expert_parallel(model, expert, experts)
        install_grad_scale(model, sorted(experts), 1.0 / expert.ep_size)
    _bind_tp_groups(model, plan, active)
    if CP in active.axes:
        _install_cp(model, plan, active)
    _bind_injections(model, resolved.injections, plan)
    if TP in active.axes:
        install_partial_grad_sync(model, _partial_grad_fqns(plan), active.tp_group())
    info = _source_info(model, active, sharded, expert, experts)
    record_state(model, info, plan)
    install_local_views(model)  # last: the hooks above see the DTensor parameters
    return info


def record_state(model: nn.Module, info: SourceInfo, plan: Any) -> None:
    """Leave the :class:`ParallelState` on the model and hook its ``state_dict``."""
    specs, aliases, seen = {}, {}, {}
    for fqn, param in model.named_parameters(remove_duplicate=False):
        first = seen.setdefault(id(param), fqn)
        if first != fqn:
            aliases[fqn] = first
        spec = spec_of(param)
        if spec is not None:
            specs[fqn] = spec
    set_parallel_state(model, ParallelState(specs, info, aliases, plan))
    install_state_dict_hooks(model)


def _source_info(model: nn.Module, active: ActiveMesh, sharded: Mapping[str, ShardedParam],
                 expert: ExpertMesh | None, expert_fqns: set[str]) -> SourceInfo:
    """``{param_fqn: (placements over the source axes, source submesh)}``, always tuples;
    expert parameters name the expert mesh. The source axes are the active ones but cp
    (:attr:`~hpcodegen.runtime.mesh.ActiveMesh.source_axes`: every parameter is replicated
    on cp, whose gradients FSDP2 reduces with dp's)."""
    keep = [i for i, a in enumerate(active.axes) if a in active.source_axes]
    replicated = to_torch_placements((REPLICATE,) * len(keep))
    info: SourceInfo = {}
    for fqn, _ in model.named_parameters(remove_duplicate=False):
        if expert is not None and fqn in expert_fqns:
            info[fqn] = (tuple(sharded[fqn].placements), expert.source_mesh)
        else:
            placements = sharded[fqn].placements if fqn in sharded else None
            info[fqn] = (tuple(placements[i] for i in keep) if placements is not None
                         else replicated, active.source_mesh)
    return info


def _bind_expert_parallel(model: nn.Module, expert: ExpertMesh, fqns: set[str]) -> None:
    """Give each module owning expert parameters its ep group (read by ``ep_dispatch``)."""
    ep = ExpertParallel(expert.ep_group(), expert.ep_size, expert.ep_rank)
    for fqn in fqns:
        owner_path = fqn.rpartition(".")[0]
        owner = model.get_submodule(owner_path) if owner_path else model
        owner._hp_expert_parallel = ep


def _bind_tp_groups(model: nn.Module, plan: Plan, active: ActiveMesh) -> None:
    """Give the injected local computes that communicate over tp their group (read by the
    factories): a dispatching ``experts`` region whose tokens stay sharded on tp while its
    experts are split over tp (sequence parallelism: :func:`hpcodegen.plan.moe.
    gathers_over_tp`), and a norm split over tp (:mod:`hpcodegen.runtime.norms`)."""
    from hpcodegen.plan.moe import gathers_over_tp, is_ep_dispatch
    from hpcodegen.plan.norms import is_sharded_norm
    from hpcodegen.runtime.moe import TokenGather
    from hpcodegen.runtime.norms import NormGroup

    if TP not in active.axes:
        return
    group = active.tp_group()
    import torch.distributed as dist

    size, rank = dist.get_world_size(group), dist.get_rank(group)
    records = plan.injections_by_fqn()
    for fqn, entry in plan.entries.items():
        record = records.get(fqn)
        module = model.get_submodule(fqn) if fqn else model
        if is_ep_dispatch(record) and gathers_over_tp(entry):
            module.__dict__["_hp_expert_tp"] = TokenGather(group, size, rank)
        elif is_sharded_norm(record):
            module.__dict__["_hp_tp_norm"] = NormGroup(group, size)


def _install_cp(model: nn.Module, plan: Plan, active: ActiveMesh) -> None:
    """Context parallelism on a live cp axis (:mod:`hpcodegen.runtime.cp.context`). A plan
    without a K/V transition over cp (the sequence moved at its own boundaries) gets none;
    a frozen cp plan without one never gets here (verify's ``plan.cp_no_attention``)."""
    from hpcodegen.plan.cp import cp_layout, plan_cp_attention, ulysses_degree
    from hpcodegen.runtime.cp.context import install_context_parallel

    attention = plan_cp_attention(plan)
    if not attention:
        return
    import torch.distributed as dist

    group = active.cp_group()
    sp = plan.dims.sequence_parallel is True and TP in active.axes
    records = plan.injections_by_fqn()
    degree = max(ulysses_degree(records.get(fqn), active.cp_size) for fqn in attention)
    install_context_parallel(model, attention, group, active.cp_size, dist.get_rank(group),
                             cp_layout(plan), active.tp_size if sp else 1, degree)


def _bind_injections(model: nn.Module, resolved: Mapping[str, Mapping[str, Any]],
                     plan: Plan) -> None:
    """Call each injection factory as ``factory(module, **kwargs)``.

    A ``local_compute_fn`` result is bound as ``module.__hp_compute__`` (the region forms
    call it); an ``inner_wrapper`` result that is a module replaces the ``inner_target``
    child.
    """
    records = plan.injections_by_fqn()
    for fqn, targets in resolved.items():
        module = model.get_submodule(fqn) if fqn else model
        for key, (factory, kwargs) in targets.items():
            result = factory(module, **kwargs)
            if key == "local_compute_fn":
                module.__dict__["__hp_compute__"] = result
                module.__dict__["__hyper_compute__"] = result
                continue
            record = records.get(fqn)
            target = (record.inner_target if record is not None else None) or "self"
            if isinstance(result, nn.Module) and target != "self":
                setattr(module, target, result)


def _partial_grad_fqns(plan: Plan) -> list[str]:
    from hpcodegen.plan.partial_grads import runtime_summed

    return [join_fqn(fqn, rel) for fqn in plan.entries for rel in runtime_summed(plan, fqn)]
