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

A forward may also read a child's parameter without calling the child (a short
convolution's ``F.conv1d(x, self.conv1d.weight)``), so each module's forward (the root's
excepted) also swaps its direct children's parameters; a child then called inside finds its
views in place.
"""

from __future__ import annotations

from typing import Any

from torch import nn

_STACK = "_hp_local_views"
_HOOKED = "_hp_local_view_hooks"
_HOLDERS = "_hp_local_view_holders"
_SWAPPED = "_hp_local_view_of"


def _is_dtensor(value: Any) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(value, DTensor)


def _to_local(module: nn.Module, _args: Any) -> None:
    # attributes set at install, read as attributes and mutated in place: no __dict__
    # writes in a forward (torch.compile breaks the graph on those)
    saved = []
    for holder in getattr(module, _HOLDERS):
        for name, value in holder._parameters.items():
            if _is_dtensor(value):
                saved.append((holder, name, value))
    for holder, name, value in saved:
        holder._parameters[name] = value.to_local()
        getattr(holder, _SWAPPED)[name] = value
    getattr(module, _STACK).append(saved)


def _restore(module: nn.Module, _args: Any, _output: Any) -> None:
    stack = getattr(module, _STACK)
    if not stack:
        return
    for holder, name, value in reversed(stack.pop()):
        holder._parameters[name] = value
        getattr(holder, _SWAPPED).pop(name, None)


def held(module: nn.Module, name: str) -> Any:
    """``module``'s parameter ``name`` as the forward's caller set it: the DTensor (or
    FSDP2's unsharded parameter) whose view a parent's forward swapped in, else the
    attribute itself. For pre-hooks that hook the tensor a forward really uses."""
    swapped = getattr(module, _SWAPPED, None)
    if swapped and name in swapped:
        return swapped[name]
    return getattr(module, name)


def local_view(value: Any) -> Any:
    """A DTensor's local view (differentiable), anything else unchanged: for runtime code
    that reads a parameter of another module than the one running (a deferred bias)."""
    return value.to_local() if _is_dtensor(value) else value


def local_shape(value: Any) -> tuple[int, ...]:
    """The shape of this rank's part: a DTensor's local shape, any tensor's own shape (for
    install-time code sizing a compute by the local parameter)."""
    return tuple(value._local_tensor.shape if _is_dtensor(value) else value.shape)


def _owns_dtensor(module: nn.Module) -> bool:
    return any(_is_dtensor(p) for p in module._parameters.values())


def install_local_views(model: nn.Module) -> int:
    """Hook every module owning a DTensor parameter or parenting one that does (module
    docstring); the count."""
    count = 0
    for module in model.modules():
        # not the root's children: its hooks run at a compiled forward's edge (a graph break)
        kids = () if module is model else tuple(module.children())
        holders = [m for m in (module, *kids) if _owns_dtensor(m)]
        if module.__dict__.get(_HOOKED) or not holders:
            continue
        module.__dict__[_HOLDERS] = holders
        module.__dict__[_STACK] = []
        for holder in holders:
            holder.__dict__.setdefault(_SWAPPED, {})
        module.register_forward_pre_hook(_to_local)
        module.register_forward_hook(_restore, always_call=True)
        module.__dict__[_HOOKED] = True
        count += 1
    return count
