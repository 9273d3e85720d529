"""Save and resume training with ``torch.distributed.checkpoint`` (DCP), at any tp and dp.

Each parameter goes to DCP as the DTensor it is a shard of (global shape, placements on
the plan's submesh, this rank's local shard), and so does every optimizer state tensor
shaped like its parameter. DCP writes each chunk once (dp replicas are deduplicated) and
on load reads, for the new layout, exactly the chunks each rank needs: resharding from
tp=2 to tp=4 is DCP's work, not ours. Loads go into the live tensors in place.

Keys of the flat state dict: ``model.<fqn>``, ``optim.<fqn>.<state>`` (``exp_avg``,
``step``...), ``optim.param_groups`` (JSON, parameters by FQN) and ``step``.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hpcodegen.checkpoint.layout import ShardLayout
from hpcodegen.checkpoint.record import check_target, read_record, write_record
from hpcodegen.errors import PlanError, error

MODEL, OPTIM, GROUPS, STEP = "model.", "optim.", "optim.param_groups", "step"


def _dist() -> Any:
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def _barrier() -> None:
    dist = _dist()
    if dist is not None:
        dist.barrier()


def _rank() -> int:
    dist = _dist()
    return dist.get_rank() if dist is not None else 0


def _placement_text(layout: ShardLayout, fqn: str) -> dict[str, str]:
    spec = layout.params[fqn]
    names = tuple(spec.mesh.mesh_dim_names or ()) if spec.mesh is not None else ()
    out = {}
    for name, p in zip(names, spec.placements, strict=False):
        out[name] = f"S({p.dim})" if p.is_shard() else "R"
    return out


def _fqn_of(model: nn.Module, layout: ShardLayout) -> dict[int, str]:
    by_id = {id(p): fqn for fqn, p in model.named_parameters(remove_duplicate=False)}
    return {k: layout.aliases.get(v, v) for k, v in by_id.items()}


def _optimizer_entries(model: nn.Module, layout: ShardLayout,
                       optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    fqns = _fqn_of(model, layout)
    ordered = [fqns[id(p)] for group in optimizer.param_groups for p in group["params"]]
    sd = optimizer.state_dict()
    out: dict[str, Any] = {}
    for index, state in sd["state"].items():
        fqn = ordered[index]
        local = model.get_parameter(fqn)
        for key, value in state.items():
            if torch.is_tensor(value) and value.dim() and value.shape == local.shape:
                value = layout.to_dtensor(fqn, value)
            out[f"{OPTIM}{fqn}.{key}"] = value
    groups = []
    for group in sd["param_groups"]:
        groups.append({**{k: v.item() if torch.is_tensor(v) else v for k, v in group.items()},
                       "params": [ordered[i] for i in group["params"]]})
    out[GROUPS] = json.dumps(groups)
    return out


def save(directory: str | os.PathLike[str], model: nn.Module, layout: ShardLayout, *,
         optimizer: torch.optim.Optimizer | None = None, step: int = 0,
         record: Mapping[str, Any] | None = None) -> Path:
    """Write a DCP checkpoint of ``model`` (and ``optimizer``, ``step``) to ``directory``.

    Collective: every rank calls it. The files go to ``.<name>.partial`` first and the
    directory appears under its name only once every rank wrote its part and rank 0 added
    ``hpcodegen_checkpoint.json`` (``record`` plus the step, dtype, optimizer class, the
    mesh the placements refer to (``shard_mesh``) and each parameter's global shape and
    placements).

    Raises:
        UsageError: ``directory`` exists and is not empty.
    """
    import torch.distributed.checkpoint as dcp

    target = Path(directory)
    check_target(target)
    _refuse_strided(layout)
    stage = target.parent / f".{target.name}.partial"
    if _rank() == 0:
        shutil.rmtree(stage, ignore_errors=True)
        stage.parent.mkdir(parents=True, exist_ok=True)
    _barrier()
    state: dict[str, Any] = {f"{MODEL}{fqn}": layout.to_dtensor(fqn, model.get_parameter(fqn))
                             for fqn in layout.params}
    if optimizer is not None:
        state.update(_optimizer_entries(model, layout, optimizer))
    state[STEP] = int(step)
    dcp.save(state, checkpoint_id=str(stage))
    if _rank() == 0:
        first = next(iter(layout.params), None)
        dtype = str(model.get_parameter(first).dtype).removeprefix("torch.") if first else None
        mesh = layout.mesh
        write_record(stage, {
            **(record or {}), "step": int(step), "dtype": dtype,
            "optimizer": type(optimizer).__name__ if optimizer is not None else None,
            "shard_mesh": dict(zip(mesh.mesh_dim_names, mesh.mesh.shape, strict=True))
            if mesh is not None else {},
            "params": {fqn: {"shape": list(spec.global_shape),
                             "placements": _placement_text(layout, fqn)}
                       for fqn, spec in layout.params.items()},
            "aliases": dict(layout.aliases)})
        if target.exists():
            target.rmdir()  # empty (checked above)
        os.replace(stage, target)
    _barrier()
    return target


def _refuse_strided(layout: ShardLayout) -> None:
    """DCP stores a shard as one chunk at one offset; a strided shard is several."""
    strided = [fqn for fqn in layout.params if layout.is_strided(fqn)]
    if strided:
        raise PlanError([error("checkpoint.strided", strided[0],
                               f"strided shards (SS(d,f)) cannot be saved or resumed yet: "
                               f"{len(strided)} parameter(s), e.g. {strided[0]}",
                               hint="a plan without fused strided shards (e.g. separate "
                                    "gate/up projections) saves and resumes")])


def _check_params(layout: ShardLayout, metadata: Mapping[str, Any], directory: Path) -> None:
    """Every model parameter is in the checkpoint with its global shape, and nothing else."""
    saved = {k[len(MODEL):]: v for k, v in metadata.items() if k.startswith(MODEL)}
    missing = [f for f in layout.params if f not in saved]
    extra = [f for f in saved if f not in layout.params and f not in layout.aliases]
    wrong = [f"{f}: checkpoint {tuple(saved[f].size)}, model {spec.global_shape}"
             for f, spec in layout.params.items()
             if f in saved and tuple(saved[f].size) != spec.global_shape]
    if missing or extra or wrong:
        raise PlanError([error("checkpoint.params", str(directory),
                               f"the checkpoint does not fit the model: missing {missing[:3]}, "
                               f"unexpected {extra[:3]}, other shapes {wrong[:3]}")])


def _optimizer_placeholders(model: nn.Module, layout: ShardLayout,
                            metadata: Mapping[str, Any]) -> dict[str, Any]:
    """Empty tensors (DTensors for parameter-shaped ones) for every saved optimizer state."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    fqns = sorted(layout.params, key=len, reverse=True)
    out: dict[str, Any] = {}
    for key, md in metadata.items():
        if not key.startswith(OPTIM) or key == GROUPS:
            continue
        rest = key[len(OPTIM):]
        fqn = next((f for f in fqns if rest.startswith(f + ".")
                    and "." not in rest[len(f) + 1:]), None)
        if fqn is None:
            raise PlanError([error("checkpoint.optimizer", key,
                                   "optimizer state of a parameter the model does not have")])
        if not isinstance(md, TensorStorageMetadata):
            out[key] = None
            continue
        size, dtype = tuple(md.size), md.properties.dtype
        device = model.get_parameter(fqn).device
        if size == layout.params[fqn].global_shape and size:
            out[key] = layout.to_dtensor(fqn, torch.empty(layout.local_shape(fqn),
                                                          dtype=dtype, device=device))
        else:
            out[key] = torch.empty(size, dtype=dtype, device="cpu" if not size else device)
    return out


