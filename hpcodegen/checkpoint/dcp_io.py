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

import os
import shutil
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hpcodegen.checkpoint.layout import ShardLayout
from hpcodegen.checkpoint.optim_state import GROUPS, MODEL, STEP
from hpcodegen.checkpoint.optim_state import entries as optimizer_entries
from hpcodegen.checkpoint.record import check_target, write_record
from hpcodegen.errors import InputError, PlanError, error
from hpcodegen.placement import from_torch


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
        out[name] = str(from_torch(p))
    return out


def save(directory: str | os.PathLike[str], model: nn.Module,
         layout: ShardLayout | None = None, *,
         optimizer: torch.optim.Optimizer | None = None, step: int = 0,
         record: Mapping[str, Any] | None = None,
         params: Collection[str] | None = None) -> Path:
    """Write a DCP checkpoint of ``model`` (and ``optimizer``, ``step``) to ``directory``.

    Collective: every rank calls it. ``params`` (canonical FQNs) are the parameters this
    rank writes, with their optimizer state (default all): a pipeline rank writes only its
    stages' and DCP's plan is the union over the ranks, so the checkpoint holds the whole
    model under its own FQNs, each parameter from its owner, as DTensors of whatever
    placements the rank holds (an FSDP2 shard over dp and tp included).

    The files go to a new hidden sibling
    (``.<name>.<random>.partial``, created here, so nothing else is ever removed) and the
    directory appears under its name only once every rank wrote its part and rank 0 added
    ``hpcodegen_checkpoint.json`` (``record`` plus the step, dtype, optimizer class, the
    mesh the placements refer to (``shard_mesh``), each parameter's global shape and
    placements, and the sha256 of every file, each rank hashing the files it wrote).

    Raises:
        UsageError: ``directory`` exists and is not empty.
    """
    import torch.distributed.checkpoint as dcp

    target = Path(os.path.abspath(directory))
    check_target(target)
    layout = layout if layout is not None else ShardLayout.of(model)
    _refuse_strided(layout)
    stage = _new_stage(target)
    try:
        mine = _mine(layout, params)
        state: dict[str, Any] = {f"{MODEL}{fqn}": layout.to_dtensor(
            fqn, model.get_parameter(fqn)) for fqn in mine}
        if optimizer is not None:
            state.update(optimizer_entries(model, layout, optimizer, set(mine)))
        state[STEP] = int(step)
        dcp.save(state, checkpoint_id=str(stage))
        digests = _gathered_digests(stage)
        if _rank() == 0:
            write_record(stage, _record(model, layout, optimizer, step, record), digests)
            if target.exists():
                target.rmdir()  # empty (checked above)
            os.replace(stage, target)
    except BaseException:
        if _rank() == 0:
            shutil.rmtree(stage, ignore_errors=True)  # ours: created by _new_stage
        raise
    _barrier()
    return target


def _mine(layout: ShardLayout, params: Collection[str] | None) -> list[str]:
    """The canonical FQNs of ``params`` (all of the layout's when None), in layout order."""
    if params is None:
        return list(layout.params)
    wanted = {layout.aliases.get(fqn, fqn) for fqn in params}
    unknown = sorted(wanted - set(layout.params))
    if unknown:
        raise ValueError(f"not parameters of the model: {unknown[:3]}")
    return [fqn for fqn in layout.params if fqn in wanted]


def _new_stage(target: Path) -> Path:
    """A fresh hidden sibling of ``target`` made by rank 0, its name shared with all ranks."""
    import tempfile

    name = [None]
    if _rank() == 0:
        target.parent.mkdir(parents=True, exist_ok=True)
        name[0] = tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".partial",
                                   dir=target.parent)
    dist = _dist()
    if dist is not None:
        dist.broadcast_object_list(name, src=0)
    return Path(str(name[0]))


def _gathered_digests(stage: Path) -> dict[str, str]:
    """sha256 of the data files this rank wrote (DCP names them ``__<rank>_<n>.distcp``),
    merged over the ranks (collective)."""
    from hpcodegen.checkpoint.record import file_sha256

    rank = _rank()
    mine = {p.name: file_sha256(p) for p in stage.glob(f"__{rank}_*.distcp")}
    dist = _dist()
    if dist is None:
        return mine
    parts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, mine)
    return {k: v for part in parts for k, v in (part or {}).items()}


