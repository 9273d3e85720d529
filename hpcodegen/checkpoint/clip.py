"""Gradient clipping by the global norm of a tensor-parallel model: torch's own, per mesh.

The runtime's parameters are DTensors, so ``torch.nn.utils.clip_grad_norm_`` on
``model.parameters()`` already gives the unsharded model's norm when every parameter
shares one mesh. torch cannot stack norms of DTensors on different meshes (expert
parameters on the ``(ep, tp)`` mesh beside the dense ones on ``tp``), and its collectives
must match on every rank even where an expert no token reached has no gradient on one
rank only. So: parameters grouped by mesh, ``torch.nn.utils.get_total_norm`` per group (a
missing gradient counts as zeros of the parameter's placements, as torch counts it 0),
the groups' norms combined as one p-norm, and ``torch.nn.utils.clip_grads_with_norm_``
scales the gradients: nothing here re-implements torch's arithmetic.

A pipeline's rank holds only its stages' gradients: ``names`` restricts the norm to the
parameters it owns (a tied parameter counted by its owning stage only) and ``group`` (the
pp group) combines the ranks' norms as one p-norm (their p-th powers summed, or the max
for ``inf``), so every rank gets the unsharded model's norm.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable
from typing import Any

import torch
from torch import nn

from hpcodegen.checkpoint.layout import ShardLayout


def _by_mesh(model: nn.Module, layout: ShardLayout,
             names: Collection[str] | None = None) -> list[list[torch.Tensor]]:
    """The layout's parameters (those in ``names`` when given), one list per mesh, in the
    layout's order (the same on every rank of a mesh, so they issue the same collectives)."""
    groups: dict[int, list[torch.Tensor]] = {}
    for fqn, spec in layout.params.items():
        if names is None or fqn in names:
            groups.setdefault(id(spec.mesh), []).append(model.get_parameter(fqn))
    return list(groups.values())


def _across(norm: torch.Tensor, norm_type: float, group: Any) -> torch.Tensor:
    """Ranks' norms of disjoint parameter sets combined over ``group`` as one p-norm."""
    import torch.distributed as dist

    device = (torch.device("cuda", torch.cuda.current_device())
              if dist.get_backend(group) == "nccl" else torch.device("cpu"))
    if math.isinf(norm_type):
        value = norm.double().to(device)
        dist.all_reduce(value, op=dist.ReduceOp.MAX, group=group)
        return value.float().cpu()
    value = norm.double().to(device) ** norm_type
    dist.all_reduce(value, group=group)
    return (value ** (1.0 / norm_type)).float().cpu()


def _grad_or_zeros(param: torch.Tensor) -> torch.Tensor:
    """``param``'s gradient; zeros of its placements where it has none on this rank (an
    expert no token reached), so the mesh's reduction still sees every parameter."""
    grad = param.grad
    return (grad if grad is not None else torch.zeros_like(param)).detach()


def _full(norm: torch.Tensor) -> torch.Tensor:
    """A norm as a plain tensor (a DTensor norm is reduced over its mesh)."""
    from torch.distributed.tensor import DTensor

    return norm.full_tensor() if isinstance(norm, DTensor) else norm


def total_grad_norm(model: nn.Module, norm_type: float = 2.0, *,
                    layout: ShardLayout | None = None, names: Collection[str] | None = None,
                    group: Any = None) -> torch.Tensor:
    """The unsharded model's gradient norm (collective: every rank of the model's meshes).

    ``layout`` defaults to the one the runtime recorded on ``model``
    (:meth:`ShardLayout.of`); tied parameters count once. ``names``: the (canonical) FQNs
    this rank counts; ``group``: the ranks whose ``names`` together cover the model (a
    pipeline's pp group), their norms combined into the whole model's.
    """
    norm_type = float(norm_type)
    if not (norm_type > 0):  # 0, negative and -inf norms are no norms to clip by
        raise ValueError(f"clip_grad_norm_: norm_type {norm_type} is not supported "
                         "(expected a p > 0, or inf for the max norm)")
    layout = layout if layout is not None else ShardLayout.of(model)
    parts = [_full(torch.nn.utils.get_total_norm([_grad_or_zeros(p) for p in params],
                                                 norm_type)).float().cpu()
             for params in _by_mesh(model, layout, names)]
    if not parts:
        local = torch.zeros((), dtype=torch.float32)
    elif len(parts) == 1:
        local = parts[0]
    else:
        local = torch.linalg.vector_norm(torch.stack(parts), norm_type)
    return local if group is None else _across(local, norm_type, group)


def clip_grad_norm_(model: nn.Module, max_norm: float, norm_type: float = 2.0, *,
                    layout: ShardLayout | None = None) -> torch.Tensor:
    """Scale every gradient by ``min(1, max_norm / (global norm + 1e-6))`` (torch's
    coefficient); returns the norm. Collective: every rank of the model's meshes calls it.

    With every parameter on one mesh this is ``torch.nn.utils.clip_grad_norm_(
    model.parameters(), max_norm)``.

    Example::

        loss.backward()
        clip_grad_norm_(model, 1.0)   # the same as torch's on the unsharded model
        optimizer.step()
    """
    layout = layout if layout is not None else ShardLayout.of(model)
    total = total_grad_norm(model, norm_type, layout=layout)
    for params in _by_mesh(model, layout):  # torch's foreach ops take one mesh at a time
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return total


def clip_pipeline_grad_norm_(model: nn.Module, params: Iterable[torch.Tensor],
                             names: Collection[str], group: Any, max_norm: float,
                             norm_type: float = 2.0, *,
                             layout: ShardLayout | None = None) -> torch.Tensor:
    """:func:`clip_grad_norm_` for one pp rank of a pipeline: the norm of the parameters
    ``names`` (the canonical FQNs its stages own) combined over the pp ``group``; every
    gradient of ``params`` (its stages' parameters, tied copies of another stage's
    included, possibly FSDP-sharded) scaled by torch's coefficient. Returns the norm."""
    total = total_grad_norm(model, norm_type, layout=layout, names=names, group=group)
    meshes: dict[int, list[torch.Tensor]] = {}
    for p in params:
        meshes.setdefault(id(getattr(p, "device_mesh", None)), []).append(p)
    for same_mesh in meshes.values():
        torch.nn.utils.clip_grads_with_norm_(same_mesh, max_norm, total)
    return total

