"""Where each parameter of a parallelized model lives: its global shape and placements.

The runtime records that per parameter at install (:class:`hpcodegen.runtime.shards.ShardSpec`,
read back with :func:`hpcodegen.runtime.shards.parallel_state`): the placements the frozen
plan gives it on the live mesh and its global shape. :class:`ShardLayout` is that record by
canonical FQN, with tied aliases apart: what a rank needs to read its slice of a safetensors
checkpoint and to count a sharded gradient once in a global norm. One source of truth (the
plan), no second rule for "which slice is mine".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from hpcodegen.runtime.shards import ShardSpec, parallel_state, splits

#: The spec of one parameter (the runtime's type; the old name is kept for callers).
ParamSpec = ShardSpec
__all__ = ["ParamSpec", "ShardLayout", "global_shapes", "splits"]


def global_shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    """``{param_fqn: shape}`` of every parameter name (tied aliases included).

    Take it before install: afterwards the shapes are local (the layout knows the global
    ones from the runtime's record).
    """
    return {fqn: tuple(p.shape) for fqn, p in model.named_parameters(remove_duplicate=False)}


@dataclass
class ShardLayout:
    """The parameters of one model, by canonical FQN.

    Attributes:
        mesh: the dense submesh the plan sharded on (None: nothing sharded, e.g. tp=1);
            each spec names its own (expert parameters: the expert mesh).
        params: ``{canonical fqn: ShardSpec}``; one entry per parameter *object*.
        aliases: ``{tied fqn: canonical fqn}`` (``lm_head.weight`` -> ``...embed_tokens.weight``).
    """

    mesh: Any
    params: dict[str, ShardSpec]
    aliases: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, model: nn.Module) -> ShardLayout:
        """The layout the runtime recorded on ``model``; a model it did not parallelize
        (or a no-op install) has every parameter whole, on no mesh."""
        return cls.from_model(model, global_shapes(model), None)

    @classmethod
    def from_model(cls, model: nn.Module, shapes: Mapping[str, tuple[int, ...]],
                   source_info: Mapping[str, tuple[tuple, Any]] | None = None) -> ShardLayout:
        """Build from the model: the runtime's record when it was parallelized, else
        ``shapes`` (taken before install) with nothing sharded. ``source_info`` is
        accepted for older callers; the record is the same information."""
        state = parallel_state(model)
        specs = state.specs if state is not None else {}
        params: dict[str, ShardSpec] = {}
        aliases: dict[str, str] = {}
        seen: dict[int, str] = {}
        for fqn, param in model.named_parameters(remove_duplicate=False):
            first = seen.setdefault(id(param), fqn)
            if first != fqn:
                aliases[fqn] = first
                continue
            params[fqn] = specs.get(fqn) or ShardSpec(tuple(shapes.get(fqn, tuple(param.shape))))
        meshes = [s.mesh for s in params.values() if s.mesh is not None]
        mesh = max(meshes, key=lambda m: sum(1 for s in params.values() if s.mesh is m),
                   default=None)  # the dense mesh: the one most parameters live on
        return cls(mesh, params, aliases)

    def is_sharded(self, fqn: str) -> bool:
        """True when some mesh axis holds only part of ``fqn``."""
        return self.params[fqn].sharded

    def is_strided(self, fqn: str) -> bool:
        """True for a strided shard (``SS(d,f)``, e.g. a fused gate_up over tp)."""
        return self.params[fqn].strided

    def local_slices(self, fqn: str) -> tuple[slice, ...]:
        """This rank's index into the global tensor; not for strided shards."""
        return self.params[fqn].local_slices()

    def local_shape(self, fqn: str) -> tuple[int, ...]:
        return self.params[fqn].local_shape()

    def to_dtensor(self, fqn: str, local: torch.Tensor) -> torch.Tensor:
        """``local`` as the DTensor it is a shard of (plain ``local`` without a mesh)."""
        return self.params[fqn].to_dtensor(local)
