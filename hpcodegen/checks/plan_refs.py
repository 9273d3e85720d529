"""Cross references of a frozen plan: every name another field uses must be planned.

``boundary_classes`` FQNs, injection ``match`` FQNs, ``special_handlers`` keys, both sides of
``tied_pairs``, ``frozen_sharded_params`` and each entry's ``deferred_bias_params`` /
``partial_grad_params`` must agree with ``param_plan``; every FQN of one class the modeling
file defines must carry the same contract (the generated class has one forward for all of
them; a class the file does not define, as ``nn.Linear``, is wrapped per instance); a
row-sharded ``*Embedding`` must reduce its partial lookup itself (:mod:`hpcodegen.plan.vocab`).
A ``module_overrides`` record must select something (``fqns``, ``fqn`` or ``match``), and no
module is replaced twice (which record wins is undefined); whether the modules exist is the
``model`` check's question.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Iterator, Mapping
from typing import Any

from hpcodegen.checks.context import (
    CheckContext,
    as_dict,
    as_list,
    plan_entries,
    planned_params,
    pointer,
)
from hpcodegen.checks.files import escapes, modeling_files
from hpcodegen.checks.forms import classified
from hpcodegen.errors import Finding, error, warning
from hpcodegen.placement import Partial, Shard, StridedShard, parse_placement
from hpcodegen.plan.entry import contract_differences, join_fqn, takes_token_ids
from hpcodegen.plan.overrides import read_overrides
from hpcodegen.plan.types import Plan
from hpcodegen.plan.vocab import vocab_parallel_findings

MAX_SCAN_BYTES = 32 * 1024 * 1024


def file_classes(ctx: CheckContext) -> set[str] | None:
    """Names of the top-level classes the modeling file defines (read with ``ast``, never
    imported); None when it cannot be read (the source check reports why)."""
    if ctx.loaded.bare:  # a meta alone: its folder is not read
        return None
    if "file_classes" not in ctx.cache:
        found = modeling_files(ctx.artifact_dir)
        names: set[str] | None = None
        if len(found) == 1 and not escapes(ctx.artifact_dir, found[0]):
            try:
                if found[0].stat().st_size <= MAX_SCAN_BYTES:
                    tree = ast.parse(found[0].read_bytes().decode("utf-8"))
                    names = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
            except (OSError, UnicodeDecodeError, SyntaxError, ValueError, RecursionError):
                names = None
        ctx.cache["file_classes"] = names
    return ctx.cache["file_classes"]


def _boundary_classes(ctx: CheckContext) -> Iterator[Finding]:
    plan = plan_entries(ctx.meta.get("param_plan"))
    classes = as_dict(ctx.meta.get("boundary_classes"))
    defined = file_classes(ctx)
    first_of: dict[str, str] = {}
    for fqn, cls in classes.items():
        if not isinstance(cls, str):
            continue  # a schema error
        if fqn not in plan:
            yield error("plan.boundary_class_unplanned", pointer("boundary_classes", fqn),
                        f"boundary {fqn!r} ({cls}) has no param_plan entry")
            continue
        if defined is not None and cls not in defined:
            continue  # wrapped per instance: each FQN keeps its own transitions
        if cls in first_of:
            other = first_of[cls]
            if plan[fqn] != plan[other] and contract_differences(plan[fqn], plan[other]):
                yield error("plan.class_contract_differs", pointer("param_plan", fqn),
                            f"{fqn} and {other} are both {cls} but declare different "
                            "transitions; one generated class cannot serve both",
                            hint="give them the same in/out placements")
        else:
            first_of[cls] = fqn
    forms = classified(ctx) or {}
    for fqn, form in forms.items():
        if form.form not in ("identity", "params") and fqn not in classes:
            yield warning("plan.boundary_without_class", pointer("param_plan", fqn),
                          f"{fqn} is a {form.form} boundary but boundary_classes does not name "
                          "its class", hint="regenerate the artifact")


def _injections(records: Any, plan: Mapping[str, Any]) -> Iterator[Finding]:
    seen: dict[str, str] = {}
    for i, record in enumerate(as_list(records)):
        match = as_dict(record).get("match")
        if isinstance(match, str):
            targets = [(pointer("injections", i, "match"), match)]
        else:
            targets = [(pointer("injections", i, "match", j), m)
                       for j, m in enumerate(as_list(match)) if isinstance(m, str)]
        for where, fqn in targets:
            if fqn not in plan:
                yield error("plan.injection_unplanned", where,
                            f"injection matches {fqn!r}, which has no param_plan entry")
            elif fqn in seen:
                yield error("plan.injection_duplicate", where,
                            f"{fqn!r} is matched by two injections (also {seen[fqn]})")
            seen.setdefault(fqn, where)


def _special_handlers(handlers: Any, params: Mapping[str, Any],
                      plan: Mapping[str, Any]) -> Iterator[Finding]:
    for key in as_dict(handlers):
        module = key.rpartition(".")[0]
        if key not in params and module not in plan:
            yield error("plan.special_handler_unplanned", pointer("special_handlers", key),
                        f"special handler target {key!r} is neither a planned parameter nor a "
                        "parameter of a planned module")


def _tied_pairs(pairs: Any, params: Mapping[str, Any]) -> Iterator[Finding]:
    for i, pair in enumerate(as_list(pairs)):
        pair = as_list(pair)
        for j, fqn in enumerate(pair):
            if isinstance(fqn, str) and fqn not in params:
                yield error("plan.tied_unplanned", pointer("tied_pairs", i, j),
                            f"tied parameter {fqn!r} is not in param_plan")
        if len(pair) != 2 or not all(isinstance(p, str) and p in params for p in pair):
            continue
        if pair[0] == pair[1]:
            yield error("plan.tied_self", pointer("tied_pairs", i),
                        f"{pair[0]!r} is tied to itself")
        elif dict(params[pair[0]][2]) != dict(params[pair[1]][2]):
            # the runtime makes both names one parameter object (one local shard): it
            # refuses a pair planned two ways, so the gate does too
            yield error("plan.tied_placements_differ", pointer("tied_pairs", i, 1),
                        f"{pair[1]} shares {pair[0]}'s local storage but is planned with "
                        "other placements (tied parameters are one tensor: one placement)",
                        expected=json.dumps(dict(params[pair[0]][2])))


def _is_sharded(named: Mapping[str, Any]) -> bool:
    for text in named.values():
        try:
            if isinstance(parse_placement(text), (Shard, StridedShard, Partial)):
                return True
        except ValueError:
            continue
    return False


def _sharded_params(params: Mapping[str, Any]) -> set[str]:
    """The planned parameters some placement of which is not ``R`` (:func:`_is_sharded`,
    judged once per distinct named placement: a plan repeats a handful)."""
    verdicts: dict[Any, bool] = {}
    out: set[str] = set()
    for fqn, (_entry, _rel, named) in params.items():
        try:
            key: Any = tuple(named.items())
            sharded = verdicts.get(key)
        except TypeError:  # an unhashable placement (a schema error): judged each time
            key, sharded = None, None
        if sharded is None:
            sharded = _is_sharded(named)
            if key is not None:
                verdicts[key] = sharded
        if sharded:
            out.add(fqn)
    return out


def _frozen_sharded(listed: Any, params: Mapping[str, Any]) -> Iterator[Finding]:
    if not isinstance(listed, list):
        return
    listed_set = {f for f in listed if isinstance(f, str)}
    sharded = _sharded_params(params)
    for i, fqn in enumerate(listed):
        if not isinstance(fqn, str) or fqn in sharded:
            continue
        if fqn not in params:
            yield error("plan.frozen_sharded_unplanned", pointer("frozen_sharded_params", i),
                        f"{fqn!r} is listed as sharded but is not in param_plan")
        else:
            yield warning("plan.frozen_sharded_replicated", pointer("frozen_sharded_params", i),
                          f"{fqn!r} is listed as sharded but every placement is R")
    missing = sharded - listed_set
    for fqn, (entry, rel, _named) in params.items() if missing else ():
        if fqn not in missing:
            continue
        yield warning("plan.frozen_sharded_missing", pointer("param_plan", entry, "params", rel),
                      f"{fqn} is sharded but not listed in frozen_sharded_params")


_PARAM_LISTS = ("deferred_bias_params", "partial_grad_params", "tp_rank0_params")
_LIST_KEYS = frozenset((*_PARAM_LISTS, "no_grad_inputs"))


def _entry_param_lists(entries: Mapping[str, Mapping[str, Any]],
                       params: Mapping[str, Any]) -> Iterator[Finding]:
    for fqn, entry in entries.items():
        if entry.keys().isdisjoint(_LIST_KEYS):
            continue  # names none (most entries: one C-level set test)
        for key in _PARAM_LISTS:
            for i, rel in enumerate(as_list(entry.get(key))):
                if not isinstance(rel, str):
                    continue
                full = join_fqn(fqn, rel)
                if full not in params:
                    yield error(f"plan.{key}_unplanned", pointer("param_plan", fqn, key, i),
                                f"{full} is not a planned parameter",
                                hint="paths are relative to the entry, e.g. o_proj.bias")
                elif params[full][0] != fqn:
                    owner = params[full][0] or "<root>"
                    yield error(f"plan.{key}_other_entry", pointer("param_plan", fqn, key, i),
                                f"{full} is planned in entry {owner}, not in {fqn or '<root>'}:"
                                " an entry names only its own parameters (what it says of "
                                "them follows from its own compute; the runtime would act on "
                                "it regardless)", expected=f"a key of {fqn or '<root>'}'s params",
                                hint=f"move it to {owner}'s {key}")
        no_grad = as_list(entry.get("no_grad_inputs"))
        declared = set(as_dict(entry.get("in_src"))) | set(as_dict(entry.get("in_dst"))) \
            if no_grad else set()
        for i, name in enumerate(no_grad):
            if isinstance(name, str) and name not in declared:
                yield error("plan.no_grad_inputs_undeclared",
                            pointer("param_plan", fqn, "no_grad_inputs", i),
                            f"{name!r} is not an input of {fqn} (in_src / in_dst)")


def _overrides(plan: Plan) -> Iterator[Finding]:
    first: dict[str, int] = {}
    for override in read_overrides(plan):
        if not override.fqns and not override.globs:
            yield warning("plan.override_selects_nothing", override.where, "this module_overrides "
                          "record names no module (no fqns, fqn or match); it replaces nothing")
        for fqn in override.fqns:
            if fqn in first and first[fqn] != override.index:
                yield warning("plan.override_duplicate", override.where, f"{fqn} is replaced "
                              f"by module_overrides[{first[fqn]}] and again here; which one the "
                              "runtime applies is undefined", hint="regenerate the artifact")
            first.setdefault(fqn, override.index)


def check_references(ctx: CheckContext) -> Iterator[Finding]:
    """All cross-reference rules of the module docstring. They judge the JSON as it is (a
    meta the schema rejects still gets them, field by field): the meta is read here once and
    each rule gets the field it judges."""
    meta = ctx.meta
    plan = plan_entries(meta.get("param_plan"))
    params = planned_params(plan)
    yield from _boundary_classes(ctx)
    yield from _injections(meta.get("injections"), plan)
    yield from _special_handlers(meta.get("special_handlers"), params, plan)
    yield from _tied_pairs(meta.get("tied_pairs"), params)
    yield from _frozen_sharded(meta.get("frozen_sharded_params"), params)
    yield from _entry_param_lists(plan, params)
    yield from _overrides(ctx.plan)
    yield from vocab_parallel_findings(ctx.plan, _named_embeddings(ctx.plan), "plan")


def _named_embeddings(plan: Plan) -> list[str]:
    """Boundaries whose class is a token embedding by name (the runtime's rule)."""
    return [fqn for fqn, cls in (plan.boundary_classes or {}).items() if takes_token_ids(cls)]