def _load_optimizer(model: nn.Module, layout: ShardLayout, optimizer: torch.optim.Optimizer,
                    state: Mapping[str, Any]) -> None:
    fqns = _fqn_of(model, layout)
    ordered = [fqns[id(p)] for group in optimizer.param_groups for p in group["params"]]
    groups = json.loads(state[GROUPS])
    if [g["params"] for g in groups] != [[fqns[id(p)] for p in g["params"]]
                                         for g in optimizer.param_groups]:
        raise PlanError([error("checkpoint.optimizer", GROUPS,
                               "the optimizer's parameter groups differ from the checkpoint's")])
    index = {fqn: i for i, fqn in enumerate(ordered)}
    per_param: dict[int, dict[str, Any]] = {}
    for key, value in state.items():
        if not key.startswith(OPTIM) or key == GROUPS:
            continue
        rest = key[len(OPTIM):]
        fqn = next(f for f in sorted(index, key=len, reverse=True) if rest.startswith(f + "."))
        local = value.to_local() if hasattr(value, "to_local") else value
        per_param.setdefault(index[fqn], {})[rest[len(fqn) + 1:]] = local
    optimizer.load_state_dict({
        "state": per_param,
        "param_groups": [{**g, "params": [index[f] for f in g["params"]]} for g in groups]})


def resume(directory: str | os.PathLike[str], model: nn.Module, layout: ShardLayout, *,
           optimizer: torch.optim.Optimizer | None = None) -> int:
    """Load a checkpoint saved by :func:`save` (any tp, any dp) into ``model`` in place.

    Collective. ``optimizer`` gets its saved state (when the checkpoint has one).

    Returns:
        The step the checkpoint was saved at.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader

    path = Path(directory)
    read_record(path)
    _refuse_strided(layout)
    metadata = FileSystemReader(str(path)).read_metadata().state_dict_metadata
    _check_params(layout, metadata, path)
    state: dict[str, Any] = {f"{MODEL}{fqn}": layout.to_dtensor(
        fqn, model.get_parameter(fqn).detach()) for fqn in layout.params}
    has_optim = GROUPS in metadata
    if optimizer is not None and has_optim:
        state.update(_optimizer_placeholders(model, layout, metadata))
        state[GROUPS] = ""
    state[STEP] = 0
    dcp.load(state, checkpoint_id=str(path))
    if optimizer is not None and has_optim:
        _load_optimizer(model, layout, optimizer, state)
    return int(state[STEP])
