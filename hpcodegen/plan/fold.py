"""Fold repeated layers into one row: ``model.layers.{0..31}.self_attn x32`` (pure).

Two boundaries fold together when their FQNs differ only in integer path components (layer
and expert indices, written without leading zeros) and everything a row shows is identical
(class, form, ops, notes). When the indices of a group fill a full grid (every layer x every
expert) the group is one row with a range per varying position; otherwise it is split on its
first varying index until it does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from hpcodegen.plan.predict import BoundaryPrediction


@dataclass(frozen=True)
class Row:
    """One line of the boundary table: a representative prediction and the FQNs it stands for."""

    label: str
    fqns: tuple[str, ...]
    pred: BoundaryPrediction

    @property
    def count(self) -> int:
        return len(self.fqns)

    @property
    def folded(self) -> bool:
        return len(self.fqns) > 1


def format_ranges(values: Sequence[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``"0..2,5,7..8"``."""
    values = sorted(set(values))
    spans: list[str] = []
    start = prev = values[0]
    for v in [*values[1:], None]:
        if v is not None and v == prev + 1:
            prev = v
            continue
        spans.append(str(start) if start == prev else f"{start}..{prev}")
        if v is not None:
            start = prev = v
    return ",".join(spans)


Member = tuple[tuple[int, ...], BoundaryPrediction]


def _label(template: tuple[str | None, ...], members: Sequence[Member]) -> str:
    parts: list[str] = []
    k = 0
    for part in template:
        if part is not None:
            parts.append(part)
            continue
        values = sorted({idx[k] for idx, _ in members})
        parts.append(str(values[0]) if len(values) == 1 else "{" + format_ranges(values) + "}")
        k += 1
    return ".".join(parts)


def _fold_group(template: tuple[str | None, ...], members: list[Member]) -> list[Row]:
    npos = len(members[0][0])
    distinct = [sorted({idx[k] for idx, _ in members}) for k in range(npos)]
    if math.prod(len(d) for d in distinct) == len(members):
        fqns = tuple(p.fqn for _, p in members)
        return [Row(_label(template, members) if len(members) > 1 else members[0][1].fqn,
                    fqns, members[0][1])]
    k = next(i for i, d in enumerate(distinct) if len(d) > 1)
    rows: list[Row] = []
    for value in distinct[k]:
        rows.extend(_fold_group(template, [m for m in members if m[0][k] == value]))
    return rows


def fold(preds: Sequence[BoundaryPrediction], expand: bool = False) -> list[Row]:
    """Group predictions into table rows, in plan order of each group's first member.

    Args:
        preds: one prediction per boundary (plan order).
        expand: one row per boundary, no folding (``--expand``).
    """
    if expand:
        return [Row(p.fqn, (p.fqn,), p) for p in preds]
    groups: dict[tuple[object, ...], tuple[tuple[str | None, ...], list[Member]]] = {}
    for p in preds:
        parts = p.fqn.split(".") if p.fqn else [""]
        marks = [x.isdigit() and x.isascii() and (x == "0" or x[0] != "0") for x in parts]
        template = tuple(None if m else x for x, m in zip(parts, marks, strict=True))
        idx = tuple(int(x) for x, m in zip(parts, marks, strict=True) if m)
        key = (template, p.signature())
        groups.setdefault(key, (template, []))[1].append((idx, p))
    rows: list[Row] = []
    for template, members in groups.values():
        rows.extend(_fold_group(template, members))
    return rows
