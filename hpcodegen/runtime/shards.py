"""What a parallelized parameter is a shard of, kept where torch's tools can find it.

After install every parameter the plan places on a mesh is a DTensor on that (sub)mesh with
the plan's placements (:func:`as_local_param`), so torch's own tools see the unsharded
parameter: ``torch.nn.utils.clip_grad_norm_``, ``p.grad.norm()``, optimizers,
``torch.distributed.checkpoint`` and FSDP2. The forwards still compute on local tensors:
:mod:`hpcodegen.runtime.local_views` hands each module its parameters' local views for the
duration of its forward, and autograd accumulates their gradients into the DTensor
parameters' ``.grad`` (DTensors with the same placements).

What each parameter *is a shard of* (mesh, placements, global shape) is also recorded in a
:class:`ShardSpec`:

* by FQN in the model's :class:`ParallelState` (:func:`parallel_state`), read by the
  checkpoint layout (:mod:`hpcodegen.checkpoint.layout`);
* on the parameter object itself (:func:`spec_of`; derived from the DTensor when a
  ``module.to(...)`` swapped the attribute away).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

_STATE = "_hp_parallel_state"
_SPEC = "_hp_shard_spec"


def splits(placement: Any) -> bool:
    """A torch placement that leaves each rank part of the tensor: ``Shard`` or a strided
    shard (torch 2.13's ``is_shard()`` is False for ``_StridedShard``)."""
    from torch.distributed.tensor.placement_types import _StridedShard

    return placement.is_shard() or isinstance(placement, _StridedShard)


def _contiguous_stride(shape: tuple[int, ...]) -> tuple[int, ...]:
    stride, acc = [], 1
    for size in reversed(shape):
        stride.append(acc)
        acc *= max(size, 1)
    return tuple(reversed(stride))


@dataclass(frozen=True)
class ShardSpec:
    """One parameter's global shape and its torch placements over ``mesh``.

    ``mesh`` is the submesh the plan places it on (the expert mesh for an expert
    parameter); None, with no placements, for a parameter nothing shards.
    """

    global_shape: tuple[int, ...]
    placements: tuple = ()
    mesh: Any = None

    @property
    def sharded(self) -> bool:
        """Some mesh axis holds only part of the parameter."""
        return self.mesh is not None and any(splits(p) for p in self.placements)

    @property
    def strided(self) -> bool:
        """A strided shard (``SS(d,f)``): the local tensor is ``f`` pieces, not one slice."""
        from torch.distributed.tensor.placement_types import _StridedShard

        return any(isinstance(p, _StridedShard) for p in self.placements)

    def local_slices(self) -> tuple[slice, ...]:
        """This rank's index into the global tensor (torch's uneven-shard rule); not for
        strided shards."""
        if self.mesh is None or not self.placements:
            return tuple(slice(0, n) for n in self.global_shape)
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        shape, offset = compute_local_shape_and_global_offset(
            self.global_shape, self.mesh, list(self.placements))
        return tuple(slice(o, o + n) for o, n in zip(offset, shape, strict=True))

    def local_shape(self) -> tuple[int, ...]:
        return tuple(s.stop - s.start for s in self.local_slices())

    def to_dtensor(self, local: torch.Tensor) -> torch.Tensor:
        """``local`` as the DTensor it is a shard of, sharing its storage (a DCP load into
        the DTensor writes ``local``); ``local`` itself without a mesh, or when it is a
        DTensor already (a runtime parameter). No communication."""
        if self.mesh is None or not self.placements or _is_dtensor(local):
            return local
        from torch.distributed.tensor import DTensor

        with torch.no_grad():
            return DTensor.from_local(local, self.mesh, list(self.placements), run_check=False,
                                      shape=torch.Size(self.global_shape),
                                      stride=_contiguous_stride(self.global_shape))

    def to_local(self, value: torch.Tensor, where: str) -> torch.Tensor:
        """A value for this parameter (a DTensor of any placements on the same mesh, a
        tensor of the global shape, or already the local shard) as the local shard.

        A DTensor of other placements is redistributed (that communicates); a global
        tensor is sliced (strided shards: cut by ``distribute_tensor``).
        """
        from torch.distributed.tensor import DTensor, distribute_tensor

        if isinstance(value, DTensor):
            if self.mesh is None:
                return value.full_tensor()
            if tuple(value.placements) != tuple(self.placements):
                value = value.redistribute(self.mesh, list(self.placements))
            return value.to_local()
        if self.mesh is None or not self.sharded or tuple(value.shape) != self.global_shape:
            return value
        if self.strided:
            return distribute_tensor(value, self.mesh, list(self.placements)).to_local()
        return value[self.local_slices()]


def local_grad(param: torch.Tensor) -> torch.Tensor | None:
    """The parameter's gradient as a plain tensor: a DTensor gradient's local shard (its
    storage: in-place changes reach ``.grad``), else the gradient itself."""
    grad = param.grad
    return grad._local_tensor if grad is not None and _is_dtensor(grad) else grad


def _is_dtensor(value: Any) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(value, DTensor)


def as_local_param(local: torch.Tensor, spec: ShardSpec, requires_grad: bool) -> nn.Parameter:
    """``local`` as the parameter of a rank: the DTensor it is a shard of
    (:meth:`ShardSpec.to_dtensor`: the plan's placements on the plan's submesh, sharing
    ``local``'s storage) where ``spec`` has a mesh, else a plain ``nn.Parameter``; its spec
    recorded for :func:`spec_of`. The forward reads the local view
    (:mod:`hpcodegen.runtime.local_views`)."""
    param = nn.Parameter(spec.to_dtensor(local), requires_grad=requires_grad)
    remember(param, spec)
    return param


def remember(param: torch.Tensor, spec: ShardSpec) -> None:
    """Record ``spec`` on a parameter object (one made by a checkpoint load, too)."""
    setattr(param, _SPEC, spec)


def spec_of(param: torch.Tensor) -> ShardSpec | None:
    """The :class:`ShardSpec` of a parameter object the runtime made, else None; a DTensor
    parameter's own mesh and placements (a ``module.to(...)`` swaps a DTensor parameter's
    contents and drops the recorded attribute, the DTensor keeps what it is)."""
    spec = getattr(param, _SPEC, None)
    if spec is None and _is_dtensor(param):
        return ShardSpec(tuple(param.shape), tuple(param.placements), param.device_mesh)
    return spec


@dataclass(frozen=True)
class ParallelState:
    """What ``parallelize`` leaves on a model (:func:`parallel_state` reads it).

    Attributes:
        specs: parameter FQN (tied aliases too) -> :class:`ShardSpec`.
        source_info: ``{param fqn: (placements over the plan axes, source submesh)}``,
            FSDP2's view (``parallelize_from_generated``'s return value).
        aliases: ``{tied fqn: canonical fqn}``.
        plan: the :class:`~hpcodegen.plan.types.Plan` that was installed.
    """

    specs: Mapping[str, ShardSpec]
    source_info: Mapping[str, tuple[tuple, Any]]
    aliases: Mapping[str, str] = field(default_factory=dict)
    plan: Any = None


def set_parallel_state(model: nn.Module, state: ParallelState) -> None:
    model.__dict__[_STATE] = state


def parallel_state(model: nn.Module) -> ParallelState | None:
    """The :class:`ParallelState` of a parallelized model, else None."""
    return model.__dict__.get(_STATE)
