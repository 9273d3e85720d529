"""The plan generate fills in: typed, mutable, checked as it is filled, frozen once (pure).

``generate``'s passes (seeds, layouts, checks) decide a module's placements one at a
time; they write them into a :class:`DraftPlan` instead of a dict of placement strings.
Every value is validated when it is set, so a wrong placement is refused at the pass that
made it (naming the module FQN, the field and the name), not found later by a check of
the whole meta. Placements are :mod:`hpcodegen.placement` objects; a JSON value (a recipe
or another generator's entry) enters only through :mod:`hpcodegen.plan.codec`, the one
reader. :meth:`DraftPlan.freeze` turns the draft into the frozen ``{fqn: PlanEntry}`` of
:class:`~hpcodegen.plan.types.Plan` once; afterwards the draft refuses every change, so
no pass can edit a plan that was already handed on.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from hpcodegen.placement import Partial, Placement, Replicate, Shard, StridedShard
from hpcodegen.plan.codec import (
    PlanFormatError,
    entry_field_from_json,
    entry_field_name,
    entry_to_json,
)
from hpcodegen.plan.frozen import FrozenMap, freeze_json
from hpcodegen.plan.types import PlanEntry

#: The entry fields holding ``{name: {axis: placement}}``.
PLACEMENT_FIELDS: tuple[str, ...] = ("params", "in_src", "in_dst", "out_src", "out_dst")
#: The entry fields holding names (outputs, attributes, parameters, inputs).
NAME_FIELDS: tuple[str, ...] = ("out_names", "tp_divide_attrs", "deferred_bias_params",
                                "tp_rank0_params", "partial_grad_params", "no_grad_inputs")
FLAG_FIELDS: tuple[str, ...] = ("is_boundary", "region_dispatch")
_PLACEMENT_TYPES = (Replicate, Shard, StridedShard, Partial)


class DraftError(ValueError):
    """A value a pass set that the plan cannot hold; the message names where."""


class FrozenDraftError(DraftError):
    """A change to a draft that was already frozen into a :class:`Plan`'s entries."""


