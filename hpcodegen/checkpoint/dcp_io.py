"""Save and resume training with ``torch.distributed.checkpoint`` (DCP), at any tp and dp.

A parallelized model's ``state_dict()`` already holds DTensors with the plan's placements,
and so does its optimizer's (:mod:`hpcodegen.runtime.state_dict`), so this is torch's own
recipe: ``get_model_state_dict`` / ``get_optimizer_state_dict``, ``dcp.save``; at resume
the same two (at the new tp and dp) as the template, ``dcp.load`` into them (each rank reads
the saved chunks overlapping its new slice: resharding is DCP's work), then
``set_model_state_dict`` / ``set_optimizer_state_dict``. What is left here is what DCP
does not do: an atomic directory, a record of what was saved (:mod:`.record`), and errors
that name the parameters that do not fit.

Keys (DCP flattens the nested dict): ``model.<fqn>``, ``optim.state.<fqn>.<state>``,
``optim.param_groups``, ``step``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hpcodegen.checkpoint.layout import ShardLayout
from hpcodegen.checkpoint.record import FORMAT_V1, check_target, read_record, write_record
from hpcodegen.errors import PlanError, error
from hpcodegen.placement import Replicate, Shard, StridedShard
from hpcodegen.runtime.shards import local_grad

MODEL, OPTIM, STEP = "model", "optim", "step"


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
    """``{axis: "S(0)"}`` in the plan's grammar, for the record."""
    from torch.distributed.tensor.placement_types import _StridedShard

    spec = layout.params[fqn]
    names = tuple(spec.mesh.mesh_dim_names or ()) if spec.mesh is not None else ()
    out = {}
    for name, p in zip(names, spec.placements, strict=False):
        ours = (StridedShard(p.dim, p.split_factor) if isinstance(p, _StridedShard)
                else Shard(p.dim) if p.is_shard() else Replicate())
        out[name] = str(ours)
    return out


def _initialize(optimizer: torch.optim.Optimizer) -> None:
    """Give a fresh optimizer its state tensors (a zero-gradient step at lr 0), whatever
    gradients the parameters hold: ``get_optimizer_state_dict`` skips that step when a
    parameter has a gradient, and an optimizer without state loads nothing from DCP."""
    if optimizer.state:
        return
    params = [p for group in optimizer.param_groups for p in group["params"]]
    grads = [local_grad(p) for p in params]
    lrs = [group.get("lr") for group in optimizer.param_groups]
    try:
        for p in params:
            p.grad = torch.zeros_like(p) if p.requires_grad else None
        for group in optimizer.param_groups:
            if "lr" in group:
                group["lr"] = torch.tensor(0.0) if torch.is_tensor(group["lr"]) else 0.0
        optimizer.step()
    finally:
        for group, lr in zip(optimizer.param_groups, lrs, strict=True):
            if lr is not None:
                group["lr"] = lr
        for p, g in zip(params, grads, strict=True):
            p.grad = g


def _state(model: nn.Module, optimizer: torch.optim.Optimizer | None, *,
           template: bool = False) -> dict[str, Any]:
    """The nested state dict DCP saves, or (``template``) loads into."""
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    state: dict[str, Any] = {MODEL: get_model_state_dict(model)}
    if optimizer is not None:
        if template:
            _initialize(optimizer)
        state[OPTIM] = get_optimizer_state_dict(model, optimizer)
    return state


def save(directory: str | os.PathLike[str], model: nn.Module, *,
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
        PlanError: a strided shard (DCP stores one chunk per shard).
    """
    import torch.distributed.checkpoint as dcp

    target = Path(directory)
    check_target(target)
    layout = ShardLayout.of(model)
    _refuse_strided(layout)
    stage = target.parent / f".{target.name}.partial"
    if _rank() == 0:
        shutil.rmtree(stage, ignore_errors=True)
        stage.parent.mkdir(parents=True, exist_ok=True)
    _barrier()
    dcp.save({**_state(model, optimizer), STEP: int(step)}, checkpoint_id=str(stage))
    if _rank() == 0:
        write_record(stage, _record(model, layout, optimizer, step, record))
        if target.exists():
            target.rmdir()  # empty (checked above)
        os.replace(stage, target)
    _barrier()
    return target


def _record(model: nn.Module, layout: ShardLayout, optimizer: Any, step: int,
            record: Mapping[str, Any] | None) -> dict[str, Any]:
    first = next(iter(layout.params), None)
    dtype = str(model.get_parameter(first).dtype).removeprefix("torch.") if first else None
    mesh = layout.mesh
    return {**(record or {}), "step": int(step), "dtype": dtype,
            "optimizer": type(optimizer).__name__ if optimizer is not None else None,
            "shard_mesh": dict(zip(mesh.mesh_dim_names, mesh.mesh.shape, strict=True))
            if mesh is not None else {},
            "params": {fqn: {"shape": list(spec.global_shape),
                             "placements": _placement_text(layout, fqn)}
                       for fqn, spec in layout.params.items()},
            "aliases": dict(layout.aliases)}


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
    prefix = MODEL + "."
    saved = {k[len(prefix):]: v for k, v in metadata.items() if k.startswith(prefix)}
    missing = [f for f in layout.params if f not in saved]
    extra = [f for f in saved if f not in layout.params and f not in layout.aliases]
    wrong = [f"{f}: checkpoint {tuple(saved[f].size)}, model {spec.global_shape}"
             for f, spec in layout.params.items()
             if f in saved and tuple(saved[f].size) != spec.global_shape]
    if missing or extra or wrong:
        raise PlanError([error("checkpoint.params", str(directory),
                               f"the checkpoint does not fit the model: missing {missing[:3]}, "
                               f"unexpected {extra[:3]}, other shapes {wrong[:3]}")])


def resume(directory: str | os.PathLike[str], model: nn.Module, *,
           optimizer: torch.optim.Optimizer | None = None) -> int:
    """Load a checkpoint saved by :func:`save` (any tp, any dp) into ``model`` in place.

    Collective. ``optimizer`` gets its saved state (when the checkpoint has one).

    Returns:
        The step the checkpoint was saved at.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.state_dict import (
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    path = Path(directory)
    record = read_record(path)
    layout = ShardLayout.of(model)
    _refuse_strided(layout)
    metadata = FileSystemReader(str(path)).read_metadata().state_dict_metadata
    _check_params(layout, metadata, path)
    has_optim = any(k.startswith(OPTIM + ".") for k in metadata)
    if optimizer is not None and has_optim and record.get("format") == FORMAT_V1:
        raise PlanError([error("checkpoint.old_optimizer", str(path),
                               "the checkpoint's optimizer state has an older layout "
                               f"({FORMAT_V1}); its model weights load, its optimizer "
                               "state does not", hint="resume without the optimizer")])
    state = {**_state(model, optimizer if has_optim else None, template=True), STEP: 0}
    dcp.load(state, checkpoint_id=str(path))
    set_model_state_dict(model, state[MODEL])
    if OPTIM in state:
        set_optimizer_state_dict(model, optimizer, state[OPTIM])
    return int(state[STEP])
