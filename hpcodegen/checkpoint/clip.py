"""Gradient clipping by the global norm of a tensor-parallel model, exactly.

``torch.nn.utils.clip_grad_norm_`` on local shards takes each rank's own norm: under tp
that is a different, wrong number on every rank. Here a sharded gradient contributes its
local ``sum |g|^p`` summed over the mesh axes that shard it, a replicated one contributes
once (every rank holds the same values, partial gradients were reduced by the runtime),
and tied parameters count once. The result equals the unsharded model's total norm, and
the clip coefficient is torch's: ``min(1, max_norm / (total + 1e-6))``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from hpcodegen.checkpoint.layout import ShardLayout


def _reduced(value: torch.Tensor, mesh: Any, sharded: tuple[bool, ...],
             op: str) -> torch.Tensor:
    """``value`` reduced (sum or max) over the axes of ``mesh`` flagged in ``sharded``."""
    if mesh is None or not any(sharded):
        return value
    from torch.distributed.tensor import DTensor, Partial, Replicate

    spec = [Partial(op) if s else Replicate() for s in sharded]
    return DTensor.from_local(value, mesh, spec, run_check=False).full_tensor()


def total_grad_norm(model: nn.Module, layout: ShardLayout, norm_type: float = 2.0) -> torch.Tensor:
    """The unsharded model's gradient norm, computed from the local shards (collective)."""
    norm_type = float(norm_type)
    # one collective per (mesh, set of sharding axes)
    groups: dict[tuple[int, tuple[bool, ...]], tuple[Any, list[torch.Tensor]]] = {}
    for fqn, spec in layout.params.items():
        grad = model.get_parameter(fqn).grad
        if grad is not None:
            key = (id(spec.mesh), tuple(p.is_shard() for p in spec.placements))
            groups.setdefault(key, (spec.mesh, []))[1].append(grad.detach())
    total = torch.zeros((), dtype=torch.float32)
    parts = []
    for (_, sharded), (mesh, grads) in groups.items():
        if math.isinf(norm_type):
            local = torch.stack([g.abs().max().float().cpu() if g.numel() else torch.zeros(())
                                 for g in grads]).max()
            parts.append(_reduced(local.to(grads[0].device), mesh, sharded, "max").cpu())
        else:
            local = sum((g.float().abs().pow(norm_type).sum() for g in grads),
                        torch.zeros((), device=grads[0].device))
            parts.append(_reduced(local, mesh, sharded, "sum").cpu())
    if not parts:
        return total
    if math.isinf(norm_type):
        return torch.stack(parts).max()
    return torch.stack(parts).sum().pow(1.0 / norm_type)


def clip_grad_norm_(model: nn.Module, layout: ShardLayout, max_norm: float,
                    norm_type: float = 2.0) -> torch.Tensor:
    """Scale every gradient by ``min(1, max_norm / (global norm + 1e-6))``; returns the norm.

    Example::

        loss.backward()
        clip_grad_norm_(model, layout, 1.0)   # the same as on the unsharded model
        optimizer.step()
    """
    total = total_grad_norm(model, layout, norm_type)
    coef = torch.clamp(float(max_norm) / (total + 1e-6), max=1.0)
    for fqn in layout.params:
        grad = model.get_parameter(fqn).grad
        if grad is not None:
            grad.detach().mul_(coef.to(grad.device, grad.dtype))
    return total
