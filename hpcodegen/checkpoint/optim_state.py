"""The optimizer's part of a checkpoint: written as DCP items, read back checked.

Keys: ``optim.<fqn>.<state>`` (``exp_avg``, ``step``...: a state tensor shaped like its
parameter goes in as a DTensor with the parameter's placements), ``optim.param_groups``
(the groups as JSON text, parameters by FQN) and ``step``. On load every saved item must
belong to a parameter of the model, be no larger than it, and the groups must be the
optimizer's own (same parameters, same hyperparameter names, values of the same kinds), so
what ``load_state_dict`` receives is data the optimizer already understands.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hpcodegen.checkpoint.layout import ShardLayout
from hpcodegen.errors import InputError, error

MODEL, OPTIM, GROUPS, STEP = "model.", "optim.", "optim.param_groups", "step"
#: dtypes an optimizer state may be saved in
_STATE_DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16, torch.int64,
                 torch.int32)


def fqn_of(model: nn.Module, layout: ShardLayout) -> dict[int, str]:
    """``{id(parameter): canonical fqn}`` (tied aliases mapped to their canonical name)."""
    by_id = {id(p): fqn for fqn, p in model.named_parameters(remove_duplicate=False)}
    return {k: layout.aliases.get(v, v) for k, v in by_id.items()}


def entries(model: nn.Module, layout: ShardLayout, optimizer: torch.optim.Optimizer,
            params: Collection[str] | None = None) -> dict[str, Any]:
    """The optimizer's state as flat DCP items (see the module docstring), of the
    parameters ``params`` (canonical FQNs; default all) only; a state the optimizer's own
    ``state_dict`` already gives as a DTensor (the runtime's hooks,
    :mod:`hpcodegen.runtime.state_dict`, or FSDP2's sharded parameters) goes in as it is."""
    from torch.distributed.tensor import DTensor

    fqns = fqn_of(model, layout)
    ordered = [fqns[id(p)] for group in optimizer.param_groups for p in group["params"]]
    sd = optimizer.state_dict()
    out: dict[str, Any] = {}
    for index, state in sd["state"].items():
        fqn = ordered[index]
        if params is not None and fqn not in params:
            continue
        local = model.get_parameter(fqn)
        for key, value in state.items():
            if torch.is_tensor(value) and not isinstance(value, DTensor) and value.dim() \
                    and value.shape == local.shape:
                value = layout.to_dtensor(fqn, value)
            out[f"{OPTIM}{fqn}.{key}"] = value
    groups = []
    for group in sd["param_groups"]:
        groups.append({**{k: v.item() if torch.is_tensor(v) else v for k, v in group.items()},
                       "params": [ordered[i] for i in group["params"]]})
    out[GROUPS] = json.dumps(groups)
    return out


def _bad(path: Path, where: str, message: str) -> InputError:
    return InputError([error("checkpoint.optimizer", where, message, file=str(path),
                             hint="resume with the optimizer class and parameter groups the "
                                  "checkpoint was saved with")])


def _owner(key: str, fqns: list[str]) -> str | None:
    rest = key[len(OPTIM):]
    return next((f for f in fqns if rest.startswith(f + ".") and rest[len(f) + 1:]
                 and "." not in rest[len(f) + 1:]), None)


def placeholders(model: nn.Module, layout: ShardLayout, metadata: Mapping[str, Any],
                 path: Path, params: Collection[str] | None = None) -> dict[str, Any]:
    """Empty tensors (DTensors for parameter-shaped ones) for every saved optimizer state
    of the parameters ``params`` (canonical FQNs; default all); a parameter-shaped state of
    a DTensor parameter takes that parameter's own mesh and placements (FSDP2's shard over
    dp and tp: DCP reads the chunks it needs, whatever mesh saved them).

    Raises:
        InputError: a state of a parameter the model does not have, of a dtype no
            optimizer keeps, or larger than its parameter.
    """
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    fqns = sorted(layout.params, key=len, reverse=True)
    out: dict[str, Any] = {}
    for key, md in metadata.items():
        if not key.startswith(OPTIM) or key == GROUPS:
            continue
        fqn = _owner(key, fqns)
        if fqn is None:
            raise _bad(path, key, "optimizer state of a parameter the model does not have")
        if params is not None and fqn not in params:
            continue
        if not isinstance(md, TensorStorageMetadata):
            out[key] = None
            continue
        size, dtype = tuple(md.size), md.properties.dtype
        spec = layout.params[fqn]
        numel = int(torch.Size(size).numel())
        if dtype not in _STATE_DTYPES or numel > max(1, int(torch.Size(spec.global_shape).numel())):
            raise _bad(path, key, f"a {dtype} state of shape {size} for a parameter of "
                                  f"shape {spec.global_shape}")
        param = model.get_parameter(fqn)
        device = param.device
        if size == spec.global_shape and size and hasattr(param, "device_mesh"):
            out[key] = torch.empty_like(param.detach(), dtype=dtype)
        elif size == spec.global_shape and size:
            out[key] = layout.to_dtensor(fqn, torch.empty(layout.local_shape(fqn),
                                                          dtype=dtype, device=device))
        else:
            out[key] = torch.empty(size, dtype=dtype, device="cpu" if not size else device)
    return out


def plain_items(metadata: Mapping[str, Any], path: Path, *, with_groups: bool) -> dict[str, Any]:
    """Placeholders of the non-tensor items to load: the step (an int) and the groups (JSON
    text); their types are what the loaded items must be (checked before anything is
    walked: :func:`hpcodegen.checkpoint.dcp_safe.plain_problem`)."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    keys = (STEP, GROUPS) if with_groups else (STEP,)
    for key in keys:
        if not isinstance(metadata.get(key), BytesStorageMetadata):
            raise InputError([error("checkpoint.params", key, "missing or not a plain value",
                                    file=str(path))])
    return {key: 0 if key == STEP else "" for key in keys}


def _same_kind(saved: Any, live: Any) -> bool:
    number = (int, float)
    if isinstance(live, bool) or isinstance(saved, bool):
        return type(saved) is type(live)
    if isinstance(live, number):
        return isinstance(saved, number)
    if isinstance(live, (list, tuple)):
        return isinstance(saved, (list, tuple)) and len(saved) == len(live) and all(
            _same_kind(a, b) for a, b in zip(saved, live, strict=True))
    if torch.is_tensor(live):
        return isinstance(saved, number)
    return type(saved) is type(live)


def _groups(raw: Any, optimizer: torch.optim.Optimizer, fqns: dict[int, str],
            path: Path) -> list[dict[str, Any]]:
    """The saved groups, checked against the optimizer's own."""
    try:
        groups = json.loads(raw) if isinstance(raw, str) else None
    except (ValueError, RecursionError):
        groups = None
    live = optimizer.param_groups
    if not isinstance(groups, list) or len(groups) != len(live) or not all(
            isinstance(g, dict) for g in groups):
        raise _bad(path, GROUPS, f"{len(live)} parameter group(s) expected as JSON")
    for i, (saved, group) in enumerate(zip(groups, live, strict=True)):
        if saved.get("params") != [fqns[id(p)] for p in group["params"]]:
            raise _bad(path, f"{GROUPS}/{i}",
                       "the optimizer's parameter groups differ from the checkpoint's")
        odd = [k for k, v in saved.items() if k != "params"
               and (k not in group or not _same_kind(v, group[k]))]
        if odd:
            raise _bad(path, f"{GROUPS}/{i}/{odd[0]}",
                       f"hyperparameter {odd[0]!r}: {str(saved[odd[0]])[:80]!r} is not a "
                       "value this optimizer takes")
    return groups


def load_into(optimizer: torch.optim.Optimizer, model: nn.Module, layout: ShardLayout,
              state: Mapping[str, Any], path: Path) -> None:
    """Give ``optimizer`` the loaded items of ``state`` (checked; InputError otherwise)."""
    fqns = fqn_of(model, layout)
    ordered = [fqns[id(p)] for group in optimizer.param_groups for p in group["params"]]
    groups = _groups(state[GROUPS], optimizer, fqns, path)
    index = {fqn: i for i, fqn in enumerate(ordered)}
    per_param: dict[int, dict[str, Any]] = {}
    for key, value in state.items():
        if not key.startswith(OPTIM) or key == GROUPS:
            continue
        fqn = _owner(key, sorted(index, key=len, reverse=True))
        if fqn is None:
            raise _bad(path, key, "state of a parameter this optimizer does not hold")
        keep = hasattr(model.get_parameter(fqn), "to_local")  # a DTensor parameter's state
        local = value.to_local() if hasattr(value, "to_local") and not keep else value
        if not torch.is_tensor(local) and not isinstance(local, (int, float)):
            raise _bad(path, key, f"a {type(local).__name__}, expected a tensor or a number")
        per_param.setdefault(index[fqn], {})[key[len(OPTIM) + len(fqn) + 1:]] = local
    optimizer.load_state_dict({
        "state": per_param,
        "param_groups": [{**g, "params": [index[f] for f in g["params"]]} for g in groups]})
