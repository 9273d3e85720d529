"""Injection ``_target_`` resolution through an allowlist (never an arbitrary import).

A frozen plan may name callables (``local_compute_fn``, ``inner_wrapper``) by dotted path.
Importing whatever a JSON file names would run foreign code, and the existing system's
factories (``hyper_parallel.*``) do not exist here; so a path resolves only when it starts
with ``hpcodegen.`` or a prefix the caller allows, or when a Python entry point of group
``hpcodegen.injection_targets`` is named by it. Anything else is a PlanError naming it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from importlib.metadata import entry_points
from typing import Any

from hpcodegen.errors import PlanError, error
from hpcodegen.plan.entry import INJECTED_CALLABLES

ENTRY_POINT_GROUP = "hpcodegen.injection_targets"
BUILTIN_PREFIXES: tuple[str, ...] = ("hpcodegen.",)
INJECTION_KEYS: tuple[str, ...] = INJECTED_CALLABLES


def _allowed(path: str, prefixes: Iterable[str]) -> bool:
    for prefix in (*BUILTIN_PREFIXES, *prefixes):
        bare = prefix.rstrip(".")
        if path == bare or path.startswith(bare + "."):
            return True
    return False


def _entry_point(path: str) -> Any:
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if path in (ep.name, ep.value.replace(":", ".")):
            return ep.load()
    return None


def resolve_target(path: Any, prefixes: Iterable[str], where: str) -> Callable[..., Any]:
    """The callable a ``_target_`` names; PlanError when foreign, missing or not callable."""
    if not isinstance(path, str) or "." not in path:
        raise PlanError([error("runtime.bad_target", where,
                               f"_target_ {path!r} is not a dotted path")])
    found = _entry_point(path)
    if found is None:
        if not _allowed(path, prefixes):
            raise PlanError([error(
                "runtime.foreign_target", where,
                f"injection target {path!r} is outside the allowlist",
                expected="a path under hpcodegen. or allowed_target_prefixes, or an entry "
                         f"point in group {ENTRY_POINT_GROUP}",
                hint=f"pass allowed_target_prefixes=({path.rsplit('.', 1)[0]!r},) "
                     "if you trust it")])
        module_name, _, attr = path.rpartition(".")
        try:
            found = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise PlanError([error("runtime.missing_target", where,
                                   f"cannot import {path!r}: {exc}")]) from None
    if not callable(found):
        raise PlanError([error("runtime.bad_target", where, f"{path!r} is not callable")])
    return found


def resolve_injections(injections: Mapping[str, Mapping[str, Any]],
                       prefixes: Iterable[str]) -> dict[str, dict[str, tuple[Callable, dict]]]:
    """``{fqn: {key: (factory, kwargs)}}`` for every injection target, all resolved up front."""
    prefixes = tuple(prefixes)
    out: dict[str, dict[str, tuple[Callable, dict]]] = {}
    for fqn, record in injections.items():
        for key in INJECTION_KEYS:
            value = record.get(key)
            if value is None:
                continue
            where = f"injections[{fqn}].{key}"
            if isinstance(value, Mapping):
                kwargs = {k: v for k, v in value.items() if k != "_target_"}
                factory = resolve_target(value.get("_target_"), prefixes, where)
            else:
                kwargs, factory = {}, resolve_target(value, prefixes, where)
            out.setdefault(fqn, {})[key] = (factory, kwargs)
    return out
