"""Gradient hooks on parameter tensors that survive ``module.to(...)``.

A tensor hook (``register_hook``, ``register_post_accumulate_grad_hook``) is installed on
the tensor's implementation when its hook dict (``_backward_hooks``,
``_post_accumulate_grad_hooks``) is assigned. ``module.to(...)``/``_apply`` on a model whose
parameters are DTensors (a wrapper subclass) goes through ``torch.utils.swap_tensors``: the
parameter object keeps its identity and its hook dicts but gets a new implementation that
none of them is installed on, so every hook registered before is silently dead (a
tp-partial gradient then misses its sum), and so is any hook added to the stale dict later
(measured on torch 2.13). Assigning a dict again installs it on the current
implementation (idempotent when nothing was swapped): :func:`revive_hooks`.
:meth:`HookedParams.hook_once` registers once per tensor object and revives the hooks when
that object's implementation (``_cdata``) changed; callers invoke it from a forward
pre-hook, and :func:`on_refresh` runs it right after ``model._apply`` and a checkpoint load
(:func:`refresh_param_hooks`), outside any compiled region. The revival covers every hook
on the tensor, the user's and FSDP's too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn


class HookedParams:
    """Which implementation of each tensor object a hook set was registered on."""

    def __init__(self) -> None:
        #: id(tensor) -> (tensor, its implementation's address when hooked); the tensor is
        #: held so its id is not reused
        self._seen: dict[int, tuple[torch.Tensor, int]] = {}

    def hook_once(self, tensor: torch.Tensor, register: Callable[[torch.Tensor], Any]) -> bool:
        """``register(tensor)`` unless already done for this implementation; True when
        it ran."""
        if not tensor.requires_grad:
            return False
        if not tensor.is_leaf:  # a fresh tensor each forward (a boundary's scaled view)
            register(tensor)
            return True
        seen = self._seen.get(id(tensor))
        if seen is not None and seen[0] is tensor:
            if seen[1] != tensor._cdata:  # swapped: our hooks are in its stale dicts
                revive_hooks(tensor)
                self._seen[id(tensor)] = (tensor, tensor._cdata)
            return False
        register(tensor)
        self._seen[id(tensor)] = (tensor, tensor._cdata)
        return True


_HOOK_DICTS = ("_backward_hooks", "_post_accumulate_grad_hooks")


def revive_hooks(tensor: torch.Tensor) -> None:
    """Install ``tensor``'s hook dicts on its current implementation (after a
    ``swap_tensors``); a no-op for hooks already installed there."""
    for attr in _HOOK_DICTS:
        hooks = getattr(tensor, attr, None)
        if hooks:
            setattr(tensor, attr, hooks)


def on_local(fn: Callable[[torch.Tensor], torch.Tensor]
             ) -> Callable[[torch.Tensor], torch.Tensor]:
    """A gradient hook running ``fn`` on plain local gradients: a DTensor gradient (of a
    DTensor parameter) has ``fn`` applied to its local shard and keeps its mesh,
    placements and global shape."""
    from torch.distributed.tensor import DTensor

    def hook(grad: torch.Tensor) -> torch.Tensor:
        if not isinstance(grad, DTensor):
            return fn(grad)
        out = fn(grad._local_tensor)
        return DTensor.from_local(out, grad.device_mesh, grad.placements, run_check=False,
                                  shape=grad.shape, stride=grad.stride())
    # the local alias of a parameter (hpcodegen.runtime.local_views) calls fn directly
    hook.local_fn = fn  # type: ignore[attr-defined]
    return hook


_REFRESH = "_hp_param_hook_refreshers"
_USE_HOOKS = "_hp_use_hooks"


def install_use_hook(model: nn.Module, owner: nn.Module,
                     pre_hook: Callable[[nn.Module, Any], None]) -> None:
    """Register ``pre_hook`` (it hooks the tensors ``owner``'s forward is about to use) as
    ``owner``'s forward pre-hook, and run it now and after every swap (:func:`on_refresh`).

    Recorded on ``owner``: a compiled scope runs it eagerly around its compiled call instead
    (:func:`take_use_hooks`), since reading a DTensor parameter inside the traced region
    makes it an input of the graph."""
    handle = owner.register_forward_pre_hook(pre_hook)
    owner.__dict__.setdefault(_USE_HOOKS, []).append((handle, pre_hook))
    # hooked now and after a swap too: a compiled forward then finds them in place
    # (registering a hook on a parameter inside a traced region would break the graph)
    on_refresh(model, lambda: pre_hook(owner, ()))


def take_use_hooks(owner: nn.Module) -> list[Callable[[nn.Module, Any], None]]:
    """Remove ``owner``'s pre-hooks of :func:`install_use_hook` and return them, for a caller
    that runs them itself, outside a compiled region."""
    taken = owner.__dict__.pop(_USE_HOOKS, [])
    for handle, _hook in taken:
        handle.remove()
    return [hook for _handle, hook in taken]


def on_refresh(model: nn.Module, refresh: Callable[[], None]) -> None:
    """Run ``refresh`` (re-hook what it hooks, through :meth:`HookedParams.hook_once`) now,
    after every ``model._apply`` (``model.to(...)``, ``.float()``...), and from
    :func:`refresh_param_hooks`: eagerly, so a compiled forward never registers a hook
    inside its traced region."""
    refreshers = model.__dict__.get(_REFRESH)
    if refreshers is None:
        refreshers = model.__dict__[_REFRESH] = []
        _wrap_apply(model)
    refreshers.append(refresh)
    refresh()


def refresh_param_hooks(model: nn.Module) -> None:
    """Re-hook every parameter whose tensor was swapped (a checkpoint load's
    ``swap_tensors``); cheap when nothing was."""
    for tensor in model.parameters():  # every hook, not only hpcodegen's
        revive_hooks(tensor)
    for refresh in model.__dict__.get(_REFRESH, ()):
        refresh()


def _wrap_apply(model: nn.Module) -> None:
    apply = model._apply

    def _apply(fn: Any, *args: Any, **kwargs: Any) -> nn.Module:
        out = apply(fn, *args, **kwargs)
        refresh_param_hooks(model)
        return out
    model.__dict__["_apply"] = _apply
