"""Expert parallelism: the expert mesh, which parameters live on it, their gradient scale.

Convention (torchtitan's): the world is ``dp x tp`` and the ``ep`` ranks are carved from the
data-parallel ranks (``dp = edp x ep``). A parameter is an *expert parameter* when its
named placement has an ``ep`` key (the existing system's ``{"cp": "R", "ep": "S(0)"}``);
it is distributed on the expert mesh, over the axes ``("ep", "tp")`` (``("ep",)`` when tp
is 1), everything else on the dense active mesh.

Gradients. An expert on ep rank ``q`` computes the tokens of every rank of its ep group,
so its gradient sums the contributions of ``ep`` data-parallel ranks, where a dense
parameter's gradient holds its own rank's. Each expert gradient is divided by ``ep``
(torchtitan's gradient divide factor): with the same batch on every rank it then equals
the unsharded model's, and a data-parallel average over the ``edp`` replicas (FSDP2 over
the source mesh) yields the global mean, as for dense parameters.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hpcodegen.errors import PlanError, error
from hpcodegen.plan.types import Plan

EP = "ep"
TP = "tp"


@dataclass(frozen=True)
class ExpertMesh:
    """The mesh expert parameters are distributed on.

    Attributes:
        axes: ``("ep", "tp")`` or ``("ep",)``: the axes expert placements resolve over.
        mesh: the submesh over ``axes``.
        ep_size / ep_rank: the expert-parallel group's size and this rank's index in it.
        source_mesh: the submesh named in the FSDP2 source info.
    """

    axes: tuple[str, ...]
    mesh: Any
    ep_size: int
    ep_rank: int
    source_mesh: Any

    def ep_group(self) -> Any:
        return self.mesh.get_group(EP)


@dataclass(frozen=True)
class ExpertParallel:
    """What a dispatch compute needs, bound on its module as ``_hp_expert_parallel``."""

    group: Any
    size: int
    rank: int


def is_expert_placement(named: Any) -> bool:
    """An expert parameter: its named placement has an ``ep`` axis
    (:attr:`hpcodegen.plan.types.PlannedParam.is_expert` on a typed plan)."""
    return isinstance(named, Mapping) and EP in named


def frozen_ep_size(plan: Plan) -> int:
    return max(plan.dims.size(EP), 1)


def resolve_expert_mesh(plan: Plan, device_mesh: Any,
                        expert_mesh: Any = None) -> ExpertMesh | None:
    """The live expert mesh, None when the plan or the live mesh has no ``ep`` axis > 1.

    ``expert_mesh`` (a mesh named ``("ep",)`` or ``("ep", "tp")``) wins; else the device
    mesh's ``ep`` axis (launch builds ``("edp", "ep", "tp")`` with ``dp`` flattened).
    A plan frozen with ``ep_size > 1`` on a mesh without ``ep`` keeps every expert on every
    rank (still exact) and says so.
    """
    if frozen_ep_size(plan) <= 1:
        return None
    mesh = expert_mesh if expert_mesh is not None else device_mesh
    names = tuple(getattr(mesh, "mesh_dim_names", None) or ())
    if EP not in names:
        warnings.warn(f"the artifact shards experts over ep={frozen_ep_size(plan)} but the mesh "
                      f"{names} has no 'ep' axis: every rank keeps every expert", UserWarning,
                      stacklevel=3)
        return None
    shape = dict(zip(names, mesh.mesh.shape, strict=True))
    if shape[EP] <= 1:
        return None
    axes = (EP, TP) if shape.get(TP, 1) > 1 else (EP,)
    sub = mesh if names == axes else mesh[axes if len(axes) > 1 else axes[0]]
    ep_mesh = sub if axes == (EP,) else sub[EP]
    return ExpertMesh(axes, sub, shape[EP], ep_mesh.get_local_rank(), sub)


def expert_count_check(fqn: str, shape: tuple[int, ...], ep_size: int) -> None:
    """Expert parameters shard evenly: ``ep`` must divide the expert count (dim 0)."""
    if not shape or shape[0] % ep_size:
        raise PlanError([error("runtime.ep_indivisible", fqn,
                               f"{shape[0] if shape else 0} experts do not divide over "
                               f"ep={ep_size}",
                               expected=f"an expert count divisible by {ep_size}")])