class DraftEntry:
    """One module's entry while generate fills it: the mutable twin of
    :class:`~hpcodegen.plan.types.PlanEntry` (same fields, same meaning)."""

    __slots__ = ("_extra", "_fields", "_owner", "fqn")

    def __init__(self, fqn: str, owner: DraftPlan | None = None) -> None:
        self.fqn = fqn
        self._owner = owner
        self._fields: dict[str, Any] = {}
        self._extra: dict[str, Any] = {}

    def _where(self, *path: str) -> str:
        return ".".join((f"param_plan[{self.fqn!r}]", *path))

    def _writable(self) -> None:
        if self._owner is not None and self._owner.frozen:
            raise FrozenDraftError(f"{self._where()}: the plan was frozen; it is read-only")

    # -- placements -------------------------------------------------------------------
    def place(self, field: str, name: str, named: Mapping[str, Placement]) -> None:
        """Set ``field[name]`` to ``{axis: placement}`` (replacing what it held).

        Example::

            entry.place("params", "weight", {"tp": Shard(0)})
        """
        self._writable()
        if field not in PLACEMENT_FIELDS:
            raise DraftError(f"{self._where(field)}: not a placement field "
                             f"(one of {', '.join(PLACEMENT_FIELDS)})")
        checked: dict[str, Placement] = {}
        for axis, value in named.items():
            if not isinstance(axis, str) or not isinstance(value, _PLACEMENT_TYPES):
                raise DraftError(f"{self._where(field, name, str(axis))}: expected a placement "
                                 f"object on a named axis, got {value!r}")
            checked[axis] = value
        self._fields.setdefault(field, {})[name] = checked

    def set_placements(self, field: str,
                       placements: Mapping[str, Mapping[str, Placement]]) -> None:
        """Set the whole of ``field`` to ``{name: {axis: placement}}`` (an empty mapping
        declares the field empty: ``"params": {}`` in the meta)."""
        self._writable()
        if field not in PLACEMENT_FIELDS:
            raise DraftError(f"{self._where(field)}: not a placement field "
                             f"(one of {', '.join(PLACEMENT_FIELDS)})")
        self._fields[field] = {}
        for name, named in placements.items():
            self.place(field, name, named)

    def unplace(self, field: str, name: str) -> None:
        """Remove ``field[name]`` (the field itself stays, possibly empty)."""
        self._writable()
        held = self._fields.get(field)
        if held is not None:
            held.pop(name, None)

    def placement(self, field: str, name: str) -> Mapping[str, Placement] | None:
        """``field[name]`` as set (``None``: not set)."""
        held = self._fields.get(field)
        return None if held is None else held.get(name)

    def placements(self, field: str) -> Mapping[str, Mapping[str, Placement]]:
        """Every ``{name: {axis: placement}}`` of ``field`` (a read-only copy)."""
        return {n: dict(p) for n, p in (self._fields.get(field) or {}).items()}

    # -- other fields -----------------------------------------------------------------
    def set(self, field: str, value: tuple[str, ...] | bool | None) -> None:
        """Set a name list or flag field; ``None`` removes it."""
        self._writable()
        if value is None:
            self._fields.pop(field, None)
            return
        if field in NAME_FIELDS:
            if isinstance(value, (str, bool)) or not all(isinstance(v, str) for v in value):
                raise DraftError(f"{self._where(field)}: expected a sequence of names, "
                                 f"got {value!r}")
            self._fields[field] = tuple(value)
        elif field in FLAG_FIELDS:
            if not isinstance(value, bool):
                raise DraftError(f"{self._where(field)}: expected true or false, got {value!r}")
            self._fields[field] = value
        else:
            raise DraftError(f"{self._where(field)}: not a name or flag field")

    def get(self, field: str) -> Any:
        """A field's value as set (``None``: not set)."""
        return self._fields.get(field)

    def clear(self, field: str) -> None:
        """Remove a field of any kind (absent from the meta afterwards)."""
        self._writable()
        self._fields.pop(field, None)

    def add_names(self, field: str, names: Iterable[str]) -> None:
        """Add ``names`` to a name field, kept sorted and once each."""
        self.set(field, tuple(sorted({*(self.get(field) or ()), *names})))

    def remove_name(self, field: str, name: str) -> None:
        """Remove ``name`` from a name field; a field left empty is removed."""
        kept = tuple(n for n in self.get(field) or () if n != name)
        self.set(field, kept or None)

    @property
    def boundary(self) -> bool:
        """The entry is a boundary (:attr:`PlanEntry.boundary`, the one rule)."""
        return self.view().boundary

    def update_json(self, entry: Mapping[str, Any]) -> None:
        """Merge a ``param_plan`` entry as JSON (a recipe's, another generator's): each key
        read by the codec, the one reader; a key the entry does not model is kept verbatim.

        Raises:
            PlanFormatError: a value of the wrong shape, at its JSON path.
        """
        self._writable()
        where = ("param_plan", self.fqn)
        for key, value in entry.items():
            name = entry_field_name(key)
            if name is None or value is None:
                self._extra[key] = freeze_json(value)
                continue
            parsed = entry_field_from_json(key, value, where)
            if name in PLACEMENT_FIELDS:
                parsed = {n: dict(p) for n, p in parsed.items()}
            self._fields[name] = parsed

    def view(self) -> PlanEntry:
        """The :class:`PlanEntry` of what is set now (a snapshot; the draft stays open):
        the typed readers (:meth:`PlanEntry.splits_compute` ...) answer for a pass."""
        return self.freeze()

    def freeze(self) -> PlanEntry:
        """The :class:`PlanEntry` of what was set."""
        kwargs: dict[str, Any] = {}
        for name, value in self._fields.items():
            if name in PLACEMENT_FIELDS:
                value = FrozenMap.adopt({n: FrozenMap(p) for n, p in value.items()})
            kwargs[name] = value
        return PlanEntry(fqn=self.fqn, extra=FrozenMap(self._extra), **kwargs)


