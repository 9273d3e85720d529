"""Gradient hooks on parameter tensors that survive ``module.to(...)``.

A tensor hook (``register_hook``, ``register_post_accumulate_grad_hook``) lives on the
tensor's implementation. ``module.to(...)``/``_apply`` on a model whose parameters are
DTensors (a wrapper subclass) goes through ``torch.utils.swap_tensors``: the parameter
object keeps its identity but gets a new implementation and a new ``__dict__``, so hooks
registered on it before, and any flag set on it to say so, are silently gone (a
tp-partial gradient then misses its sum). Hooks here are registered once per
implementation instead: :meth:`HookedParams.hook_once` remembers which implementation
(``_cdata``) of each parameter object it hooked, and callers invoke it from a forward
pre-hook, so after a swap the next forward hooks the new implementation before any gradient
can arrive; :func:`on_refresh` also re-hooks right after ``model._apply`` and a checkpoint
load (:func:`refresh_param_hooks`), outside any compiled region. (``tensor._backward_hooks``
still lists the dead hooks after a swap: it cannot tell.)
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
        if seen is not None and seen[0] is tensor and seen[1] == tensor._cdata:
            return False
        register(tensor)
        self._seen[id(tensor)] = (tensor, tensor._cdata)
        return True


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
    return hook


_REFRESH = "_hp_param_hook_refreshers"


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
    for refresh in model.__dict__.get(_REFRESH, ()):
        refresh()


def _wrap_apply(model: nn.Module) -> None:
    apply = model._apply

    def _apply(fn: Any, *args: Any, **kwargs: Any) -> nn.Module:
        out = apply(fn, *args, **kwargs)
        refresh_param_hooks(model)
        return out
    model.__dict__["_apply"] = _apply