def _record(model: nn.Module, layout: ShardLayout, optimizer: Any, step: int,
            record: Mapping[str, Any] | None) -> dict[str, Any]:
    first = next(iter(layout.params), None)
    dtype = str(model.get_parameter(first).dtype).removeprefix("torch.") if first else None
    mesh = layout.mesh
    return {
        **(record or {}), "step": int(step), "dtype": dtype,
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
    """Every model parameter is in the checkpoint as a tensor of its global shape, and
    nothing else is (dtypes were checked against the record: DCP converts on load)."""
    from hpcodegen.checkpoint.metadata import tensor_problems

    expected = {f"{MODEL}{f}": (spec.global_shape, None) for f, spec in layout.params.items()}
    problems = tensor_problems(metadata, expected) + [
        f"{key[len(MODEL):]}: not a parameter of the model" for key in metadata.state_dict_metadata
        if key.startswith(MODEL) and key not in expected
        and key[len(MODEL):] not in layout.aliases]
    if problems:
        raise InputError([error("checkpoint.params", str(directory),
                                "the checkpoint does not fit the model: "
                                + "; ".join(problems[:3])
                                + (f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""),
                                hint="resume with the artifact and config the checkpoint "
                                     "was saved with (any tp and dp)")])


def resume(directory: str | os.PathLike[str], model: nn.Module,
           layout: ShardLayout | None = None, *,
           optimizer: torch.optim.Optimizer | None = None,
           params: Collection[str] | None = None) -> int:
    """Load a checkpoint saved by :func:`save` (any tp, any dp) into ``model`` in place.

    ``params`` (FQNs; default all) are the parameters this rank loads, with their optimizer
    state: a pipeline rank's stages' (the checkpoint must still hold the whole model).

    Collective. The checkpoint is untrusted input: its record and metadata are read as
    plain data and checked against each other and against ``layout`` (every parameter
    present with its global shape), the ranks share the sha256 check of its files, and
    only then are the chunks read, each checked (:mod:`hpcodegen.checkpoint.dcp_safe`).
    ``optimizer`` gets its saved state (when the checkpoint has one), checked against the
    optimizer's own groups.

    Returns:
        The step the checkpoint was saved at.

    Raises:
        InputError: (exit 2) the checkpoint is damaged, foreign, or not of this model.
    """
    from hpcodegen.checkpoint import optim_state
    from hpcodegen.checkpoint.dcp_safe import load
    from hpcodegen.checkpoint.integrity import open_checkpoint

    path = Path(directory)
    layout = layout if layout is not None else ShardLayout.of(model)
    _refuse_strided(layout)
    checked = open_checkpoint(path, digests="share")
    metadata = checked.metadata
    _check_params(layout, metadata, path)
    mine = _mine(layout, params)
    state: dict[str, Any] = {f"{MODEL}{fqn}": layout.to_dtensor(
        fqn, model.get_parameter(fqn).detach()) for fqn in mine}
    entries = metadata.state_dict_metadata
    has_optim = optimizer is not None and GROUPS in entries
    if has_optim:
        state.update(optim_state.placeholders(model, layout, entries, path, set(mine)))
    state.update(optim_state.plain_items(entries, path, with_groups=has_optim))
    load(state, path, metadata)
    step = state[STEP]
    if type(step) is not int or not 0 <= step < 2**63:  # a 5,000-digit int has no repr
        shown = repr(step) if type(step) is not int or abs(step) < 10**30 else "a huge integer"
        raise InputError([error("checkpoint.step", STEP, f"the saved step is {shown[:80]}",
                                expected="an integer in 0 .. 2^63-1", file=str(path))])
    if has_optim:
        from hpcodegen.runtime.state_dict import attach_optimizer

        attach_optimizer(optimizer)  # its state_dict() shows DTensors, as after a step
        optim_state.load_into(optimizer, model, layout, state, path)
    return step
