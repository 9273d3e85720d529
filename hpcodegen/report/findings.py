"""Identical findings, folded: the same problem at several places prints once, with its
count and every other place. Every verb's text output folds the same way (verify's
reporter, inspect-plan's findings); ``--json`` and JUnit keep each finding.

Two findings are identical when everything but their location (``where``) agrees: code,
severity, message, ``expected``, hint and file.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from hpcodegen.errors import Finding


def _identity(f: Finding) -> tuple[object, ...]:
    return (f.severity, f.code, f.message, f.expected, f.hint, f.file)


def fold_identical(findings: Iterable[Finding]) -> list[list[Finding]]:
    """``findings`` grouped by identity, in order of first occurrence."""
    groups: dict[tuple[object, ...], list[Finding]] = {}
    for f in findings:
        groups.setdefault(_identity(f), []).append(f)
    return list(groups.values())


def count_note(group: list[Finding]) -> str:
    """``(N identical) `` before a group's first finding; empty for a single one."""
    return f"({len(group)} identical) " if len(group) > 1 else ""


def also_at(group: list[Finding]) -> str | None:
    """``also at <where>, <where>`` for a group's other places; None when there are none."""
    others: list[str] = []
    for f in group[1:]:
        if f.where and f.where != group[0].where and f.where not in others:
            others.append(f.where)
    return f"also at {', '.join(others)}" if others else None


def plain_lines(findings: Iterable[Finding], head: Callable[[Finding], str]) -> Iterator[str]:
    """One line per group for plain-text output (fold each to the width): ``head(finding)``,
    the count, the rendered finding; then ``  also at ...`` when it occurs elsewhere too."""
    for group in fold_identical(findings):
        yield f"{head(group[0])}{count_note(group)}{group[0].render()}"
        others = also_at(group)
        if others:
            yield f"  {others}"


__all__ = ["also_at", "count_note", "fold_identical", "plain_lines"]
