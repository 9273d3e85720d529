"""Immutable JSON values for the typed plan (pure, no torch).

A :class:`~hpcodegen.plan.types.Plan` is frozen all the way down: its mappings are
:class:`FrozenMap` (read-only, hashable, insertion-ordered) and its arrays tuples, so a phase
handed the plan can neither change it for the next phase nor be surprised by a change.
:func:`freeze_json` / :func:`thaw_json` convert parsed JSON (dicts, lists, scalars) to that
form and back; the parts of a meta hpcodegen does not model (another generator's keys,
``source.structure``) are kept as frozen JSON and written back unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

K = TypeVar("K")
V = TypeVar("V")


def _read_only(self: Any, *args: Any, **kwargs: Any) -> Any:
    raise TypeError(f"{type(self).__name__} is read-only")


class FrozenMap(dict[K, V]):
    """A read-only mapping that keeps its insertion order and is hashable.

    A ``dict`` whose mutators raise, so every read (``m[k]``, ``k in m``, ``get``, ``len``,
    iteration) is the dict's own C code: the plan readers of verify and inspect-plan make
    millions of them on a 10,000-entry plan. Equality is a dict's (order-free, equal to a
    ``dict`` with the same items); the hash needs hashable values, which frozen JSON and
    placements are.

    Example::

        >>> m = FrozenMap({"tp": 2})
        >>> m["tp"], dict(m) == {"tp": 2}
        (2, True)

    .. note:: ``isinstance(m, dict)`` is True; code that mutates what it is handed must
       copy it first (``dict(m)``), as it must for any plan value.
    """

    __slots__ = ("_hash",)

    def __init__(self, items: Mapping[K, V] | Any = ()) -> None:
        super().__init__(items)
        self._hash: int | None = None

    @classmethod
    def adopt(cls, data: dict[K, V]) -> FrozenMap[K, V]:
        """The frozen copy of a fresh ``dict`` (the caller must not keep it)."""
        return cls(data)

    def __hash__(self) -> int:  # type: ignore[override]
        if self._hash is None:
            self._hash = hash(frozenset(self.items()))
        return self._hash

    def __repr__(self) -> str:
        return f"FrozenMap({dict.__repr__(self)})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenMap, (dict(self),))

    def copy(self) -> FrozenMap[K, V]:  # type: ignore[override]
        return self

    __setitem__ = __delitem__ = _read_only
    clear = pop = popitem = setdefault = update = __ior__ = _read_only  # type: ignore[assignment]


EMPTY: FrozenMap[Any, Any] = FrozenMap()


def freeze_json(value: Any) -> Any:
    """Parsed JSON -> the same value with every object a FrozenMap and every array a tuple."""
    if isinstance(value, Mapping):
        return FrozenMap.adopt({k: freeze_json(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(freeze_json(v) for v in value)
    return value


def thaw_json(value: Any) -> Any:
    """The inverse of :func:`freeze_json`: dicts and lists again, ready for ``json.dumps``."""
    if isinstance(value, Mapping):
        return {k: thaw_json(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [thaw_json(v) for v in value]
    return value
