"""Where each parameter of a parallelized model lives: its global shape and placements.

The runtime leaves every parameter as a plain local shard and returns, per FQN, the
placements the frozen plan gave it on the live mesh (``parallelize_from_generated``'s
source info). Together with the global shapes taken *before* sharding, that is all a rank
needs to read its slice of a checkpoint, to present its shards as DTensors to
``torch.distributed.checkpoint`` and to count a sharded gradient once in a global norm:
one source of truth (the plan), no second rule for "which slice is mine".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn


def global_shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    """``{param_fqn: shape}`` of every parameter name (tied aliases included).

    Take it before ``parallelize_from_generated``: afterwards the shapes are local.
    """
    return {fqn: tuple(p.shape) for fqn, p in model.named_parameters(remove_duplicate=False)}


def _contiguous_stride(shape: tuple[int, ...]) -> tuple[int, ...]:
    stride, acc = [], 1
    for size in reversed(shape):
        stride.append(acc)
        acc *= max(size, 1)
    return tuple(reversed(stride))


def splits(placement: Any) -> bool:
    """True when ``placement`` leaves each rank of its mesh axis only part of the tensor:
    a ``Shard`` or a strided shard (``SS(d,f)``).

    One rule for both: torch's ``is_shard()`` is False for ``_StridedShard`` (torch 2.13),
    so a fused ``gate_up_proj`` sharded over tp would pass for replicated there.
    """
    from torch.distributed.tensor.placement_types import _StridedShard

    return placement.is_shard() or isinstance(placement, _StridedShard)


@dataclass(frozen=True)
class ParamSpec:
    """One parameter's global shape and its torch placements over ``mesh``.

    ``mesh`` is the submesh the plan sharded it on (the expert mesh for expert-parallel
    parameters); None, with no placements, for a parameter nothing shards.
    """

    global_shape: tuple[int, ...]
    placements: tuple = ()
    mesh: Any = None


@dataclass
class ShardLayout:
    """The parameters of one parallelized model, by canonical FQN.

    Attributes:
        mesh: the dense submesh the plan sharded on (None: nothing sharded, e.g. tp=1);
            each ``ParamSpec`` names its own (expert parameters: the expert mesh).
        params: ``{canonical fqn: ParamSpec}``; one entry per parameter *object*.
        aliases: ``{tied fqn: canonical fqn}`` (``lm_head.weight`` -> ``...embed_tokens.weight``).
    """

    mesh: Any
    params: dict[str, ParamSpec]
    aliases: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_model(cls, model: nn.Module, shapes: Mapping[str, tuple[int, ...]],
                   source_info: Mapping[str, tuple[tuple, Any]] | None) -> ShardLayout:
        """Build from the model (after install), its pre-install ``shapes`` and the source
        info ``parallelize_from_generated`` returned (``{}`` for a no-op install)."""
        info = source_info or {}
        meshes = [m for _, m in info.values() if m is not None]
        mesh = max(meshes, key=lambda m: sum(1 for _, n in info.values() if n is m),
                   default=None)  # the dense mesh: the one most parameters live on
        params: dict[str, ParamSpec] = {}
        aliases: dict[str, str] = {}
        seen: dict[int, str] = {}
        for fqn, param in model.named_parameters(remove_duplicate=False):
            first = seen.setdefault(id(param), fqn)
            if first != fqn:
                aliases[fqn] = first
                continue
            placements, where = info.get(fqn, ((), None))
            placements = tuple(placements) if where is not None else ()
            params[fqn] = ParamSpec(tuple(shapes.get(fqn, tuple(param.shape))), placements,
                                    where)
        return cls(mesh, params, aliases)

    def is_sharded(self, fqn: str) -> bool:
        """True when some mesh axis holds only part of ``fqn``."""
        return any(splits(p) for p in self.params[fqn].placements)

    def is_strided(self, fqn: str) -> bool:
        """True for a strided shard (``SS(d,f)``, e.g. a fused gate_up over tp): the local
        shard is ``f`` pieces of the global tensor, not one slice."""
        from torch.distributed.tensor.placement_types import _StridedShard

        return any(isinstance(p, _StridedShard) for p in self.params[fqn].placements)

    def local_slices(self, fqn: str) -> tuple[slice, ...]:
        """This rank's index into the global tensor (torch's own uneven-shard rule); not for
        strided shards (:meth:`is_strided`)."""
        spec = self.params[fqn]
        if spec.mesh is None or not spec.placements:
            return tuple(slice(0, n) for n in spec.global_shape)
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        shape, offset = compute_local_shape_and_global_offset(
            spec.global_shape, spec.mesh, list(spec.placements))
        return tuple(slice(o, o + n) for o, n in zip(offset, shape, strict=True))

    def local_shape(self, fqn: str) -> tuple[int, ...]:
        return tuple(s.stop - s.start for s in self.local_slices(fqn))

    def to_dtensor(self, fqn: str, local: torch.Tensor) -> torch.Tensor:
        """``local`` as the DTensor it is a shard of (plain ``local`` without a mesh).

        The DTensor shares ``local``'s storage, so a checkpoint load into it writes the
        parameter (or optimizer state) in place.
        """
        spec = self.params[fqn]
        if spec.mesh is None or not spec.placements:
            return local
        from torch.distributed.tensor import DTensor

        return DTensor.from_local(local, spec.mesh, list(spec.placements), run_check=False,
                                  shape=torch.Size(spec.global_shape),
                                  stride=_contiguous_stride(spec.global_shape))
