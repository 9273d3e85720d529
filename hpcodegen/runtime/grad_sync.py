"""Per-parameter gradient hooks: a special handler's tp all_reduce, the experts' 1/ep scale.

The plan's partial gradients (``partial_grad_params``) are summed in one flattened
all_reduce per backward by :mod:`hpcodegen.runtime.grad_buckets`; this module keeps the
per-parameter form for what a meta names one parameter at a time: another generator's
``special_handlers`` (HF's ``replicated_with_grad_allreduce``) and the expert gradients'
divide factor.

How: a forward pre-hook on the owning module registers, once per parameter *object*, a
tensor hook on the parameter the forward is about to use. That is the plain parameter
without FSDP, and FSDP2's unsharded parameter (set on the module before the forward runs)
under ``fully_shard``, so FSDP then reduces an already tp-complete gradient over dp. Leaf
hooks fire once per backward with the summed gradient of every use; a DTensor parameter's
hook works on the local shard of its gradient (:func:`~hpcodegen.runtime.param_hooks.
on_local`), and is registered again after a ``module.to(...)`` swapped the parameter
(:class:`~hpcodegen.runtime.param_hooks.HookedParams`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from hpcodegen.runtime.collectives.comm import Comm
from hpcodegen.runtime.collectives.ops import reduce
from hpcodegen.runtime.local_views import held
from hpcodegen.runtime.param_hooks import HookedParams, install_use_hook, on_local
from hpcodegen.runtime.params import param_owner


def install_grad_hook(model: nn.Module, fqns: Iterable[str],
                      fn: Callable[[torch.Tensor], torch.Tensor],
                      field: str = "partial_grad_params") -> list[str]:
    """Run ``fn`` on the gradient of each parameter FQN before it is accumulated, on the
    tensor the forward really uses (FSDP2's unsharded parameter too); see module docstring."""
    by_owner: dict[str, tuple[nn.Module, list[str]]] = {}
    hooked, hook = HookedParams(), on_local(fn)
    for fqn in fqns:
        owner, name = param_owner(model, fqn, field)
        by_owner.setdefault(fqn.rpartition(".")[0], (owner, []))[1].append(name)
    for owner, names in by_owner.values():

        def pre_hook(module: nn.Module, _args: Any, names: list[str] = names) -> None:
            for name in names:
                value = held(module, name)  # not a view a parent swapped in
                if isinstance(value, torch.Tensor):
                    hooked.hook_once(value, lambda t: t.register_hook(hook))
        install_use_hook(model, owner, pre_hook)
    return sorted(f"{p}.{n}".lstrip(".") for p, (_, ns) in by_owner.items() for n in ns)


def install_grad_allreduce(model: nn.Module, fqns: Iterable[str], group: Any) -> list[str]:
    """Make the gradient of each parameter FQN the tp-sum of the rank-local gradients."""
    comm = Comm(group)  # resolved once, not per gradient
    return install_grad_hook(model, fqns, lambda grad: reduce(grad, comm))


def install_grad_scale(model: nn.Module, fqns: Iterable[str], factor: float) -> list[str]:
    """Multiply the gradient of each parameter FQN by ``factor`` (expert parameters:
    ``1/ep``, see :mod:`hpcodegen.runtime.experts`)."""
    return install_grad_hook(model, fqns, lambda grad: grad * factor,
                             "expert parameters")
