"""Partial gradients summed over tp in one flattened all_reduce per backward (per dtype).

A parameter replicated on tp but used on a tp-split activation (a sequence-parallel norm, a
router on a sequence slice, Qwen3's per-head ``q_norm``) gets only its rank's share of the
gradient; the unsharded model's gradient is the sum over tp (decisions.md item 6). One
blocking all_reduce per parameter inside the backward pays the collective's launch latency
hundreds of times per step at 100+ layers; Megatron sums these gradients in one flattened
collective. So does :class:`PartialGradSync`, per backward:

1. the first partial gradient of the backward sets every synced parameter's ``.grad`` aside
   (gradient accumulation: what was there is added back at the end) and queues the end of
   backward callback;
2. each gradient accumulates into ``.grad`` as usual (the rank's partial sum);
3. once every synced parameter's gradient has accumulated (a post-accumulate hook counts
   them), the ``.grad`` of each ``(dtype, device)`` bucket are flattened and all-reduced
   over tp asynchronously: the collective starts as soon as the last such gradient is
   ready, while the rest of the backward (the embedding, say) runs;
4. the end-of-backward callback waits, writes the sums back into ``.grad`` and adds what
   step 1 set aside (or starts the collective there, when a parameter got no gradient).

``.grad`` is then exactly the previous gradient plus the tp sum of this backward's partial
gradients, as with a per-parameter all_reduce. Under FSDP2 the tensor the forward uses is
FSDP's unsharded parameter, whose gradient FSDP reduce-scatters over dp right after its
layer's backward, before a whole-model bucket could be complete: such a parameter keeps the
per-parameter all_reduce on that tensor (FSDP's units bound the flattening there).

A DTensor parameter's ``.grad`` is a DTensor (replicated over tp): the flattening and the
sum work on its local shard (:func:`~hpcodegen.runtime.shards.local_grad`), in place.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from hpcodegen.runtime.collectives.comm import Comm
from hpcodegen.runtime.collectives.ops import reduce
from hpcodegen.runtime.local_views import held
from hpcodegen.runtime.param_hooks import HookedParams, install_use_hook, on_local
from hpcodegen.runtime.params import param_owner
from hpcodegen.runtime.shards import local_grad


class PartialGradSync:
    """The flattened tp-sum of partial gradients of one model (see the module docstring)."""

    def __init__(self, group: Any) -> None:
        self.group = group
        self.comm = Comm(group)
        #: the parameters installed (the objects registered on their modules at install)
        self.params: list[nn.Parameter] = []
        self._ready: set[int] = set()
        self._saved: dict[int, torch.Tensor | None] | None = None
        self._pending: list[tuple[Any, torch.Tensor, list[nn.Parameter]]] | None = None
        self._hooked = HookedParams()
        comm = self.comm
        self._reduce = on_local(lambda grad: reduce(grad, comm))

    def add(self, param: nn.Parameter) -> None:
        if any(p is param for p in self.params) or not param.requires_grad:
            return
        self.params.append(param)

    def on_used(self, registered: Any, used: torch.Tensor) -> None:
        """Hook the tensor the forward uses (once per tensor implementation:
        :mod:`hpcodegen.runtime.param_hooks`): the registered parameter joins the buckets;
        a tensor that replaced it (FSDP2's unsharded parameter) is reduced on its own."""
        if used is registered:
            self._hooked.hook_once(used, self._hook_bucketed)
        else:
            self._hooked.hook_once(used, lambda t: t.register_hook(self._reduce))

    def _hook_bucketed(self, param: torch.Tensor) -> None:
        param.register_hook(self._arrived)
        param.register_post_accumulate_grad_hook(self._accumulated)

    # -- one backward ------------------------------------------------------------------------
    def _arrived(self, grad: torch.Tensor) -> torch.Tensor:
        if self._saved is None:
            self._saved = {}
            for p in self.params:
                self._saved[id(p)] = p.grad
                p.grad = None
            torch.autograd.Variable._execution_engine.queue_callback(self._finish)
        return grad

    def _accumulated(self, param: torch.Tensor) -> None:
        if self._saved is None or self._pending is not None:
            return
        self._ready.add(id(param))
        if len(self._ready) == len(self.params):
            self._launch()

    def _launch(self) -> None:
        buckets: dict[tuple[Any, Any], list[nn.Parameter]] = {}
        for p in self.params:
            grad = local_grad(p)
            if grad is not None:
                buckets.setdefault((grad.dtype, grad.device), []).append(p)
        pending = []
        pg = self.comm.pg or self.comm.resolve()
        for members in buckets.values():
            flat = torch._utils._flatten_dense_tensors([local_grad(p) for p in members])
            pending.append((dist.all_reduce(flat, group=pg, async_op=True), flat, members))
        self._pending = pending

    def _finish(self) -> None:
        if self._pending is None:
            self._launch()
        saved = self._saved or {}
        for work, flat, members in self._pending or ():
            work.wait()
            grads = [local_grad(p) for p in members]
            for grad, total in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads),
                                   strict=True):
                grad.copy_(total)
        for p in self.params:
            old = saved.get(id(p))
            if old is not None:
                p.grad = old if p.grad is None else old.add_(p.grad)
        self._saved, self._pending = None, None
        self._ready.clear()


def install_partial_grad_sync(model: nn.Module, fqns: Iterable[str], group: Any
                              ) -> PartialGradSync | None:
    """Sum the gradient of each parameter FQN over tp, flattened (module docstring); the
    sync object, None when there is nothing to sync."""
    sync = PartialGradSync(group)
    by_owner: dict[str, tuple[nn.Module, list[str]]] = {}
    for fqn in fqns:
        owner, name = param_owner(model, fqn, "partial_grad_params")
        by_owner.setdefault(fqn.rpartition(".")[0], (owner, []))[1].append(name)
        sync.add(owner._parameters[name])
    if not sync.params:
        return None
    for owner, names in by_owner.values():
        registered = {name: owner._parameters[name] for name in names}

        def pre_hook(module: nn.Module, _args: Any, names: list[str] = names,
                     registered: dict[str, Any] = registered) -> None:
            for name in names:
                value = held(module, name)  # not a view a parent swapped in
                if isinstance(value, torch.Tensor):
                    sync.on_used(registered[name], value)
        install_use_hook(model, owner, pre_hook)
    model.__dict__["_hp_partial_grad_sync"] = sync
    return sync
