"""The forwards compute on local tensors while the parameters stay DTensors.

The generated forwards and the lowered collectives work on plain local shards (no DTensor
dispatch per op: the runtime's speed). The parameters are DTensors
(:func:`hpcodegen.runtime.shards.as_local_param`) so that torch's tools see the unsharded
model. The bridge: for the duration of a module's forward, each DTensor parameter of the
module *and of its direct children* is replaced in its owner's ``_parameters`` by its
local view (``param.to_local()``: the same storage, one autograd node), and put back when
the forward returns or raises. The children too, because forwards read their children's
parameters without calling them (``nn.MultiheadAttention`` reads ``out_proj.weight``, hub
kernels read ``conv1d.weight``, Gemma-3n calls ``altup.forward`` directly); parameters an
enclosing forward already swapped are left as they are. Autograd then
accumulates the gradient of every use into the DTensor parameter's ``.grad``, a DTensor with
the parameter's placements.

The swap is read at call time, so it follows whatever tensor the module holds then: FSDP2's
unsharded parameter under ``fully_shard`` (set by FSDP's pre-forward, which runs first), a
parameter a boundary scaled or hid (they run inside the forward, on the local view), or one
a ``module.to(...)`` swapped. A module called again inside its own forward keeps its views.
"""

from __future__ import annotations

from typing import Any

from torch import nn

_STACK = "_hp_local_views"
#: on an owner: parameter name -> (the local view in place now, the DTensor parameter)
_SWAPPED = "_hp_swapped_params"
_HOOKED = "_hp_local_view_hooks"


def _is_dtensor(value: Any) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(value, DTensor)


def _to_local(module: nn.Module, _args: Any) -> None:
    saved = [(owner, name, value) for owner in _scope(module)
             for name, value in owner._parameters.items() if _is_dtensor(value)]
    for owner, name, value in saved:
        view = owner._parameters[name] = value.to_local()
        owner.__dict__.setdefault(_SWAPPED, {})[name] = (view, value)
    module.__dict__.setdefault(_STACK, []).append(saved)


def _scope(module: nn.Module) -> tuple[nn.Module, ...]:
    """The module and its direct children: whose parameters its forward may read."""
    return (module, *module.children())


def _restore(module: nn.Module, _args: Any, _output: Any) -> None:
    stack = module.__dict__.get(_STACK)
    if not stack:
        return
    for owner, name, value in stack.pop():
        owner._parameters[name] = value


def hooked_tensor(module: nn.Module, name: str) -> Any:
    """The tensor a gradient hook for ``module.<name>`` belongs on: the DTensor parameter
    when an enclosing forward swapped in its local view (hooked once, it sees every use),
    else whatever the module holds (a parameter, FSDP's unsharded one)."""
    value = getattr(module, name)
    swapped = module.__dict__.get(_SWAPPED, {}).get(name)
    return swapped[1] if swapped is not None and swapped[0] is value else value


def local_view(value: Any) -> Any:
    """A DTensor's local view (differentiable), anything else unchanged: for runtime code
    that reads a parameter of another module than the one running (a deferred bias)."""
    return value.to_local() if _is_dtensor(value) else value


def local_shape(value: Any) -> tuple[int, ...]:
    """The shape of this rank's part: a DTensor's local shape, any tensor's own shape (for
    install-time code sizing a compute by the local parameter)."""
    return tuple(value._local_tensor.shape if _is_dtensor(value) else value.shape)


def install_local_views(model: nn.Module) -> int:
    """Hook every module owning a DTensor parameter or with a child that does (module
    docstring); the count. One level, not the subtree: a forward high above (the model's)
    would hold the views across code that rescales deeper parameters in place (RWKV's
    layer rescaling), which autograd forbids on these views."""
    count = 0
    for module in model.modules():
        if module.__dict__.get(_HOOKED) or not any(
                _is_dtensor(p) for owner in _scope(module) for p in owner._parameters.values()):
            continue
        module.register_forward_pre_hook(_to_local)
        module.register_forward_hook(_restore, always_call=True)
        module.__dict__[_HOOKED] = True
        count += 1
    return count
