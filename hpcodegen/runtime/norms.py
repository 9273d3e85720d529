"""An RMS norm over features split across tp: the ``local_compute_fn`` of a split norm.

OLMo-2 normalises its query and key projections over their whole width (all heads at once)
before splitting heads, which is why transformers' plan gathers them. With the heads split
over tp, each rank holds its features; the norm is exact when the per-token sum of squares
is summed over tp (:mod:`hpcodegen.plan.norms`):

    y = w_local * x_local / sqrt(sum_tp(sum(x_local^2)) / width + eps)

The sum is an all_reduce whose backward is an all_reduce too (every rank's output depends
on every rank's features). ``generate`` checks on a real copy of the module that this is
the module's own arithmetic (:func:`hpcodegen.generate.layouts.layouts.rms_norm_variant`) and
records where the weight meets the dtype cast (``cast_last``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from hpcodegen.runtime.local_views import local_shape

#: attributes holding an RMS norm's epsilon, in transformers' spellings
EPS_ATTRS = ("variance_epsilon", "eps", "epsilon")


@dataclass(frozen=True)
class NormGroup:
    """The tp group a split norm sums over (bound as ``_hp_tp_norm``)."""

    group: Any
    size: int


class _SumOverTP(torch.autograd.Function):
    """all_reduce(sum) forward and backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        import torch.distributed as dist

        ctx.group = group
        out = x.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        import torch.distributed as dist

        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


def norm_eps(module: nn.Module) -> float | None:
    for name in EPS_ATTRS:
        value = getattr(module, name, None)
        if isinstance(value, float):
            return value
    return None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, width: int,
             cast_last: bool, sum_fn: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """The RMS norm with the sum of squares passed through ``sum_fn`` (identity: unsplit)."""
    dtype = x.dtype
    x = x.to(torch.float32)
    x = x * torch.rsqrt(sum_fn(x.pow(2).sum(-1, keepdim=True)) / width + eps)
    return (weight * x).to(dtype) if cast_last else weight * x.to(dtype)


def sharded_rms_norm(module: nn.Module, cast_last: bool = True,
                     **_options: Any) -> Callable[..., Any]:
    """The local compute of a split RMS norm (see the module docstring); the module's own
    forward when no tp group is bound (tp not live)."""
    forward = type(module).forward.__get__(module)
    tp = getattr(module, "_hp_tp_norm", None)
    eps = norm_eps(module)
    if tp is None or tp.size <= 1 or eps is None:
        return forward
    width = local_shape(module.weight)[-1] * tp.size

    def sharded_norm(hidden_states: torch.Tensor) -> torch.Tensor:
        return rms_norm(hidden_states, module.weight, eps, width, cast_last,
                        lambda s: _SumOverTP.apply(s, tp.group))
    return sharded_norm
