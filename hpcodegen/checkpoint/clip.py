"""Gradient clipping by the global norm of a tensor-parallel model, exactly.

The runtime's parameters are DTensors, so ``torch.nn.utils.clip_grad_norm_`` on them gives
this same norm where every parameter shares one mesh. This one also covers parameters on
several meshes (expert parameters on the expert mesh beside the dense ones) and works from
the local gradients: a sharded gradient contributes its local ``sum |g|^p`` summed over the
mesh axes that shard it (plain or strided shards, e.g. a fused ``gate_up_proj`` over tp;
expert parameters over their ``(ep, tp)`` mesh), a replicated one contributes once (every
rank holds the same values, partial gradients were reduced by the runtime), and tied
parameters count once. The result equals the unsharded model's total norm, and the clip
coefficient is torch's: ``min(1, max_norm / (total + 1e-6))``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from hpcodegen.checkpoint.layout import ShardLayout
from hpcodegen.runtime.shards import local_grad, splits


def _reduced(value: torch.Tensor, mesh: Any, sharded: tuple[bool, ...],
             op: str) -> torch.Tensor:
    """``value`` reduced (sum or max) over the axes of ``mesh`` flagged in ``sharded``."""
    if mesh is None or not any(sharded):
        return value
    from torch.distributed.tensor import DTensor, Partial, Replicate

    spec = [Partial(op) if s else Replicate() for s in sharded]
    return DTensor.from_local(value, mesh, spec, run_check=False).full_tensor()


def total_grad_norm(model: nn.Module, norm_type: float = 2.0, *,
                    layout: ShardLayout | None = None) -> torch.Tensor:
    """The unsharded model's gradient norm, computed from the local shards (collective).

    ``layout`` defaults to the one the runtime recorded on ``model``
    (:meth:`ShardLayout.of`).

    Parameters are grouped by (mesh, axes that split them): one reduction per group, over
    exactly those axes. Every parameter of the layout joins its group whether or not it has
    a gradient here (an expert no token reached has none on its rank only), so every rank
    issues the same collectives; a missing gradient contributes 0, as in torch.
    """
    norm_type = float(norm_type)
    if not (norm_type > 0):  # 0, negative and -inf norms are no norms to clip by
        raise ValueError(f"clip_grad_norm_: norm_type {norm_type} is not supported "
                         "(expected a p > 0, or inf for the max norm)")
    inf = math.isinf(norm_type)
    layout = layout if layout is not None else ShardLayout.of(model)
    groups: dict[tuple[int, tuple[bool, ...]], tuple[Any, list[torch.Tensor]]] = {}
    for fqn, spec in layout.params.items():
        param = model.get_parameter(fqn)
        key = (id(spec.mesh), tuple(splits(p) for p in spec.placements))
        mesh, norms = groups.setdefault(key, (spec.mesh, []))
        grad = local_grad(param)
        if grad is None or not grad.numel():
            norms.append(torch.zeros((), dtype=torch.float32, device=param.device))
        else:  # torch's own per-tensor norm, as torch.nn.utils.get_total_norm takes it
            norms.append(torch.linalg.vector_norm(grad.detach(), norm_type,
                                                  dtype=torch.float32))
    parts = []
    for (_, sharded), (mesh, norms) in groups.items():
        stacked = torch.stack(norms)
        local = stacked.max() if inf else stacked.pow(norm_type).sum()
        parts.append(_reduced(local, mesh, sharded, "max" if inf else "sum").cpu())
    if not parts:
        return torch.zeros((), dtype=torch.float32)
    if inf:
        return torch.stack(parts).max()
    return torch.stack(parts).sum().pow(1.0 / norm_type)


def clip_grad_norm_(model: nn.Module, max_norm: float, norm_type: float = 2.0, *,
                    layout: ShardLayout | None = None) -> torch.Tensor:
    """Scale every gradient by ``min(1, max_norm / (global norm + 1e-6))``; returns the norm.

    Collective: every rank of the model's mesh calls it.

    Example::

        loss.backward()
        clip_grad_norm_(model, 1.0)   # the same as torch's on the unsharded model
        optimizer.step()
    """
    layout = layout if layout is not None else ShardLayout.of(model)
    total = total_grad_norm(model, norm_type, layout=layout)
    coef = torch.clamp(float(max_norm) / (total + 1e-6), max=1.0)
    for fqn in layout.params:
        grad = local_grad(model.get_parameter(fqn))
        if grad is not None:
            grad.detach().mul_(coef.to(grad.device, grad.dtype))
    return total
