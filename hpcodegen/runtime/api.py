"""``parallelize_from_generated`` and ``load_verified_meta``: the runtime's original entry points.

Both are thin now: :class:`hpcodegen.runtime.artifact.Artifact` loads and checks an artifact
once and installs its plan; ``parallelize_from_generated(model, mesh, dir)`` is
``Artifact.load(dir).install(model, mesh)`` for existing callers, and returns the FSDP2
source info as before. ``load_verified_meta`` is re-exported from
:mod:`hpcodegen.runtime.checked`. Imports go one way: this module uses ``artifact``, which
never imports this one.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Union

from hpcodegen.errors import PlanError, error
from hpcodegen.runtime.artifact import Artifact
from hpcodegen.runtime.checked import config_dict, load_verified_meta
from hpcodegen.runtime.mesh import MeshContext

if TYPE_CHECKING:
    from torch import nn
    from torch.distributed.device_mesh import DeviceMesh

__all__ = ["MeshContext", "MeshLike", "config_dict", "load_verified_meta",
           "parallelize_from_generated"]

SourceInfo = dict[str, tuple[tuple[Any, ...], Any]]
#: What ``parallelize_from_generated`` takes as its mesh: a named ``DeviceMesh``, or a
#: :class:`MeshContext` adding the FSDP2 and expert meshes.
MeshLike = Union["DeviceMesh", MeshContext]


def parallelize_from_generated(model: nn.Module, mesh_context: MeshLike,
                               artifact_dir: str | os.PathLike[str], *, hf_config: Any = None,
                               allowed_target_prefixes: tuple[str, ...] = ()) -> SourceInfo:
    """Install the artifact's frozen plan on ``model``; return the FSDP2 source info.

    ``Artifact.load(artifact_dir, hf_config).install(model, mesh_context)``: the artifact
    is checked once (schema, plan, targets, output hashes; the config's architecture and
    signature), then :meth:`hpcodegen.runtime.artifact.Artifact.parallelize`'s steps run.

    Args:
        model: built from the artifact's model class (or the transformers class).
        mesh_context: a ``DeviceMesh`` with named axes, or a :class:`MeshContext`.
        artifact_dir: the artifact directory.
        hf_config: the model's HF config (dict, ``PretrainedConfig`` or path), to gate the
            architecture.
        allowed_target_prefixes: module prefixes you trust: injection targets under them
            are imported by path (see :mod:`hpcodegen.targets` for the registry).

    Returns:
        ``{param_fqn: (placements tuple over the plan axes, source submesh)}``.

    Raises:
        PlanError: any refusal (``PlacementMismatchError`` for a parameter already
            sharded otherwise).

    Example::

        mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
        info = parallelize_from_generated(model, mesh, "examples/llama_tp2")

    .. note:: every planned parameter is a DTensor with the plan's placements afterwards
       (the forwards compute on local views); never call this twice on one model.
    """
    if not isinstance(model, _module_type()):
        raise PlanError([error("runtime.bad_model", "model",
                               f"expected a torch.nn.Module, got {type(model).__name__}",
                               hint="build the model from the artifact's generated class")])
    art = Artifact.load(artifact_dir, hf_config,
                        allowed_target_prefixes=allowed_target_prefixes)
    return art.install(model, mesh_context)


def _module_type() -> type:
    from torch import nn

    return nn.Module