class DraftPlan:
    """``{module fqn: DraftEntry}`` in the order the passes add them; frozen once."""

    __slots__ = ("_entries", "frozen")

    def __init__(self) -> None:
        self._entries: dict[str, DraftEntry] = {}
        self.frozen = False

    @classmethod
    def from_json(cls, param_plan: Mapping[str, Mapping[str, Any]]) -> DraftPlan:
        """A draft holding a ``param_plan`` object (read by the codec)."""
        draft = cls()
        for fqn, entry in param_plan.items():
            if not isinstance(entry, Mapping):
                raise PlanFormatError(("param_plan", fqn), "expected an object")
            draft.entry(fqn).update_json(entry)
        return draft

    def entry(self, fqn: str) -> DraftEntry:
        """The entry of ``fqn``, added (empty) when the plan has none yet."""
        held = self._entries.get(fqn)
        if held is None:
            if self.frozen:
                raise FrozenDraftError(f"param_plan[{fqn!r}]: the plan was frozen; "
                                       "no entry can be added")
            held = self._entries[fqn] = DraftEntry(fqn, self)
        return held

    def param_entry(self, fqn: str) -> DraftEntry:
        """The entry of ``fqn``; one added here is parameter-only (``params: {}``,
        ``is_boundary: false``) until a pass says more."""
        if fqn not in self._entries:
            added = self.entry(fqn)
            added.set_placements("params", {})
            added.set("is_boundary", False)
        return self._entries[fqn]

    def reset(self, fqn: str) -> DraftEntry:
        """A new, empty entry for ``fqn`` in place of any it had (at the same position)."""
        if self.frozen:
            raise FrozenDraftError(f"param_plan[{fqn!r}]: the plan was frozen; read-only")
        held = self._entries[fqn] = DraftEntry(fqn, self)
        return held

    def drop(self, fqn: str) -> None:
        """Remove ``fqn``'s entry (a pass found it plans nothing)."""
        if self.frozen:
            raise FrozenDraftError(f"param_plan[{fqn!r}]: the plan was frozen; read-only")
        self._entries.pop(fqn, None)

    def get(self, fqn: str) -> DraftEntry | None:
        """The entry of ``fqn`` or ``None`` (nothing added)."""
        return self._entries.get(fqn)

    def items(self) -> Iterator[tuple[str, DraftEntry]]:
        """``(fqn, entry)`` in the plan's order (a copy: a pass may add while it reads)."""
        return iter(list(self._entries.items()))

    def sort(self) -> None:
        """Order the entries by FQN (the order generate hands the plan on in)."""
        if self.frozen:
            raise FrozenDraftError("param_plan: the plan was frozen; read-only")
        self._entries = {fqn: self._entries[fqn] for fqn in sorted(self._entries)}

    def view(self) -> FrozenMap[str, PlanEntry]:
        """Every entry as a :class:`PlanEntry` now (a snapshot; the draft stays open), for
        the typed rules a pass consults while it fills the plan."""
        return FrozenMap.adopt({fqn: e.view() for fqn, e in self._entries.items()})

    def __getitem__(self, fqn: str) -> DraftEntry:
        return self._entries[fqn]

    def __contains__(self, fqn: object) -> bool:
        return fqn in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def freeze(self) -> FrozenMap[str, PlanEntry]:
        """The frozen entries of a :class:`~hpcodegen.plan.types.Plan`; once only.

        Raises:
            FrozenDraftError: the draft was frozen before.
        """
        if self.frozen:
            raise FrozenDraftError("param_plan: the plan was frozen already (freeze it once)")
        self.frozen = True
        return FrozenMap.adopt({fqn: e.freeze() for fqn, e in self._entries.items()})


def entries_to_json(entries: Mapping[str, PlanEntry]) -> dict[str, Any]:
    """The ``param_plan`` object of frozen entries, as the meta writes it."""
    return {fqn: entry_to_json(entry) for fqn, entry in entries.items()}


__all__ = ["DraftEntry", "DraftError", "DraftPlan", "FrozenDraftError", "entries_to_json"]
