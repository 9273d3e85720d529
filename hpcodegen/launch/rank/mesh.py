"""The device mesh a launch builds: pure layout from the artifact, then (lazily) torch.

The artifact freezes the non-data-parallel sizes (``parallel_dims``: ``tp_size``,
``cp_size``, ``pp_size``, ``ep_size``) and the plan's active axes (``mesh_dim_names``). The
data-parallel size is whatever is left of the world: ``dp = world / (pp * cp * tp)``. The
launcher checks this *before* any process starts, so an impossible world size is an exit-2
usage error, not N tracebacks. A pipeline (``pp_size > 1``) runs only from a frozen
``pipeline`` section; its mesh is ``pp x dp x cp x tp`` with pp outermost (a stage's ranks
are consecutive, and ``ep`` is carved from its dp ranks as without a pipeline; without ep its
dp ranks run FSDP2, :mod:`hpcodegen.runtime.pipeline_fsdp`; each stage runs its cp ranks'
shares of the sequence). A zero-bubble list under FSDP does not compose with pp yet
(refused here, before any process starts).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpcodegen.errors import UsageError, error
from hpcodegen.plan.types import Plan

#: Live mesh axis order, outermost first (the trainer's ``("dp", "cp", "tp")``, pipeline
#: stages outside cp and tp: a stage's tp group is a set of consecutive ranks).
MESH_ORDER: tuple[str, ...] = ("dp", "pp", "cp", "tp")
PP = "pp"
#: the expert-parallel axis: carved from dp (torchtitan's convention), never a factor of
#: the model-parallel size
EP = "ep"


@dataclass(frozen=True, kw_only=True)
class MeshLayout:
    """Names and sizes of the mesh one launch builds.

    Attributes:
        names: mesh axes, outermost first, e.g. ``("dp", "tp")``; ``dp`` is always present.
        sizes: one size per axis; their product is the world size.
        plan_axes: the plan's active axes in live-mesh order (what placements resolve over).
    """

    names: tuple[str, ...]
    sizes: tuple[int, ...]
    plan_axes: tuple[str, ...]
    #: expert-parallel degree (``ep`` ranks inside each group of ``dp``; 1 = none)
    ep: int = 1

    @property
    def world_size(self) -> int:
        out = 1
        for size in self.sizes:
            out *= size
        return out

    def describe(self) -> str:
        """``dp=1 x tp=2`` (``dp=2 (ep=2) x tp=2``) for messages and tables."""
        return " x ".join(f"{n}={s}" + (f" (ep={self.ep})" if n == "dp" and self.ep > 1 else "")
                          for n, s in zip(self.names, self.sizes, strict=True))


def resolve_mesh_layout(plan: Plan, world_size: int) -> MeshLayout:
    """Fit the artifact's frozen sizes into ``world_size`` ranks.

    Args:
        plan: the artifact's typed plan.
        world_size: total ranks (``nproc * nnodes``).

    Returns:
        The layout; ``dp`` takes the ranks the frozen axes leave.

    Raises:
        UsageError: (exit 2) the world size is not a multiple of the frozen sizes, or the
            plan needs an axis launch cannot build.

    Example::

        >>> plan = plan_from_meta({"parallel_dims": {"tp_size": 2}})
        >>> resolve_mesh_layout(plan, 4).describe()
        'dp=2 x tp=2'
    """
    sizes = plan.dims.sizes
    plan_axes = plan.axes
    if sizes.get(PP, 1) > 1 and plan.pipeline is None:
        raise UsageError([error("launch.unsupported_axis", "/parallel_dims/pp_size",
                                f"pp_size={sizes[PP]} without a pipeline section: no stage "
                                "split is frozen", expected="pp_size 1, or a meta written "
                                "by hpcodegen generate --pp")])
    unknown = [a for a in plan_axes if a not in MESH_ORDER]
    if unknown:
        raise UsageError([error("launch.unsupported_axis", "/mesh_dim_names",
                                f"plan axes {unknown} cannot be built by hpcodegen launch",
                                expected=f"axes among {list(MESH_ORDER[1:])}")])
    frozen = {axis: sizes.get(f"{axis}", 1) for axis in MESH_ORDER[1:]}
    for axis in plan_axes:
        frozen[axis] = max(frozen.get(axis, 1), 1)
    model = 1
    for size in frozen.values():
        model *= size
    if world_size < 1 or model < 1 or world_size % model:
        found = " x ".join(f"{a}={s}" for a, s in frozen.items() if s > 1) or "1"
        raise UsageError([error(
            "launch.world_size", "/parallel_dims",
            f"world size {world_size} is not a multiple of the artifact's frozen mesh "
            f"{found} (= {model} ranks per data-parallel replica)",
            expected=f"--nproc x --nnodes a multiple of {model}",
            hint=f"use --nproc {model} (or a multiple) per node")])
    names = ("dp", *[a for a in MESH_ORDER[1:] if frozen[a] > 1 or a in plan_axes])
    if PP in names:  # pp outermost: each stage's dp x tp ranks are consecutive
        names = (PP, *[n for n in names if n != PP])
    size_of = {"dp": world_size // model, **frozen}
    ep = max(sizes.get(EP, 1), 1)
    if size_of["dp"] % ep:
        raise UsageError([error(
            "launch.ep_not_in_dp", "/parallel_dims/ep_size",
            f"ep_size={ep} does not divide the data-parallel size dp={size_of['dp']} "
            f"(world {world_size} / {model} model-parallel ranks): ep ranks are carved from dp",
            expected=f"--nproc x --nnodes a multiple of {model * ep}",
            hint=f"use --nproc {model * ep} (or a multiple)")])
    if (plan.pipeline is not None and size_of["dp"] > 1 and ep <= 1
            and _splits_backward(plan.pipeline)):
        raise UsageError([error(
            "launch.pp_compose", "/pipeline/actions",
            f"a zero-bubble pipeline ({plan.pipeline.schedule}, backward split into I and W) "
            f"on dp={size_of['dp']}: FSDP over dp gathers a stage's parameters for its "
            "forward, and the split backward differentiates the sharded ones",
            expected="GPipe, 1F1B or Interleaved1F1B with dp > 1",
            hint=f"use --nproc {model} (no dp), or generate another --pp-schedule")])
    ordered_plan = tuple(a for a in names if a in plan_axes)
    return MeshLayout(names=names, sizes=tuple(size_of[n] for n in names),
                      plan_axes=ordered_plan, ep=ep)


def _splits_backward(pipe: Any) -> bool:
    """The frozen list has input/weight gradient actions (``I``/``W``)."""
    from hpcodegen.plan.schedule import parse_action

    try:
        return any(parse_action(a).kind in ("I", "W")
                   for acts in (pipe.actions or {}).values() for a in acts)
    except ValueError:
        return False  # verify names a list it cannot read


def build_device_mesh(layout: MeshLayout, device_type: str) -> Any:
    """The torch ``DeviceMesh`` for ``layout`` (imports torch; process group must exist).

    With ``ep > 1`` the mesh is ``("edp", "ep", *rest)`` (``dp = edp x ep``, ep innermost
    so an ep group is ``ep`` consecutive dp ranks) with ``("edp", "ep")`` flattened to
    ``"dp"``: ``mesh["dp"]``, ``mesh["tp"]`` and the expert mesh ``mesh["ep", "tp"]`` all
    slice from it. A pipeline's ``pp`` stays outermost (``("pp", "edp", "ep", "tp")``): the
    expert mesh is carved inside each stage.
    """
    from torch.distributed.device_mesh import init_device_mesh

    if layout.ep <= 1:
        return init_device_mesh(device_type, layout.sizes, mesh_dim_names=layout.names)
    names: list[str] = []
    sizes: list[int] = []
    for name, size in zip(layout.names, layout.sizes, strict=True):
        if name == "dp":  # (pp,) dp, ... -> (pp,) edp, ep, ...
            names += ["edp", EP]
            sizes += [size // layout.ep, layout.ep]
        else:
            names.append(name)
            sizes.append(size)
    mesh = init_device_mesh(device_type, tuple(sizes), mesh_dim_names=tuple(names))
    mesh["edp", EP]._flatten("dp")
    return mesh
