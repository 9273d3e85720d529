"""Immutable JSON values for the typed plan (pure, no torch).

A :class:`~hpcodegen.plan.types.Plan` is frozen all the way down: its mappings are
:class:`FrozenMap` (read-only, hashable, insertion-ordered) and its arrays tuples, so a phase
handed the plan can neither change it for the next phase nor be surprised by a change.
:func:`freeze_json` / :func:`thaw_json` convert parsed JSON (dicts, lists, scalars) to that
form and back; the parts of a meta hpcodegen does not model (another generator's keys,
``source.structure``) are kept as frozen JSON and written back unchanged.
"""

from __future__ import annotations

from collections.abc import ItemsView, Iterator, KeysView, Mapping, ValuesView
from typing import Any, Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class FrozenMap(Mapping[K, V], Generic[K, V]):
    """A read-only mapping that keeps its insertion order and is hashable.

    Equality is a mapping's (order-free, equal to a ``dict`` with the same items); the hash
    needs hashable values, which frozen JSON and placements are.

    Example::

        >>> m = FrozenMap({"tp": 2})
        >>> m["tp"], dict(m) == {"tp": 2}
        (2, True)
    """

    __slots__ = ("_data", "_hash")

    def __init__(self, items: Mapping[K, V] | Any = ()) -> None:
        self._data: dict[K, V] = dict(items)
        self._hash: int | None = None

    @classmethod
    def adopt(cls, data: dict[K, V]) -> FrozenMap[K, V]:
        """Wrap a fresh ``dict`` without copying it; the caller must not keep it."""
        new = cls.__new__(cls)
        new._data = data
        new._hash = None
        return new

    def __getitem__(self, key: K) -> V:
        return self._data[key]

    def __iter__(self) -> Iterator[K]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def get(self, key: K, default: Any = None) -> Any:
        return self._data.get(key, default)

    # the dict's own read-only views: the ABC's generic ones call __getitem__ per key, and
    # the plan readers iterate thousands of entries
    def keys(self) -> KeysView[K]:
        return self._data.keys()

    def values(self) -> ValuesView[V]:
        return self._data.values()

    def items(self) -> ItemsView[K, V]:
        return self._data.items()

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(frozenset(self._data.items()))
        return self._hash

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FrozenMap):
            return self._data == other._data
        return isinstance(other, Mapping) and self._data == dict(other.items())

    def __repr__(self) -> str:
        return f"FrozenMap({self._data!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenMap, (self._data,))


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
