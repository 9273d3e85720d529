"""Class-level defaults for generated modeling modules: run exactly like transformers.

A generated boundary class calls ``self._hp_tp.all_gather(x, dim=1)`` and friends. Until the
runtime binds real lowered ops on an instance, these defaults make every call a no-op, so a
model built from the generated classes is the unparallelized transformers model. No torch
import here: generated modules import this at module load.
"""

from __future__ import annotations

from typing import Any


def unwrap_local(value: Any) -> Any:
    """A DTensor's local shard, anything else unchanged: the one unwrap of the runtime
    (torch never imported here, so generated modules can use it at load)."""
    to_local = getattr(value, "to_local", None)
    return to_local() if callable(to_local) and hasattr(value, "placements") else value


class IdentityTP:
    """The no-op stand-in for :class:`hpcodegen.runtime.collectives.matching.TPOps`."""

    def to_local(self, tensor: Any) -> Any:
        return unwrap_local(tensor)

    def all_gather(self, tensor: Any, dim: int | None = None) -> Any:
        return unwrap_local(tensor)

    def all_reduce(self, tensor: Any) -> Any:
        return unwrap_local(tensor)

    def reduce_scatter(self, tensor: Any, dim: int | None = None) -> Any:
        return unwrap_local(tensor)

    def __repr__(self) -> str:
        return "IDENTITY_TP"


class IdentityBoundary:
    """The no-op stand-in for the generic engine bound as ``self._hp_boundary``."""

    def redistribute_inputs(self, payload: tuple[tuple[Any, ...], dict[str, Any]]) -> Any:
        return payload

    def redistribute_outputs(self, outputs: Any) -> Any:
        return outputs

    def rewrap_outputs(self, outputs: Any) -> Any:
        return outputs

    def __repr__(self) -> str:
        return "IDENTITY_BOUNDARY"


class NoDeferredBias:
    """Default deferred-bias hook: the bias is still inside the rowwise Linear.

    An object, not a function: a generated class sets ``_hp_deferred_bias = no_deferred_bias``
    as a class attribute, and a plain function there would be bound as a method.
    """

    def __call__(self, outputs: Any) -> Any:
        return outputs

    def __repr__(self) -> str:
        return "no_deferred_bias"


no_deferred_bias = NoDeferredBias()


IDENTITY_TP = IdentityTP()
IDENTITY_BOUNDARY = IdentityBoundary()
