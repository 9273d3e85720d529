"""The codec's tolerant half: a meta the schema rejects, decoded leaf by leaf (pure).

:func:`hpcodegen.plan.codec.plan_from_meta` refuses a meta at its first bad value, and
:func:`~hpcodegen.plan.codec.readable_plan` leaves a refused entry out whole. verify's
``plan`` check reports on such a meta field by field, so it needs more: every value that
decodes, and each one that does not, named. :func:`~hpcodegen.plan.codec.plan_from_meta`
with ``refused=[]`` gives that: a
:class:`~hpcodegen.plan.types.Plan` of everything that decodes plus one :class:`Refusal`
per refused leaf (a placement outside the grammar, a number among FQNs, an entry that is
no object), each with its JSON path, the value found there and what the Plan lacks for it.

A meta the strict codec accepts costs one strict parse (the refusals are empty). The
tolerant walk decodes each container leaf by leaf: ``param_plan`` entries and their
fields, named placements, string arrays and maps, ``tied_pairs``, ``injections`` and
``parallel_dims``; any other field (``pipeline``, the provenance records) is refused whole
at its first bad value. A named placement whose value is no object keeps its name with no
placements (the name is planned; its placements are refused).

:meth:`DecodedMeta.members` and :meth:`DecodedMeta.items` walk a decoded object or array
with its refused members back where they stood, so a rule reports in the meta's order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from hpcodegen.errors import pointer
from hpcodegen.plan import codec
from hpcodegen.plan.codec import JsonPath, PlanFormatError, Table
from hpcodegen.plan.frozen import FrozenMap, freeze_json
from hpcodegen.plan.provenance import Provenance
from hpcodegen.plan.types import Injection, ParallelDims, Plan, PlanEntry

__all__ = ["DecodedMeta", "Refusal", "entry_json", "tolerant_plan"]


@dataclass(frozen=True, slots=True)
class Refusal:
    """One value the codec refused."""

    path: JsonPath
    """Where the bad value is (keys and indices)."""
    message: str
    """What was expected there and what was found (the strict codec's words)."""
    value: Any
    """The JSON found at ``left_out`` (at ``path`` when nothing was left out), as found."""
    left_out: JsonPath | None
    """What the decoded Plan lacks for it (``path`` or a container above it); None: the
    member stays, emptied (a named placement that is no object keeps its name)."""
    index: int | None = None
    """``left_out``'s position among its object's members (arrays: the path's index)."""

    @property
    def where(self) -> str:
        """The JSON pointer of ``path``."""
        return pointer(*self.path)


@dataclass(frozen=True)
class DecodedMeta:
    """A meta's :class:`Plan` of every value that decodes, and what was refused.

    Example::

        refused = []
        plan = plan_from_meta({"param_plan": {"a": {"params": {"w": {"tp": "S(x)"}}}}},
                              refused=refused)
        decoded = DecodedMeta(plan, tuple(refused))
        decoded.plan.param_plan["a"].params["w"]      # {} (the leaf was refused)
        decoded.refused[0].where                      # /param_plan/a/params/w/tp
    """

    plan: Plan
    refused: tuple[Refusal, ...] = ()

    @cached_property
    def _by_parent(self) -> dict[JsonPath, list[Refusal]]:
        out: dict[JsonPath, list[Refusal]] = {}
        for r in self.refused:
            if r.left_out:
                out.setdefault(r.left_out[:-1], []).append(r)
        return out

    @cached_property
    def refused_entries(self) -> frozenset[str]:
        """FQNs of the ``param_plan`` entries something under which was refused."""
        return frozenset(r.path[1] for r in self.refused
                         if len(r.path) > 2 and r.path[0] == "param_plan")

    def members(self, path: JsonPath, decoded: Mapping[str, Any] | None
                ) -> Iterator[tuple[str, Any]]:
        """``(key, value)`` of the object at ``path`` in the meta's order: ``decoded``'s
        members with each member left out there back as its :class:`Refusal`."""
        dropped = self._by_parent.get(path) if self.refused else None
        if not dropped:
            yield from (decoded or {}).items()
            return
        at = {r.index: r for r in dropped if r.index is not None}
        kept = iter((decoded or {}).items())
        for pos in range(len(decoded or {}) + len(at)):
            refusal = at.get(pos)
            yield (refusal.left_out[-1], refusal) if refusal is not None else next(kept)

    def items(self, path: JsonPath, decoded: Sequence[Any] | None
              ) -> Iterator[tuple[int, Any]]:
        """``(index, value)`` of the array at ``path``, refused items back as their
        :class:`Refusal` (so each keeps its index in the meta)."""
        dropped = self._by_parent.get(path) if self.refused else None
        if not dropped:
            yield from enumerate(decoded or ())
            return
        at = {r.left_out[-1]: r for r in dropped}
        kept = iter(decoded or ())
        for i in range(len(decoded or ()) + len(at)):
            yield i, at[i] if i in at else next(kept)

    def values(self, path: JsonPath, decoded: Sequence[Any] | None) -> list[Any]:
        """The array at ``path`` as the meta holds it (refused items as found)."""
        return [v.value if isinstance(v, Refusal) else v for _, v in self.items(path, decoded)]


def tolerant_plan(document: Any, refused: list[Any]) -> Plan:
    """The tolerant walk of :func:`~hpcodegen.plan.codec.plan_from_meta` (its ``refused``
    branch, for a meta the strict parse refused): the Plan of every value that decodes;
    each :class:`Refusal` is appended to ``refused`` in the meta's order."""
    walk = _Tolerant()
    plan = walk.plan(document)
    refused.extend(walk.refused)
    return plan


def entry_json(decoded: DecodedMeta, fqn: str) -> dict[str, Any]:
    """The ``param_plan`` entry ``fqn`` as the meta writes it, refused values put back
    (the contract rule compares two entries as JSON; a refused value differs from any other)."""
    out = codec.entry_to_json(decoded.plan.param_plan[fqn])  # type: ignore[index]
    if fqn not in decoded.refused_entries:
        return out
    for r in decoded.refused:  # in the meta's order: an array's items go back ascending
        if r.path[:2] != ("param_plan", fqn) or len(r.left_out or r.path) < 3:
            continue
        target = r.path if r.left_out is None else r.left_out
        parent: Any = out
        for key in target[2:-1]:
            parent = parent[key]
        if isinstance(parent, list):
            parent.insert(target[-1], r.value)
        else:
            parent[target[-1]] = r.value
    return out


class _Tolerant:
    """One tolerant walk; :attr:`refused` collects every refusal in the meta's order."""

    def __init__(self) -> None:
        self.refused: list[Refusal] = []
        self.parsers: dict[Any, Callable[[Any, JsonPath], Any]] = {
            codec._named_map: self.named_map, codec._strs: self.strs,
            codec._str_map: self.str_map, codec._match: self.match, codec._pairs: self.pairs,
            codec._dims: self.dims, codec._injections: self.injections,
            codec._entries: self.entries}

    def refuse(self, path: JsonPath, message: str, value: Any,
               left_out: JsonPath | None, index: int | None = None) -> None:
        self.refused.append(Refusal(tuple(path), message, value, left_out, index))

    def read(self, table: Table, value: Any, where: JsonPath) -> dict[str, Any]:
        """:func:`codec._read` that refuses a bad field alone (its leaves alone where
        the field is a container decoded leaf by leaf)."""
        out: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for pos, (key, item) in enumerate(value.items()):
            spec = table.get(key)
            if spec is None or item is None:
                extra[key] = freeze_json(item)
                continue
            parse = self.parsers.get(spec[1], spec[1])
            try:
                out[spec[0]] = parse(item, (*where, key))
            except PlanFormatError as exc:
                self.refuse(exc.path, exc.message, item, (*where, key), pos)
        return {**out, "extra": FrozenMap.adopt(extra)}

    def plan(self, document: Any) -> Plan:
        if not isinstance(document, Mapping):
            self.refuse((), f"expected an object, got {type(document).__name__}", document,
                        ())
            return Plan()
        kept = {k: v for k, v in document.items()
                if k in codec._PROVENANCE and v is not None}
        own = {k: v for k, v in document.items() if k not in kept}
        fields = self.read(codec._PROVENANCE, kept, ())
        del fields["extra"]
        return Plan(provenance=Provenance(**fields), **self.read(codec._PLAN, own, ()))

    def named_map(self, value: Any, where: JsonPath) -> FrozenMap[str, Any]:
        out: dict[str, Any] = {}
        for name, named in codec._object(value, where).items():
            path = (*where, name)
            if not isinstance(named, Mapping):
                self.refuse(path, f"expected an object, got {type(named).__name__}", named,
                            None)
                out[name] = FrozenMap()
                continue
            leaves = {}
            for pos, (axis, text) in enumerate(named.items()):
                try:
                    leaves[axis] = codec._placement(text, (*path, axis))
                except PlanFormatError as exc:
                    self.refuse(exc.path, exc.message, text, exc.path, pos)
            out[name] = FrozenMap.adopt(leaves)
        return FrozenMap.adopt(out)

    def strs(self, value: Any, where: JsonPath) -> tuple[str, ...]:
        codec._expect(value, list, where, "an array of strings")
        out = []
        for i, item in enumerate(value):
            if isinstance(item, str):
                out.append(item)
            else:
                path = (*where, i)
                self.refuse(path, f"expected a string, got {type(item).__name__}", item, path)
        return tuple(out)

    def str_map(self, value: Any, where: JsonPath) -> FrozenMap[str, str]:
        out = {}
        for pos, (key, item) in enumerate(codec._object(value, where).items()):
            if isinstance(item, str):
                out[key] = item
            else:
                path = (*where, key)
                self.refuse(path, f"expected a string, got {type(item).__name__}", item,
                            path, pos)
        return FrozenMap.adopt(out)

    def match(self, value: Any, where: JsonPath) -> str | tuple[str, ...]:
        return value if isinstance(value, str) else self.strs(value, where)

    def pairs(self, value: Any, where: JsonPath) -> tuple[tuple[str, str], ...]:
        out = []
        for i, pair in enumerate(codec._expect(value, list, where, "an array of pairs")):
            path = (*where, i)
            if not isinstance(pair, list):
                self.refuse(path, "expected an array of strings, got "
                            f"{type(pair).__name__}", pair, path)
                continue
            before = len(self.refused)
            names = self.strs(pair, path)
            if len(self.refused) > before or len(names) != 2:
                self.refuse(path, f"expected 2 FQNs, got {len(pair)}", pair, path)
            else:
                out.append((names[0], names[1]))
        return tuple(out)

    def dims(self, value: Any, where: JsonPath) -> ParallelDims:
        sizes: dict[str, int] = {}
        flags: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for pos, (key, item) in enumerate(codec._object(value, where).items()):
            try:
                if key.endswith("_size") and isinstance(item, int) \
                        and not isinstance(item, bool):
                    sizes[key[: -len("_size")]] = item
                elif key in ("sequence_parallel", "loss_parallel") and item is not None:
                    flags[key] = codec._bool(item, (*where, key))
                elif key == "cp_layout" and item is not None:
                    flags[key] = codec._str(item, (*where, key))
                else:
                    extra[key] = freeze_json(item)
            except PlanFormatError as exc:
                self.refuse(exc.path, exc.message, item, exc.path, pos)
        return ParallelDims(sizes=FrozenMap(sizes), extra=FrozenMap.adopt(extra), **flags)

    def entries(self, value: Any, where: JsonPath) -> FrozenMap[str, PlanEntry]:
        out = {}
        for pos, (fqn, entry) in enumerate(codec._object(value, where).items()):
            path = (*where, fqn)
            if isinstance(entry, Mapping):
                out[fqn] = PlanEntry(fqn=fqn, **self.read(codec._ENTRY, entry, path))
            else:
                self.refuse(path, f"expected an object, got {type(entry).__name__}", entry,
                            path, pos)
        return FrozenMap.adopt(out)

    def injections(self, value: Any, where: JsonPath) -> tuple[Injection, ...]:
        out = []
        for i, record in enumerate(codec._expect(value, list, where,
                                                 "an array of injection records")):
            path = (*where, i)
            if not isinstance(record, Mapping):
                self.refuse(path, f"expected an object, got {type(record).__name__}", record,
                            path)
                continue
            fields = self.read(codec._INJECTION, record, path)
            missing = [f.name for f in dataclasses.fields(Injection)
                       if f.name not in fields and f.default is dataclasses.MISSING
                       and f.default_factory is dataclasses.MISSING]
            if missing:
                self.refuse((*path, missing[0]), f"{missing[0]} is required (the record "
                            "is left out)", record, path)
            else:
                out.append(Injection(**fields))
        return tuple(out)
