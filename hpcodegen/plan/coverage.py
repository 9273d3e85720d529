"""Which trainable parameters a plan covers (pure; the one rule generate and verify apply).

Per the reference: every trainable parameter, deduplicated by identity (a tied weight counts
once, under its first name), must equal a planned key or start with a planned key plus
``"."``. ``generate`` refuses a plan that leaves one uncovered; verify's ``model`` check reports
it. The model is only asked for ``named_parameters()``; nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any

from hpcodegen.plan.entry import join_fqn


def is_covered(name: str, planned: Collection[str]) -> bool:
    """``name`` equals a planned key or lies below one (``key + "."`` is a prefix of it)."""
    parts = name.split(".")
    return any(".".join(parts[:i]) in planned for i in range(1, len(parts) + 1))


def trainable_names(model: Any) -> list[str]:
    """Names of the trainable parameters, deduplicated by identity (first name kept)."""
    return [name for name, p in model.named_parameters() if p.requires_grad]


def uncovered(names: Iterable[str], planned: Iterable[str]) -> list[str]:
    """The names (in order) that no planned key covers."""
    keys = set(planned)
    return [name for name in names if not is_covered(name, keys)]


def params_planned_twice(plan: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """``(param_fqn, first entry FQN, second entry FQN)`` for each parameter two entries plan.

    ``{"a": {"params": {"b.weight": ...}}}`` and ``{"a.b": {"params": {"weight": ...}}}`` name
    the same parameter; which placement would win is undefined, so both generate and verify
    refuse it. An entry is a :class:`~hpcodegen.plan.types.PlanEntry` (generate's draft)
    or its JSON object (verify reads a meta that may not parse).
    """
    owner: dict[str, str] = {}
    twice: list[tuple[str, str, str]] = []
    for fqn, entry in plan.items():  # JSON's dicts skip the Mapping ABC check (per entry)
        params = entry.get("params") if type(entry) is dict or isinstance(entry, Mapping) \
            else getattr(entry, "params", None)
        for rel in params if type(params) is dict or isinstance(params, Mapping) else ():
            full = join_fqn(fqn, rel)
            if full in owner:
                twice.append((full, owner[full], fqn))
            else:
                owner[full] = fqn
    return twice
