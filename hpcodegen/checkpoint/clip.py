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
"""

from __future__ import annotations

import torch
from torch import nn

from hpcodegen.checkpoint.layout import ShardLayout


def _by_mesh(model: nn.Module, layout: ShardLayout) -> list[list[torch.Tensor]]:
    """The layout's parameters, one list per mesh, in the layout's order (the same on
    every rank, so every rank issues the same collectives)."""
    groups: dict[int, list[torch.Tensor]] = {}
    for fqn, spec in layout.params.items():
        groups.setdefault(id(spec.mesh), []).append(model.get_parameter(fqn))
    return list(groups.values())


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
                    layout: ShardLayout | None = None) -> torch.Tensor:
    """The unsharded model's gradient norm (collective: every rank of the model's meshes).

    ``layout`` defaults to the one the runtime recorded on ``model``
    (:meth:`ShardLayout.of`); tied parameters count once.
    """
    norm_type = float(norm_type)
    if not (norm_type > 0):  # 0, negative and -inf norms are no norms to clip by
        raise ValueError(f"clip_grad_norm_: norm_type {norm_type} is not supported "
                         "(expected a p > 0, or inf for the max norm)")
    layout = layout if layout is not None else ShardLayout.of(model)
    parts = [_full(torch.nn.utils.get_total_norm([_grad_or_zeros(p) for p in params],
                                                 norm_type)).float().cpu()
             for params in _by_mesh(model, layout)]
    if not parts:
        return torch.zeros((), dtype=torch.float32)
    if len(parts) == 1:
        return parts[0]
    return torch.linalg.vector_norm(torch.stack(parts), norm_type)


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

