"""A lowered transition's forward op and backward steps as one differentiable callable.

Autograd without a Python ``autograd.Function`` where a C++ op has the same gradient
(:mod:`.ops`):

* all_reduce forward with an identity backward (``P(sum) -> R``): a ``clone`` (its backward
  is the identity) reduced in place through a detached alias;
* all_gather forward with a local-chunk backward (``S(d) -> R``): the gathered shards
  concatenated with this rank's own shard in its slot, so ``cat``'s backward hands back
  exactly this rank's chunk of the gradient.

Every other pair runs through a per-transition Function (forward op, backward steps), and
only when a gradient can flow (grad mode on and an input that requires grad); otherwise the
forward op runs directly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from hpcodegen.runtime.collectives.local import LocalFn, compiling, map_local_tensors


def chain(fns: Sequence[LocalFn]) -> LocalFn | None:
    """The functions run one after the other (None for none, the function for one)."""
    if not fns:
        return None
    if len(fns) == 1:
        return fns[0]

    def run(x: torch.Tensor) -> torch.Tensor:
        for fn in fns:
            x = fn(x)
        return x
    return run


def lowered_function(fwd: LocalFn | None, bwd: LocalFn | None) -> type[torch.autograd.Function]:
    """An autograd Function running ``fwd`` forward and ``bwd`` on the gradient.

    One class per transition, made at install: dynamo traces such a Function (its forward
    and backward are plain closures over the group), where a shared class taking the
    functions as ``apply`` arguments would have to store them on ``ctx``.
    """

    class Lowered(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> Any:
            return fwd(x) if fwd is not None else x.view_as(x)

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> Any:
            return bwd(grad) if bwd is not None else grad

    return Lowered


functorch_active = torch._C._are_functorch_transforms_active


def direct_apply(function: type[torch.autograd.Function]) -> Callable[[Any], Any]:
    """``function.apply`` without ``autograd.Function.apply``'s Python layer.

    That layer (a ``setup_context`` lookup, functorch's dead-wrapper unwrap) costs about
    9 us per call, half of what a Function with a one-line forward costs in all; a Function
    without ``setup_context`` ends in the C ``_FunctionBase.apply`` it wraps. Used eagerly
    only: under ``torch.compile`` dynamo needs ``function.apply`` itself to trace the
    Function, and under functorch transforms the layer is what refuses it. Falls back to
    ``function.apply`` where this torch has no such base.
    """
    base = getattr(torch._C, "_FunctionBase", None)
    descriptor = vars(base).get("apply") if base is not None else None
    if descriptor is None or function.setup_context is not torch.autograd.Function.setup_context:
        return function.apply
    return descriptor.__get__(None, function)


def apply_lowered(fwd: LocalFn | None, bwd: LocalFn | None,
                  native: LocalFn | None = None) -> Callable[[Any], Any]:
    """Wrap ``fwd``/``bwd`` as a function over values (tensors, tuples of them, None).

    Eager, ``native`` (a forward whose own autograd is already ``bwd``) runs as it is. Else
    the autograd Function runs only when a gradient can flow through it (grad mode on and
    an input that requires grad); otherwise ``fwd`` runs directly (identity: the value
    itself), which records the same nothing at a fraction of the cost. Under
    ``torch.compile`` the Function is what dynamo traces.
    """
    plain = torch.Tensor
    grad_enabled = torch.is_grad_enabled
    function = lowered_function(fwd, bwd) if fwd is not None or bwd is not None else None
    apply = function.apply if function is not None else None
    direct = direct_apply(function) if function is not None else None

    def on_tensor(tensor: torch.Tensor) -> torch.Tensor:
        if apply is None:
            return tensor
        if native is not None and not compiling():
            return native(tensor)
        if tensor.requires_grad:
            if grad_enabled():
                return apply(tensor) if compiling() or functorch_active() else direct(tensor)
            if fwd is None:  # as the Function's view under no_grad: no graph to follow
                return tensor.detach()
        return fwd(tensor) if fwd is not None else tensor

    if native is not None:
        def run(tensor: Any) -> Any:  # named as TPOps' methods, which may be bound to it
            if type(tensor) is plain and not compiling():  # the hot path
                return native(tensor)
            return map_local_tensors(tensor, on_tensor)
        return run

    def run(tensor: Any) -> Any:
        if type(tensor) is plain:  # the hot path: a local tensor, nothing to walk
            return on_tensor(tensor)
        return map_local_tensors(tensor, on_tensor)
    return run
