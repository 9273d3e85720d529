"""The live mesh a frozen plan runs on: active submesh, axis order, torch placements.

The plan freezes its active axes in its own order (``mesh_dim_names``, e.g. ``["cp", "tp"]``);
the live mesh may declare them in another order or hold more axes (``dp``). Placements are
therefore always resolved over the *live* order of the plan axes the mesh really has
(:func:`hpcodegen.plan.revalidate.active_plan_axes`, as ``inspect-plan --mesh``), with
size-1 axes removed (on a size-1 axis every placement is a no-op). When no active axis is
left (tp=1, or tp absent), the install is an exact no-op.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hpcodegen.errors import PlanError, error
from hpcodegen.placement import Partial, Placement, Replicate, Shard, StridedShard
from hpcodegen.plan.revalidate import active_plan_axes
from hpcodegen.plan.types import Plan

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

TP = "tp"
CP = "cp"
#: plan axes whose parameters are replicated and whose gradients FSDP2 reduces (with dp):
#: they are left out of the source info, as the existing system leaves them out
FSDP_AXES: tuple[str, ...] = (CP,)


@dataclass
class MeshContext:
    """The meshes a plan is installed on.

    Attributes:
        device_mesh: the dense device mesh holding the plan axes (e.g. ``("dp", "tp")``).
        fsdp_mesh: optional mesh FSDP2 shards over; when it holds the plan axes, the source
            info names its submesh (the trainer's view) instead of ``device_mesh``'s.
    """

    device_mesh: DeviceMesh
    fsdp_mesh: DeviceMesh | None = None
    #: optional mesh named ``("ep",)`` or ``("ep", "tp")`` for expert parameters; default:
    #: the device mesh's ``ep`` axis (:mod:`hpcodegen.runtime.experts`)
    expert_mesh: DeviceMesh | None = None


@dataclass(frozen=True)
class ActiveMesh:
    """The submesh a plan executes on.

    Attributes:
        axes: the plan axes present in the live mesh with size > 1, in the live order.
        sizes: their sizes.
        mesh: the submesh over ``axes`` (None when ``axes`` is empty: a no-op install).
        source_mesh: the submesh named in the FSDP2 source info: over :attr:`source_axes`
            (None when there are none, e.g. a cp-only plan).
        param_mesh: the dense submesh over :attr:`source_axes` (``mesh`` without cp), the
            one a parameter's :class:`~hpcodegen.runtime.shards.ShardSpec` names: a
            parameter is replicated over cp, so its spec, ``state_dict()`` and a checkpoint
            have no cp in them (None when no axis is left).
    """

    axes: tuple[str, ...]
    sizes: dict[str, int]
    mesh: Any
    source_mesh: Any
    param_mesh: Any = None

    @property
    def source_axes(self) -> tuple[str, ...]:
        """The active axes the source info names: all but cp (FSDP2 composes over dp x cp,
        every parameter is replicated on cp)."""
        return tuple(a for a in self.axes if a not in FSDP_AXES)

    @property
    def cp_size(self) -> int:
        return self.sizes.get(CP, 1)

    def cp_group(self) -> Any:
        return self.mesh.get_group(CP)

    @property
    def degenerate(self) -> bool:
        return not self.axes

    @property
    def tp_size(self) -> int:
        return self.sizes.get(TP, 1)

    def tp_group(self) -> Any:
        """The tp process group (the submesh's own group when tp is its only axis)."""
        return self.mesh.get_group(TP)


def _is_mesh(value: Any) -> bool:
    return hasattr(value, "mesh_dim_names") and hasattr(value, "get_group")


def as_context(mesh_context: Any) -> MeshContext:
    """A bare ``DeviceMesh`` or a :class:`MeshContext` -> MeshContext; else PlanError."""
    if isinstance(mesh_context, MeshContext):
        for name in ("device_mesh", "fsdp_mesh", "expert_mesh"):
            value = getattr(mesh_context, name)
            if not _is_mesh(value) and not (name != "device_mesh" and value is None):
                raise PlanError([error("runtime.bad_mesh", f"mesh_context.{name}",
                                       f"expected a DeviceMesh, got {type(value).__name__}")])
        return mesh_context
    if _is_mesh(mesh_context):
        return MeshContext(device_mesh=mesh_context)
    raise PlanError([error("runtime.bad_mesh", "mesh_context",
                           "expected a DeviceMesh or MeshContext, got "
                           f"{type(mesh_context).__name__}")])


def _submesh(mesh: Any, axes: tuple[str, ...]) -> Any:
    names = tuple(mesh.mesh_dim_names or ())
    return mesh if names == axes else mesh[axes if len(axes) > 1 else axes[0]]


def resolve_active_mesh(plan: Plan, context: MeshContext) -> ActiveMesh:
    """The plan axes the live mesh holds (live order, size > 1) and their submesh.

    ``plan``: the typed plan (a checked meta dict is read as one).

    Raises:
        PlanError: the mesh has no axis names (placements could not be matched to axes).
    """
    mesh = context.device_mesh
    names = tuple(mesh.mesh_dim_names or ())
    if not names:
        raise PlanError([error("runtime.unnamed_mesh", "mesh_context",
                               "the device mesh has no mesh_dim_names",
                               hint="init_device_mesh(..., mesh_dim_names=('tp',))")])
    shape = dict(zip(names, mesh.mesh.shape, strict=True))
    axes = active_plan_axes(plan, names, shape)
    if not axes:
        return ActiveMesh((), {}, None, None)
    sub = _submesh(mesh, axes)
    kept = tuple(a for a in axes if a not in FSDP_AXES)
    dense = (sub if kept == axes else _submesh(mesh, kept)) if kept else None
    source = dense
    fsdp = context.fsdp_mesh
    if kept and fsdp is not None and set(kept) <= set(fsdp.mesh_dim_names or ()):
        source = _submesh(fsdp, kept)
    return ActiveMesh(axes, {a: shape[a] for a in axes}, sub, source, dense)


def to_torch_placements(placements: Sequence[Placement], ndim: int | None = None) -> tuple:
    """hpcodegen placements -> torch DTensor placements (negative dims normalized by ``ndim``)."""
    from torch.distributed.tensor import Partial as TPartial
    from torch.distributed.tensor import Replicate as TReplicate
    from torch.distributed.tensor import Shard as TShard
    from torch.distributed.tensor.placement_types import _StridedShard

    def dim(d: int) -> int:
        return d % ndim if ndim and d < 0 else d

    out: list[Any] = []
    for p in placements:
        if isinstance(p, Replicate):
            out.append(TReplicate())
        elif isinstance(p, StridedShard):
            out.append(_StridedShard(dim(p.dim), split_factor=p.split_factor))
        elif isinstance(p, Shard):
            out.append(TShard(dim(p.dim)))
        elif isinstance(p, Partial):
            out.append(TPartial(p.reduce_op))
        else:  # pragma: no cover - the grammar has no other kind
            raise TypeError(f"unknown placement {p!r}")
    return tuple(out)
