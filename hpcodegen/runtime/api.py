"""``parallelize_from_generated`` and ``load_verified_meta``: the runtime's original entry points.

Both are thin now: :class:`hpcodegen.runtime.artifact.Artifact` loads and checks an artifact
once and installs its plan; ``parallelize_from_generated(model, mesh, dir)`` is
``Artifact.load(dir).install(model, mesh)`` for existing callers, and returns the FSDP2
source info as before.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Union

from hpcodegen.artifact.load import LoadedMeta, load_meta
from hpcodegen.errors import PlanError, error
from hpcodegen.hf import architecture_of
from hpcodegen.plan.types import Plan
from hpcodegen.runtime.mesh import MeshContext

if TYPE_CHECKING:
    from torch import nn
    from torch.distributed.device_mesh import DeviceMesh

__all__ = ["MeshContext", "MeshLike", "load_verified_meta", "parallelize_from_generated"]

SourceInfo = dict[str, tuple[tuple[Any, ...], Any]]
#: What ``parallelize_from_generated`` takes as its mesh: a named ``DeviceMesh``, or a
#: :class:`MeshContext` adding the FSDP2 and expert meshes.
MeshLike = Union["DeviceMesh", MeshContext]


def config_dict(hf_config: Any) -> dict[str, Any] | None:
    """A config given as a ``PretrainedConfig``, a dict or a path, as a dict (None: None)."""
    if hf_config is None or isinstance(hf_config, Mapping):
        return dict(hf_config) if hf_config is not None else None
    if hasattr(hf_config, "to_dict"):
        return hf_config.to_dict()
    if not isinstance(hf_config, (str, os.PathLike)):
        raise PlanError([error("runtime.bad_hf_config", "hf_config",
                               f"unusable hf_config of type {type(hf_config).__name__}",
                               expected="a PretrainedConfig, a dict, or a path to config.json "
                                        "or its directory")])
    from hpcodegen.hf import read_hf_config

    return read_hf_config(hf_config)[0]


def _recorded_view(config: dict[str, Any], plan: Plan) -> dict[str, Any]:
    """A ``PretrainedConfig.to_dict()`` narrowed to the structure fields the artifact recorded.

    ``to_dict`` adds every class default and attribute alias (``attention_bias``,
    ``num_local_experts`` for ``num_experts``) that the config.json the artifact was
    generated from never wrote; the signature covers the fields that file set, so those are
    the ones compared (as verify's structure check compares only recorded fields), in
    sub-configs too (``text_config.hidden_size``).
    """
    from hpcodegen.hf import structure_view

    source = plan.provenance.source
    recorded = source.structure if source is not None else None
    if recorded is None:
        return config
    return structure_view(config, recorded)


def load_verified_meta(artifact_dir: str | os.PathLike[str], hf_config: Any = None, *,
                       allowed_target_prefixes: tuple[str, ...] = ()) -> LoadedMeta:
    """Load the meta once and run verify's checks on it (schema, plan, targets, output
    hashes); the result holds the typed ``plan``.

    Injection targets must be in the registry (:mod:`hpcodegen.targets`) or under one of
    ``allowed_target_prefixes``, as ``verify --allow-target`` decides.

    With a config: refuse another architecture (``architectures[0]`` vs
    ``source.architecture``), then run verify's ``signature`` check against it (a config of
    the same architecture but another shape is refused too), on the same loaded bytes.
    Nothing is imported from the artifact.
    """
    from hpcodegen.verify import RUNTIME_CHECKS, check_meta

    loaded = check_meta(load_meta(artifact_dir), RUNTIME_CHECKS,
                        allowed_targets=allowed_target_prefixes)
    config = config_dict(hf_config)
    if config is None:
        return loaded
    if not isinstance(hf_config, (Mapping, str, os.PathLike)):
        config = _recorded_view(config, loaded.plan)
    _check_architecture(loaded, hf_config, config)
    return check_meta(loaded, ("signature",), hf_config=config)


def _check_architecture(loaded: LoadedMeta, hf_config: Any, config: dict[str, Any]) -> None:
    source = loaded.plan.provenance.source if loaded.plan is not None else None
    want = source.architecture if source is not None else None
    got = architecture_of(config)
    if got is None and not isinstance(hf_config, (Mapping, str, os.PathLike)):
        # a config object without ``architectures``: typically a composite model's text
        # sub-config (``model.config`` of Mllama's causal LM), which also lacks the
        # composite's shape fields the signature covers
        raise PlanError([error(
            "runtime.config_without_architecture", "hf_config",
            f"the config object {type(hf_config).__name__} (model_type "
            f"{config.get('model_type')!r}) names no architecture to compare with "
            f"{want!r} (the meta's /source/architecture)",
            expected=f"a config whose architectures[0] is {want!r}",
            hint="pass the model's config.json (its path or dict) or the full config "
                 "AutoConfig.from_pretrained(model_dir) gives, not a sub-config")])
    if want != got:
        raise PlanError([error("runtime.architecture", "/source/architecture",
                               f"the artifact was generated for {want!r}, the config is "
                               f"for {got!r}", expected=str(got), file=str(loaded.meta_path),
                               hint="generate an artifact for this model")])


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

    .. note:: every parameter is its local shard afterwards (``model.state_dict()`` yields
       DTensors); never call this twice on one model.
    """
    from hpcodegen.runtime.artifact import Artifact

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
