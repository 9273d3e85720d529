"""Phase A: shard every planned parameter, then keep only its local shard.

Each parameter named in ``param_plan`` is distributed with ``distribute_tensor`` on the
active submesh (placements resolved over the live axis order) and replaced by the DTensor
of its local shard (:func:`hpcodegen.runtime.shards.as_local_param`: the plan's placements
on the submesh of the axes that may split a parameter, i.e. without cp): torch's tools see
the unsharded parameter, while the forwards run bare collectives on the local views
(:mod:`hpcodegen.runtime.local_views`). A parameter that already is a
DTensor is accepted only with the planned placements (else ``PlacementMismatchError``).
Meta-device parameters stay on meta, shrunk to the local shape.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from hpcodegen.errors import PlacementMismatchError, PlanError, error
from hpcodegen.placement import format_placements, resolve_placements
from hpcodegen.plan.entry import join_fqn
from hpcodegen.plan.types import Plan
from hpcodegen.runtime.experts import ExpertMesh, expert_count_check
from hpcodegen.runtime.mesh import ActiveMesh, to_torch_placements
from hpcodegen.runtime.shards import ShardSpec, as_local_param


@dataclass(frozen=True)
class ShardedParam:
    """What Phase A did to one parameter (used by later phases and the source info)."""

    fqn: str
    placements: tuple  # torch placements over the active axes
    global_shape: tuple[int, ...]
    global_offset: tuple[int, ...]


def split_owner(root: nn.Module, dotted: str) -> tuple[nn.Module, str]:
    """``"a.b.weight"`` -> ``(root.a.b, "weight")``: the one FQN-to-owner lookup of the runtime.

    Raises:
        AttributeError: a module on the path is missing (callers turn it into a PlanError
            naming the meta field that asked).
    """
    owner_path, _, name = dotted.rpartition(".")
    return (root.get_submodule(owner_path) if owner_path else root), name


def param_owner(model: nn.Module, fqn: str, field: str = "the plan",
                prefix: str = "") -> tuple[nn.Module, str]:
    """The module holding parameter ``fqn`` and the parameter's name in it.

    Raises PlanError (``runtime.missing_param``) naming the FQN (``prefix.fqn`` when ``fqn``
    is relative to ``model``, the module at ``prefix``) and the meta ``field`` that asked for
    it when the model has no such parameter, whether its module or the parameter is missing.
    """
    try:
        owner, name = split_owner(model, fqn)
    except AttributeError:
        owner, name = None, ""
    if owner is None or not isinstance(owner._parameters.get(name), torch.Tensor):
        raise PlanError([error("runtime.missing_param", join_fqn(prefix, fqn),
                               f"{field} names a parameter the model does not have",
                               hint="build the model from the artifact's model class and config")])
    return owner, name


def _local_of_dtensor(fqn: str, param: Any, placements: tuple) -> torch.Tensor:
    if tuple(param.placements) != tuple(placements):
        found = ", ".join(str(p) for p in param.placements)
        raise PlacementMismatchError([error(
            "runtime.placement_mismatch", fqn,
            f"already sharded as ({found}), the plan declares "
            f"({', '.join(str(p) for p in placements)})",
            hint="this usually means another parallelization already ran on the model")])
    return param.to_local()


def shard_parameter(model: nn.Module, fqn: str, named: Mapping[str, Any],
                    active: ActiveMesh | ExpertMesh) -> ShardedParam:
    """Shard one parameter in place (see module docstring) on ``active`` (the dense active
    mesh, or the expert mesh for an expert parameter)."""
    from torch.distributed.tensor import DTensor, distribute_tensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    owner, name = param_owner(model, fqn)
    param = owner._parameters[name]
    ours = resolve_placements(named, active.axes)
    placements = to_torch_placements(ours, param.dim())
    shape = tuple(param.shape)
    if isinstance(active, ExpertMesh):
        expert_count_check(fqn, shape, active.ep_size)
    local_shape, offset = compute_local_shape_and_global_offset(
        shape, active.mesh, placements)
    if isinstance(param, DTensor) or isinstance(param.data, DTensor):
        local = _local_of_dtensor(fqn, param if isinstance(param, DTensor) else param.data,
                                  placements)
    elif param.is_meta:
        local = torch.empty(local_shape, dtype=param.dtype, device="meta")
    else:  # rank 0 of each group is the source, as distribute_tensor documents
        local = distribute_tensor(param.detach(), active.mesh, placements).to_local()
    if not param.is_meta and tuple(local.shape) != tuple(local_shape):
        raise PlanError([error("runtime.local_shape", fqn,
                               f"local shard {tuple(local.shape)} for {format_placements(ours)}",
                               expected=str(tuple(local_shape)))])
    spec = _param_spec(shape, placements, active)
    owner._parameters[name] = as_local_param(local.contiguous(), spec, param.requires_grad)
    return ShardedParam(fqn, placements, shape, tuple(offset))


def _param_spec(shape: tuple[int, ...], placements: tuple,
                active: ActiveMesh | ExpertMesh) -> ShardSpec:
    """The spec over the axes that may split a parameter: cp only replicates it (verify's
    ``plan.cp_param``), so cp is left out, as the FSDP2 source info leaves it out."""
    if isinstance(active, ExpertMesh) or active.source_axes == active.axes:
        return ShardSpec(shape, placements, active.mesh)
    keep = [i for i, axis in enumerate(active.axes) if axis in active.source_axes]
    if not keep:
        return ShardSpec(shape)
    return ShardSpec(shape, tuple(placements[i] for i in keep), active.param_mesh)


def shard_parameters(model: nn.Module, plan: Plan, active: ActiveMesh,
                     expert: ExpertMesh | None = None) -> dict[str, ShardedParam]:
    """Phase A over the whole plan; returns ``{param_fqn: ShardedParam}``.

    Expert parameters (an ``ep`` key) go to the expert mesh when there is one; the others
    to the dense active mesh, skipped when it has no axis (an ep-only install).
    """
    done: dict[str, ShardedParam] = {}
    for param in plan.parameters():
        if expert is not None and param.is_expert:
            done[param.fqn] = shard_parameter(model, param.fqn, param.placements, expert)
        elif not active.degenerate:
            done[param.fqn] = shard_parameter(model, param.fqn, param.placements, active)
    return done


def _attr_owner(model: nn.Module, where: str, own: set[int]) -> tuple[Any, str]:
    """The object holding the attribute ``where`` names, and the attribute's name.

    A path through a non-module value (``mlstm_layer.config.num_heads``: transformers shares
    one config object between every module of a model) divides a private shallow copy of
    it, set on the module holding it, so the modules sharing the original keep the full
    count. ``own`` holds the ids of the copies already made (each is made once).
    """
    parts = where.split(".")
    owner: Any = model
    for i, part in enumerate(parts[:-1]):
        child = getattr(owner, part)
        if not isinstance(child, nn.Module) and id(child) not in own:
            if not isinstance(owner, nn.Module):
                raise AttributeError(".".join(parts[:i + 1]))
            child = copy.copy(child)
            own.add(id(child))
            setattr(owner, part, child)
        owner = child
    if not hasattr(owner, parts[-1]):
        raise AttributeError(where)
    return owner, parts[-1]


def divide_attrs(model: nn.Module, plan: Plan, active: ActiveMesh) -> None:
    """Divide each entry's ``tp_divide_attrs`` (TP-local head counts) by the tp size; a
    count held by a shared non-module object (a config) is divided on the module's own
    copy of it (:func:`_attr_owner`). Every count is checked first, by the rule generate
    and verify apply (:func:`hpcodegen.plan.tp_divisible.divide_attr_findings`): one that is
    missing or that tp does not divide refuses the plan before anything is divided."""
    from hpcodegen.plan.tp_divisible import MISSING, divide_attr_findings

    n = active.tp_size
    own: set[int] = set()
    owners: dict[str, tuple[Any, str]] = {}

    def resolve(fqn: str, attr: str) -> Any:
        where = join_fqn(fqn, attr)
        try:
            owners[where] = _attr_owner(model, where, own)
        except AttributeError:
            return MISSING
        return getattr(*owners[where])

    problems = divide_attr_findings(plan.entries, n, resolve, "runtime")
    if problems:
        raise PlanError(problems)
    for owner, name in owners.values():
        setattr(owner, name, getattr(owner, name) // n)
