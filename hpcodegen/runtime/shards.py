"""What a parallelized parameter is a shard of, kept where torch's tools can find it.

After install every parameter stays a plain local tensor: the forwards run bare
collectives on local shards, at no per-call cost. What the local tensor *is a shard of*
(mesh, placements, global shape) is recorded once per parameter in a :class:`ShardSpec`:

* by FQN in the model's :class:`ParallelState` (:func:`parallel_state`), from which
  ``model.state_dict()`` yields DTensors (:mod:`hpcodegen.runtime.state_dict`);
* on the parameter object itself (:func:`spec_of`), from which an optimizer's
  ``state_dict()`` yields DTensors too (an attribute, not a weak map: checkpoint loading
  swaps tensors in place, which ``torch.utils.swap_tensors`` refuses for a weakly
  referenced one).

A parameter some mesh axis *splits* is a :class:`LocalShard` (an ``nn.Parameter``
subclass, no ``__torch_function__``: ops on it cost what they cost on a Parameter). Its
``.grad`` reads as a :class:`ShardGrad`, which refuses to be normed: a norm of a local
shard's gradient is one rank's part of the norm, and ``torch.nn.utils.clip_grad_norm_``
would clip every rank by a different, wrong number. :func:`hpcodegen.checkpoint.clip_grad_norm_`
is the exact one (it reads :func:`local_grad`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch._C import DisableTorchFunctionSubclass

from hpcodegen.errors import PlanError, error

_STATE = "_hp_parallel_state"
_SPEC = "_hp_shard_spec"
_GRAD = torch._C.TensorBase.grad


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
        the DTensor writes ``local``); ``local`` itself without a mesh. No communication."""
        if self.mesh is None or not self.placements:
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


class ShardGrad(torch.Tensor):
    """The gradient of a :class:`LocalShard`, as ``.grad`` shows it: every op passes
    through unchanged, except a norm, which is refused (see the module docstring)."""

    _NORMS: frozenset[Any] = frozenset()

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        if func in cls._NORMS:
            raise PlanError([error(
                "runtime.local_shard_norm", getattr(func, "__name__", str(func)),
                "the norm of a tensor-parallel local shard's gradient is this rank's part "
                "only: torch.nn.utils.clip_grad_norm_ (or any grad norm) would be wrong, and "
                "different on every rank",
                hint="clip with hpcodegen.checkpoint.clip_grad_norm_(model, max_norm) (the "
                     "unsharded model's norm), or setup().clip_grad_norm_(max_norm)")])
        with DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))


ShardGrad._NORMS = frozenset({torch._foreach_norm, torch.norm, torch.Tensor.norm,
                              torch.linalg.norm, torch.linalg.vector_norm,
                              torch.linalg.matrix_norm})


class LocalShard(nn.Parameter):
    """A parameter holding this rank's shard of a split parameter (see module docstring).

    Ops run as on ``nn.Parameter``; only ``.grad`` differs: it reads as a
    :class:`ShardGrad` view of the real gradient (writes and ``None`` pass through).
    """

    @property  # type: ignore[override]
    def grad(self) -> torch.Tensor | None:
        value = _GRAD.__get__(self)
        return None if value is None else value.as_subclass(ShardGrad)

    @grad.setter
    def grad(self, value: torch.Tensor | None) -> None:
        if isinstance(value, ShardGrad):
            value = value.as_subclass(torch.Tensor)
        _GRAD.__set__(self, value)

    @grad.deleter
    def grad(self) -> None:
        _GRAD.__delete__(self)


def local_grad(param: torch.Tensor) -> torch.Tensor | None:
    """The parameter's gradient as a plain tensor (a :class:`LocalShard`'s real one)."""
    return _GRAD.__get__(param)


def as_local_param(local: torch.Tensor, spec: ShardSpec, requires_grad: bool) -> nn.Parameter:
    """``local`` as the parameter of a rank: a :class:`LocalShard` when ``spec`` splits
    it, else an ``nn.Parameter``; its spec recorded for :func:`spec_of`."""
    cls = LocalShard if spec.sharded else nn.Parameter
    param = cls(local, requires_grad=requires_grad)
    remember(param, spec)
    return param


def remember(param: torch.Tensor, spec: ShardSpec) -> None:
    """Record ``spec`` on a parameter object (one made by a checkpoint load, too)."""
    setattr(param, _SPEC, spec)


def spec_of(param: torch.Tensor) -> ShardSpec | None:
    """The :class:`ShardSpec` of a parameter object the runtime made, else None."""
    return getattr(param, _SPEC, None)


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
