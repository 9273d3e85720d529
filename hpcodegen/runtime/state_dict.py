"""``state_dict()`` of a parallelized model and of its optimizers: DTensors, no communication.

The parameters are DTensors (:mod:`hpcodegen.runtime.shards`), so their state-dict entries
are too, and ``torch.distributed.checkpoint`` save and load and the helpers of
``torch.distributed.checkpoint.state_dict`` work unchanged and reshard across tp. A
post-hook on the model covers a planned parameter held as a plain local shard (turned into
the DTensor it is a shard of: :meth:`ShardSpec.to_dtensor`, no copy). A pre-hook on
``load_state_dict`` takes DTensors (any placements: redistributed), tensors of the global
shape (sliced) and local shards alike, each made what the parameter holds.

Optimizers get the same pair of hooks for their parameter-shaped state (``exp_avg``...),
attached the first time an optimizer holding such parameters steps (a process-wide
``register_optimizer_step_pre_hook``; torch has no hook at an optimizer's construction).
``get_optimizer_state_dict`` steps once with zero gradients before reading a fresh
optimizer; where it does not (its parameters already hold gradients), a state loaded as
DTensors is made local at the first step, before the update reads it.

A model wrapped by ``fully_shard`` after install holds FSDP's DTensors over dp and tp:
its entries are those DTensors, saved and loaded as they are.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hpcodegen.runtime.shards import ShardSpec, parallel_state, remember, spec_of

_HOOKED = "_hp_state_dict_hooks"
_OPTIM_HOOKED = "_hp_optim_hooks"
_OPTIM_SEEN = "_hp_optim_params_seen"
_STEP_HOOK: Any = None


def install_state_dict_hooks(model: nn.Module) -> None:
    """Give ``model`` the state-dict hooks of the module docstring (once)."""
    if model.__dict__.get(_HOOKED):
        return
    model.register_state_dict_post_hook(_to_dtensors)
    model.register_load_state_dict_pre_hook(_to_locals)
    model.__dict__[_HOOKED] = True
    _watch_optimizers()


def _to_dtensors(module: nn.Module, state_dict: dict[str, Any], prefix: str,
                 local_metadata: Any) -> None:
    state = parallel_state(module)
    if state is None:
        return
    for fqn, spec in state.specs.items():
        key = prefix + fqn
        value = state_dict.get(key)
        if value is None or spec.mesh is None or _is_dtensor(value):
            continue  # a DTensor parameter (FSDP2's too) is its own entry
        state_dict[key] = spec.to_dtensor(value)


def _to_locals(module: nn.Module, state_dict: dict[str, Any], prefix: str,
               local_metadata: Any, strict: bool, missing: list[str],
               unexpected: list[str], errors: list[str]) -> None:
    """Each entry as the parameter holds it: for a DTensor parameter (a global tensor
    sliced, a DTensor of other placements redistributed) a DTensor of its placements."""
    state = parallel_state(module)
    if state is None:
        return
    assign = bool(local_metadata.get("assign_to_params_buffers", False))
    for fqn, recorded in state.specs.items():
        key = prefix + fqn
        if key not in state_dict:
            continue
        current = module.get_parameter(fqn)
        spec = _current_spec(current, recorded)
        value = spec.to_local(state_dict[key], key)
        if _is_dtensor(current):
            value = spec.to_dtensor(value)
        if assign:  # the loaded tensor becomes the parameter: keep its kind and its spec
            value = nn.Parameter(value, requires_grad=current.requires_grad)
            remember(value, recorded)
        state_dict[key] = value


def _is_dtensor(value: Any) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(value, DTensor)


def _current_spec(param: torch.Tensor, recorded: ShardSpec) -> ShardSpec:
    """What ``param`` holds now: a DTensor parameter's own mesh and placements (FSDP2's
    over dp and tp after ``fully_shard``), else the spec install recorded."""
    if _is_dtensor(param):
        return ShardSpec(tuple(param.shape), tuple(param.placements), param.device_mesh)
    return recorded


def _local_spec(param: torch.Tensor) -> ShardSpec | None:
    """The spec of a parameter held as a plain local shard (a DTensor parameter's optimizer
    state is DTensors already: no hook needed)."""
    return None if _is_dtensor(param) else spec_of(param)


def _watch_optimizers() -> None:
    global _STEP_HOOK
    if _STEP_HOOK is None:
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        _STEP_HOOK = register_optimizer_step_pre_hook(_attach)


def _params(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def _attach(optimizer: torch.optim.Optimizer, args: Any = (), kwargs: Any = None) -> None:
    """Before a step: hook an optimizer holding runtime parameters, once (looked at again
    only when its parameter count changes)."""
    params = _params(optimizer)
    seen = optimizer.__dict__.get(_OPTIM_SEEN)
    if seen == len(params):
        return
    optimizer.__dict__[_OPTIM_SEEN] = len(params)
    if not optimizer.__dict__.get(_OPTIM_HOOKED) \
            and any(_local_spec(p) is not None for p in params):
        optimizer.register_state_dict_post_hook(_optim_to_dtensors)
        optimizer.register_load_state_dict_pre_hook(_optim_to_locals)
        optimizer.__dict__[_OPTIM_HOOKED] = True
        _localize_loaded(optimizer, params)


def _localize_loaded(optimizer: torch.optim.Optimizer, params: list[torch.Tensor]) -> None:
    """State loaded before the hooks were attached (``set_optimizer_state_dict`` into an
    optimizer that never stepped, its parameters holding gradients) came in as DTensors:
    make it local shards now, before the step uses it."""
    from torch.distributed.tensor import DTensor

    for p in params:
        spec, entry = _local_spec(p), optimizer.state.get(p)
        if spec is None or spec.mesh is None or not entry:
            continue
        for name, value in list(entry.items()):
            if isinstance(value, DTensor):
                entry[name] = spec.to_local(value, name)


def attach_optimizer(optimizer: torch.optim.Optimizer) -> None:
    """Hook ``optimizer`` now (it would be at its first step)."""
    _attach(optimizer)


def _state_specs(optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]
                 ) -> dict[Any, tuple[torch.Tensor, ShardSpec]]:
    """``{state key: (parameter, spec)}``: the keys of ``state_dict["param_groups"]``
    (indices, or FQNs from torch's state-dict helpers) matched to the optimizer's parameters
    by position, as ``Optimizer.load_state_dict`` matches them."""
    keys = [k for group in state_dict.get("param_groups", ()) for k in group["params"]]
    out = {}
    for key, p in zip(keys, _params(optimizer), strict=False):
        spec = _local_spec(p)
        if spec is not None and spec.mesh is not None:
            out[key] = (p, spec)
    return out


def _shaped_like(value: Any, param: torch.Tensor) -> bool:
    return torch.is_tensor(value) and value.dim() > 0 and value.shape == param.shape


def _optim_to_dtensors(optimizer: torch.optim.Optimizer,
                       state_dict: dict[str, Any]) -> dict[str, Any]:
    """New entries (``Optimizer.state_dict`` hands out the live per-parameter dicts)."""
    from torch.distributed.tensor import DTensor

    specs = _state_specs(optimizer, state_dict)
    state = {}
    for key, entry in state_dict["state"].items():
        param, spec = specs.get(key, (None, None))
        state[key] = {name: spec.to_dtensor(value)
                      if spec is not None and _shaped_like(value, param)
                      and not isinstance(value, DTensor) else value
                      for name, value in entry.items()}
    return {**state_dict, "state": state}


def _optim_to_locals(optimizer: torch.optim.Optimizer,
                     state_dict: dict[str, Any]) -> dict[str, Any]:
    from torch.distributed.tensor import DTensor

    specs = _state_specs(optimizer, state_dict)
    state = {}
    for key, entry in state_dict["state"].items():
        spec = specs.get(key)
        state[key] = {name: spec[1].to_local(value, f"state.{key}.{name}")
                      if spec is not None and isinstance(value, DTensor) else value
                      for name, value in entry.items()}
    return {**state_dict, "state": state}
