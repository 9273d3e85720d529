"""The forwards compute on local tensors while the parameters stay DTensors.

The generated forwards and the lowered collectives work on plain local shards (no DTensor
dispatch per op: the runtime's speed). The parameters are DTensors
(:func:`hpcodegen.runtime.shards.as_local_param`) so that torch's tools see the unsharded
model. The bridge: for the duration of a module's forward, each of its DTensor parameters
is replaced in ``module._parameters`` by its local view (``param.to_local()``: the same
storage, one autograd node), and put back when the forward returns or raises. Autograd then
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
_HOOKED = "_hp_local_view_hooks"


def _is_dtensor(value: Any) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(value, DTensor)


def _to_local(module: nn.Module, _args: Any) -> None:
    params = module._parameters
    saved = [(name, value) for name, value in params.items() if _is_dtensor(value)]
    for name, value in saved:
        params[name] = value.to_local()
    module.__dict__.setdefault(_STACK, []).append(saved)


def _restore(module: nn.Module, _args: Any, _output: Any) -> None:
    stack = module.__dict__.get(_STACK)
    if not stack:
        return
    params = module._parameters
    for name, value in stack.pop():
        params[name] = value


def local_view(value: Any) -> Any:
    """A DTensor's local view (differentiable), anything else unchanged: for runtime code
    that reads a parameter of another module than the one running (a deferred bias)."""
    return value.to_local() if _is_dtensor(value) else value


def local_shape(value: Any) -> tuple[int, ...]:
    """The shape of this rank's part: a DTensor's local shape, any tensor's own shape (for
    install-time code sizing a compute by the local parameter)."""
    return tuple(value._local_tensor.shape if _is_dtensor(value) else value.shape)


def install_local_views(model: nn.Module) -> int:
    """Hook every module owning a DTensor parameter (module docstring); the count."""
    count = 0
    for module in model.modules():
        if module.__dict__.get(_HOOKED) or not any(
                _is_dtensor(p) for p in module._parameters.values()):
            continue
        module.register_forward_pre_hook(_to_local)
        module.register_forward_hook(_restore, always_call=True)
        module.__dict__[_HOOKED] = True
        count += 1
    return count
