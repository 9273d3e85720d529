"""``parallelize_from_generated``: execute a frozen plan on a live DeviceMesh, exactly.

The one public entry of the runtime. Every refusal (drifted files, another architecture,
unknown handlers, foreign injection targets) happens before the model is touched or the
generated module is imported; then the phases run in the reference's order A, B, D, C.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from typing import Any

from torch import nn

from hpcodegen.artifact.load import LoadedMeta
from hpcodegen.errors import PlanError, error
from hpcodegen.hf import architecture_of
from hpcodegen.placement import REPLICATE
from hpcodegen.plan.classify import classify_plan
from hpcodegen.plan.entry import (
    active_axes,
    effective_partial_grad_params,
    expand_injections,
    iter_params,
    join_fqn,
    param_plan,
)
from hpcodegen.runtime.boundaries import install_boundaries
from hpcodegen.runtime.experts import (
    ExpertMesh,
    ExpertParallel,
    is_expert_placement,
    resolve_expert_mesh,
)
from hpcodegen.runtime.grad_sync import install_grad_allreduce, install_grad_scale
from hpcodegen.runtime.handlers import apply_handlers, check_handlers
from hpcodegen.runtime.loader import import_verified_module
from hpcodegen.runtime.loss_install import check_loss_parallel_install
from hpcodegen.runtime.mesh import (
    CP,
    TP,
    ActiveMesh,
    MeshContext,
    as_context,
    resolve_active_mesh,
    to_torch_placements,
)
from hpcodegen.runtime.params import ShardedParam, divide_attrs, shard_parameters
from hpcodegen.runtime.tied import tie_weights, tied_pairs
from hpcodegen.targets import resolve_injections

__all__ = ["MeshContext", "parallelize_from_generated"]

SourceInfo = dict[str, tuple[tuple[Any, ...], Any]]
_DONE = "_hp_parallelized"


def _config_dict(hf_config: Any) -> dict[str, Any] | None:
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


def _recorded_view(config: dict[str, Any], meta: Mapping[str, Any]) -> dict[str, Any]:
    """A ``PretrainedConfig.to_dict()`` narrowed to the structure fields the artifact recorded.

    ``to_dict`` adds every class default and attribute alias (``attention_bias``,
    ``num_local_experts`` for ``num_experts``) that the config.json the artifact was
    generated from never wrote; the signature covers the fields that file set, so those are
    the ones compared (as verify's structure check compares only recorded fields), in
    sub-configs too (``text_config.hidden_size``).
    """
    from hpcodegen.hf import structure_view

    recorded = (meta.get("source") or {}).get("structure")
    if not isinstance(recorded, Mapping):
        return config
    return structure_view(config, recorded)


def load_verified_meta(artifact_dir: str | os.PathLike[str], hf_config: Any = None, *,
                       allowed_target_prefixes: tuple[str, ...] = ()) -> LoadedMeta:
    """Load the meta with verify's loader and checks (schema, plan, output hashes).

    Injection targets must be in the registry (:mod:`hpcodegen.targets`) or under one of
    ``allowed_target_prefixes``, as ``verify --allow-target`` decides.

    With a config: refuse another architecture (``architectures[0]`` vs
    ``source.architecture``), then run verify's ``signature`` check against it (a config of
    the same architecture but another shape is refused too). Nothing is imported from the
    artifact before this passes.
    """
    from hpcodegen.verify import RUNTIME_CHECKS, load_checked_meta

    loaded = load_checked_meta(artifact_dir, RUNTIME_CHECKS,
                               allowed_targets=allowed_target_prefixes)
    config = _config_dict(hf_config)
    if config is None:
        return loaded
    if not isinstance(hf_config, (Mapping, str, os.PathLike)):
        config = _recorded_view(config, loaded.data)
    want = (loaded.data.get("source") or {}).get("architecture")
    got = architecture_of(config)
    if got is None and not isinstance(hf_config, (Mapping, str, os.PathLike)):
        # a config object without ``architectures``: typically a composite model's text
        # sub-config (``model.config`` of Mllama's causal LM), which also lacks the
        # composite's shape fields the signature covers
        raise PlanError([error(
            "runtime.config_without_architecture", "/source/architecture",
            f"the config object {type(hf_config).__name__} (model_type "
            f"{config.get('model_type')!r}) names no architecture to compare with "
            f"{want!r}", expected=f"a config whose architectures[0] is {want!r}",
            file=str(loaded.meta_path),
            hint="pass the model's config.json (its path or dict) or the full config "
                 "AutoConfig.from_pretrained(model_dir) gives, not a sub-config")])
    if want != got:
        raise PlanError([error("runtime.architecture", "/source/architecture",
                               f"the artifact was generated for {want!r}, the config is "
                               f"for {got!r}", expected=str(want), file=str(loaded.meta_path),
                               hint="generate an artifact for this model")])
    load_checked_meta(artifact_dir, ("signature",), hf_config=config)
    return loaded


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


def _bind_expert_parallel(model: nn.Module, expert: ExpertMesh,
                          fqns: set[str]) -> None:
    """Give each module owning expert parameters its ep group (read by ``ep_dispatch``)."""
    ep = ExpertParallel(expert.ep_group(), expert.ep_size, expert.ep_rank)
    for fqn in fqns:
        owner_path = fqn.rpartition(".")[0]
        owner = model.get_submodule(owner_path) if owner_path else model
        owner._hp_expert_parallel = ep


def _bind_token_gather(model: nn.Module, meta: Mapping[str, Any],
                       records: Mapping[str, Mapping[str, Any]], active: ActiveMesh) -> None:
    """Give each dispatching ``experts`` region whose tokens stay sharded on tp while its
    experts are split over tp (sequence parallelism) the tp group its dispatch gathers the
    received rows over (read by ``ep_dispatch``; :func:`hpcodegen.plan.moe.gathers_over_tp`)."""
    from hpcodegen.plan.moe import EP_DISPATCH_TARGETS, gathers_over_tp, target_name
    from hpcodegen.runtime.moe import TokenGather

    if TP not in active.axes:
        return
    group = active.tp_group()
    import torch.distributed as dist

    gather = TokenGather(group, dist.get_world_size(group), dist.get_rank(group))
    for fqn, entry in param_plan(meta).items():
        record = records.get(fqn) or {}
        if target_name(record.get("local_compute_fn")) in EP_DISPATCH_TARGETS \
                and gathers_over_tp(entry):
            model.get_submodule(fqn).__dict__["_hp_expert_tp"] = gather


def _bind_injections(model: nn.Module, resolved: Mapping[str, Mapping[str, Any]],
                     records: Mapping[str, Mapping[str, Any]]) -> None:
    """Call each injection factory as ``factory(module, **kwargs)``.

    A ``local_compute_fn`` result is bound as ``module.__hp_compute__`` (the region forms
    call it); an ``inner_wrapper`` result that is a module replaces the ``inner_target``
    child.
    """
    for fqn, targets in resolved.items():
        module = model.get_submodule(fqn) if fqn else model
        for key, (factory, kwargs) in targets.items():
            result = factory(module, **kwargs)
            if key == "local_compute_fn":
                module.__dict__["__hp_compute__"] = result
                module.__dict__["__hyper_compute__"] = result
                continue
            target = (records.get(fqn) or {}).get("inner_target") or "self"
            if isinstance(result, nn.Module) and target != "self":
                setattr(module, target, result)


def _install_cp(model: nn.Module, plan: Any, active: ActiveMesh) -> None:
    """Context parallelism on a live cp axis (:mod:`hpcodegen.runtime.cp.context`), read
    from the loader's typed Plan: before the injections bind, so each attention's
    ``inner_wrapper`` finds the cp state. A plan without a K/V transition over cp (the
    sequence moved at its own boundaries) gets none; a frozen cp plan without one never
    gets here (verify's ``plan.cp_no_attention``)."""
    from hpcodegen.plan.cp import plan_cp_attention, plan_cp_layout
    from hpcodegen.runtime.cp.context import install_context_parallel

    attention = plan_cp_attention(plan)
    if not attention:
        return
    import torch.distributed as dist

    group = active.cp_group()
    sp = plan.dims.sequence_parallel is True and TP in active.axes
    install_context_parallel(model, attention, group, active.cp_size, dist.get_rank(group),
                             plan_cp_layout(plan), active.tp_size if sp else 1)


def _partial_grad_fqns(meta: Mapping[str, Any]) -> list[str]:
    return [join_fqn(fqn, rel) for fqn, entry in param_plan(meta).items()
            for rel in effective_partial_grad_params(entry)]


def _warn_without_plan_axes(meta: Mapping[str, Any], context: MeshContext) -> None:
    """A mesh with none of the plan's axes installs nothing, by design (decisions.md 4);
    say so, since a mesh named ``("dp",)`` or ``("model",)`` is more often a mistake than
    a wish for an unsharded model. A plan axis of size 1 (tp=1) stays silent."""
    frozen = active_axes(meta)
    names = tuple(context.device_mesh.mesh_dim_names or ())
    if frozen and not set(frozen) & set(names):
        warnings.warn(f"the device mesh {names} has none of the artifact's axes "
                      f"{frozen}: nothing is sharded, the model runs unparallelized",
                      UserWarning, stacklevel=3)


def parallelize_from_generated(model: nn.Module, mesh_context: Any,
                               artifact_dir: str | os.PathLike[str], *, hf_config: Any = None,
                               allowed_target_prefixes: tuple[str, ...] = ()) -> SourceInfo:
    """Install the artifact's frozen plan on ``model``; return the FSDP2 source info.

    Phases, in order:

    0. Refuse a second call; load and check the meta like ``verify`` (schema, plan, output
       hashes: a drifted file is refused); refuse a config of another architecture;
       resolve special handlers and injection targets (allowlist); refuse loss
       parallelism verify's model check refuses (:mod:`.loss_install`, on a meta copy).
       Nothing is mutated or imported before all of this passes.
    1. Import the generated module (synthetic package); if it defines the meta's
       ``entrypoints.parallelize`` function, call it and return its result.
    2. Resolve the active submesh (plan axes in the live order, size-1 axes dropped). No
       active axis (tp=1, or tp absent) -> an exact no-op, returning ``{}``
       (with a UserWarning when the mesh has none of the plan's axes).
    3. Classify the plan frozen and live (``classify_plan``, the one classifier).
    A. Shard parameters (``distribute_tensor``, keep the local shard); ``tp_divide_attrs``.
    B. Special handlers.   D. Tied weights.
    C. Boundaries, deepest FQN first; injections bound; partial gradients synchronised.

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
        PlanError: any refusal above (``PlacementMismatchError`` for a parameter already
            sharded otherwise).

    Example::

        mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
        info = parallelize_from_generated(model, mesh, "examples/llama_tp2")

    .. note:: every parameter is a plain local tensor afterwards; wrap them for FSDP2 with
       the returned placements, and never call this twice on one model.
    """
    if not isinstance(model, nn.Module):
        raise PlanError([error("runtime.bad_model", "model",
                               f"expected a torch.nn.Module, got {type(model).__name__}",
                               hint="build the model from the artifact's generated class")])
    if getattr(model, _DONE, False):
        raise PlanError([error("runtime.second_call", type(model).__name__,
                               "parallelize_from_generated already ran on this model")])
    loaded = load_verified_meta(artifact_dir, hf_config,
                                allowed_target_prefixes=allowed_target_prefixes)
    meta = loaded.data
    handlers = check_handlers(meta)
    records = expand_injections(meta)
    injections = resolve_injections(meta, allowed_target_prefixes)
    check_loss_parallel_install(model, meta)
    module = import_verified_module(loaded, allowed_target_prefixes=allowed_target_prefixes)
    entry_name = (meta.get("entrypoints") or {}).get("parallelize")
    entry_fn = getattr(module, entry_name, None) if entry_name else None
    context = as_context(mesh_context)
    setattr(model, _DONE, True)
    if callable(entry_fn):
        return entry_fn(model, context)
    active = resolve_active_mesh(meta, context)
    expert = resolve_expert_mesh(meta, context.device_mesh, context.expert_mesh)
    if active.degenerate and expert is None:
        _warn_without_plan_axes(meta, context)
        return {}
    return _execute(model, meta, active, handlers, injections, records, expert, loaded.plan)


def _execute(model: nn.Module, meta: Mapping[str, Any], active: ActiveMesh,
             handlers: Mapping[str, Any], injections: Mapping[str, Any],
             records: Mapping[str, Mapping[str, Any]],
             expert: ExpertMesh | None = None, plan: Any = None) -> SourceInfo:
    """Phases A, B, D, C in the reference's order.

    D (tying) follows A because sharding replaced each parameter object; C comes last so
    the boundaries see the final local parameters (the vocab range of a sharded embedding).
    """
    frozen = classify_plan(meta)
    live = classify_plan(meta, active.axes, active.sizes)
    pairs = tied_pairs(model, meta)  # before Phase A replaces the tied parameter objects
    sharded = shard_parameters(model, meta, active, expert)
    divide_attrs(model, meta, active)
    apply_handlers(model, handlers, active)
    tie_weights(model, pairs, {k: v.placements for k, v in sharded.items()})
    install_boundaries(model, meta, active, frozen, live, sharded)
    experts = {fqn for fqn, _, named in iter_params(meta) if is_expert_placement(named)}
    if expert is not None:
        _bind_expert_parallel(model, expert, experts)
        install_grad_scale(model, sorted(experts), 1.0 / expert.ep_size)
    _bind_token_gather(model, meta, records, active)
    if CP in active.axes:
        from hpcodegen.plan.codec import plan_from_meta

        _install_cp(model, plan if plan is not None else plan_from_meta(meta), active)
    _bind_injections(model, injections, records)
    if TP in active.axes:
        install_grad_allreduce(model, _partial_grad_fqns(meta), active.tp_group())
    return _source_info(model, active, sharded, expert, experts)
