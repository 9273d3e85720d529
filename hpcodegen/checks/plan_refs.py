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
import dataclasses
import json
from collections.abc import Iterator, Mapping
from typing import Any

from hpcodegen.checks.context import CheckContext, pointer
from hpcodegen.checks.forms import classified
from hpcodegen.checks.source import read_modeling_tree
from hpcodegen.errors import Finding, error, warning
from hpcodegen.placement import Partial, Shard, StridedShard
from hpcodegen.plan.decode import DecodedMeta, Refusal, entry_json
from hpcodegen.plan.entry import contract_differences, join_fqn, takes_token_ids
from hpcodegen.plan.overrides import read_overrides
from hpcodegen.plan.types import NamedPlacement, Plan, PlanEntry
from hpcodegen.plan.vocab import vocab_parallel_findings


def file_classes(ctx: CheckContext) -> set[str] | None:
    """Names of the top-level classes the modeling file defines (read with ``ast``, never
    imported); None when it cannot be read (the source check reports why). The tree is the
    source check's own parse (:func:`hpcodegen.checks.source.read_modeling_tree`, made once
    per artifact), so both checks judge the same bytes by one reading rule."""
    if ctx.loaded.bare:  # a meta alone: its folder is not read
        return None
    if "file_classes" not in ctx.cache:
        tree, _, _ = read_modeling_tree(ctx)
        ctx.cache["file_classes"] = (None if tree is None else
                                     {n.name for n in tree.body if isinstance(n, ast.ClassDef)})
    return ctx.cache["file_classes"]


def _boundary_classes(ctx: CheckContext) -> Iterator[Finding]:
    decoded = ctx.decoded
    plan = decoded.plan.param_plan or {}
    classes = decoded.plan.boundary_classes or {}  # a class that is no string: a schema error
    named = {fqn for fqn, _cls in decoded.members(("boundary_classes",),
                                                  decoded.plan.boundary_classes)}
    defined = file_classes(ctx)
    first_of: dict[str, str] = {}
    for fqn, cls in classes.items():
        if fqn not in plan:
            yield error("plan.boundary_class_unplanned", pointer("boundary_classes", fqn),
                        f"boundary {fqn!r} ({cls}) has no param_plan entry")
            continue
        if defined is not None and cls not in defined:
            continue  # wrapped per instance: each FQN keeps its own transitions
        if cls in first_of:
            other = first_of[cls]
            if _contract_differs(decoded, fqn, other):
                yield error("plan.class_contract_differs", pointer("param_plan", fqn),
                            f"{fqn} and {other} are both {cls} but declare different "
                            "transitions; one generated class cannot serve both",
                            hint="give them the same in/out placements")
        else:
            first_of[cls] = fqn
    forms = classified(ctx) or {}
    for fqn, form in forms.items():
        if form.form not in ("identity", "params") and fqn not in named:
            yield warning("plan.boundary_without_class", pointer("param_plan", fqn),
                          f"{fqn} is a {form.form} boundary but boundary_classes does not name "
                          "its class", hint="regenerate the artifact")


def _contract_differs(decoded: DecodedMeta, fqn: str, other: str) -> bool:
    """:func:`contract_differences` of two entries, as JSON only when some field differs
    (the entries of a repeated layer share their decoded fields)."""
    plan = decoded.plan.param_plan or {}
    a, b = plan[fqn], plan[other]
    if fqn not in decoded.refused_entries and other not in decoded.refused_entries and all(
            getattr(a, f) is getattr(b, f) or getattr(a, f) == getattr(b, f)
            for f in _ENTRY_FIELDS):
        return False
    return bool(contract_differences(entry_json(decoded, fqn), entry_json(decoded, other)))


#: every PlanEntry field but its FQN (what two entries of one class may share)
_ENTRY_FIELDS = tuple(f.name for f in dataclasses.fields(PlanEntry) if f.name != "fqn")


def _injections(decoded: DecodedMeta) -> Iterator[Finding]:
    plan = decoded.plan.param_plan or {}
    seen: dict[str, str] = {}
    for i, record in decoded.items(("injections",), decoded.plan.injections):
        if isinstance(record, Refusal):
            continue  # no record, or no match (a schema error)
        if isinstance(record.match, str):
            targets = [(pointer("injections", i, "match"), record.match)]
        else:
            targets = [(pointer("injections", i, "match", j), m) for j, m in
                       decoded.items(("injections", i, "match"), record.match)
                       if not isinstance(m, Refusal)]
        for where, fqn in targets:
            if fqn not in plan:
                yield error("plan.injection_unplanned", where,
                            f"injection matches {fqn!r}, which has no param_plan entry")
            elif fqn in seen:
                yield error("plan.injection_duplicate", where,
                            f"{fqn!r} is matched by two injections (also {seen[fqn]})")
            seen.setdefault(fqn, where)


def _special_handlers(decoded: DecodedMeta, params: Mapping[str, Any],
                      plan: Mapping[str, Any]) -> Iterator[Finding]:
    for key, _handler in decoded.members(("special_handlers",), decoded.plan.special_handlers):
        module = key.rpartition(".")[0]
        if key not in params and module not in plan:
            yield error("plan.special_handler_unplanned", pointer("special_handlers", key),
                        f"special handler target {key!r} is neither a planned parameter nor a "
                        "parameter of a planned module")


def _tied_pairs(decoded: DecodedMeta, params: Mapping[str, Planned]) -> Iterator[Finding]:
    for i, pair in decoded.items(("tied_pairs",), decoded.plan.tied_pairs):
        if isinstance(pair, Refusal):  # not two FQNs (a schema error): its names still count
            for j, fqn in enumerate(pair.value if isinstance(pair.value, list) else ()):
                if isinstance(fqn, str) and fqn not in params:
                    yield error("plan.tied_unplanned", pointer("tied_pairs", i, j),
                                f"tied parameter {fqn!r} is not in param_plan")
            continue
        for j, fqn in enumerate(pair):
            if fqn not in params:
                yield error("plan.tied_unplanned", pointer("tied_pairs", i, j),
                            f"tied parameter {fqn!r} is not in param_plan")
        if not all(p in params for p in pair):
            continue
        if pair[0] == pair[1]:
            yield error("plan.tied_self", pointer("tied_pairs", i),
                        f"{pair[0]!r} is tied to itself")
        elif (first := _named_json(decoded, params[pair[0]])) \
                != _named_json(decoded, params[pair[1]]):
            # the runtime makes both names one parameter object (one local shard): it
            # refuses a pair planned two ways, so the gate does too
            yield error("plan.tied_placements_differ", pointer("tied_pairs", i, 1),
                        f"{pair[1]} shares {pair[0]}'s local storage but is planned with "
                        "other placements (tied parameters are one tensor: one placement)",
                        expected=json.dumps(first))


def _named_json(decoded: DecodedMeta, planned: Planned) -> dict[str, Any]:
    """A planned parameter's named placement as the meta writes it (refused leaves as
    found, in the meta's order)."""
    entry, rel, named = planned
    return {axis: p.value if isinstance(p, Refusal) else str(p)
            for axis, p in decoded.members(("param_plan", entry, "params", rel), named)}


def _sharded_params(params: Mapping[str, Planned]) -> set[str]:
    """The planned parameters some placement of which is not ``R`` (judged once per
    distinct named placement: a plan repeats a handful, shared by the codec)."""
    verdicts: dict[int, bool] = {}
    out: set[str] = set()
    for fqn, (_entry, _rel, named) in params.items():
        sharded = verdicts.get(id(named))
        if sharded is None:
            sharded = verdicts[id(named)] = any(
                isinstance(p, (Shard, StridedShard, Partial)) for p in named.values())
        if sharded:
            out.add(fqn)
    return out


def _frozen_sharded(decoded: DecodedMeta, params: Mapping[str, Planned]) -> Iterator[Finding]:
    listed = decoded.plan.frozen_sharded_params
    if listed is None:
        return  # absent, or no array (a schema error)
    sharded = _sharded_params(params)
    for i, fqn in decoded.items(("frozen_sharded_params",), listed):
        if isinstance(fqn, Refusal) or fqn in sharded:
            continue
        if fqn not in params:
            yield error("plan.frozen_sharded_unplanned", pointer("frozen_sharded_params", i),
                        f"{fqn!r} is listed as sharded but is not in param_plan")
        else:
            yield warning("plan.frozen_sharded_replicated", pointer("frozen_sharded_params", i),
                          f"{fqn!r} is listed as sharded but every placement is R")
    missing = sharded - set(listed)
    for fqn, (entry, rel, _named) in params.items() if missing else ():
        if fqn not in missing:
            continue
        yield warning("plan.frozen_sharded_missing", pointer("param_plan", entry, "params", rel),
                      f"{fqn} is sharded but not listed in frozen_sharded_params")


_PARAM_LISTS = ("deferred_bias_params", "partial_grad_params", "tp_rank0_params")
_LIST_KEYS = frozenset((*_PARAM_LISTS, "no_grad_inputs"))


def _entry_param_lists(decoded: DecodedMeta, params: Mapping[str, Planned]
                       ) -> Iterator[Finding]:
    for fqn, entry in (decoded.plan.param_plan or {}).items():
        if fqn not in decoded.refused_entries and all(
                getattr(entry, key) is None for key in _LIST_KEYS):
            continue  # names none (most entries)
        for key in _PARAM_LISTS:
            path = ("param_plan", fqn, key)
            for i, rel in decoded.items(path, getattr(entry, key)):
                if isinstance(rel, Refusal):
                    continue
                full = join_fqn(fqn, rel)
                if full not in params:
                    yield error(f"plan.{key}_unplanned", pointer(*path, i),
                                f"{full} is not a planned parameter",
                                hint="paths are relative to the entry, e.g. o_proj.bias")
                elif params[full][0] != fqn:
                    owner = params[full][0] or "<root>"
                    yield error(f"plan.{key}_other_entry", pointer(*path, i),
                                f"{full} is planned in entry {owner}, not in {fqn or '<root>'}:"
                                " an entry names only its own parameters (what it says of "
                                "them follows from its own compute; the runtime would act on "
                                "it regardless)", expected=f"a key of {fqn or '<root>'}'s params",
                                hint=f"move it to {owner}'s {key}")
        declared = set(entry.in_src or ()) | set(entry.in_dst or ())
        path = ("param_plan", fqn, "no_grad_inputs")
        for i, name in decoded.items(path, entry.no_grad_inputs):
            if not isinstance(name, Refusal) and name not in declared:
                yield error("plan.no_grad_inputs_undeclared", pointer(*path, i),
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
    decoded = ctx.decoded
    plan = decoded.plan.param_plan or {}
    params = planned_params(plan)
    yield from _boundary_classes(ctx)
    yield from _injections(decoded)
    yield from _special_handlers(decoded, params, plan)
    yield from _tied_pairs(decoded, params)
    yield from _frozen_sharded(decoded, params)
    yield from _entry_param_lists(decoded, params)
    yield from _overrides(ctx.plan)
    yield from vocab_parallel_findings(ctx.plan, _named_embeddings(ctx.plan), "plan")


#: a planned parameter: (its entry's FQN, its name in that entry, its named placement)
Planned = tuple[str, str, NamedPlacement]


def planned_params(entries: Mapping[str, PlanEntry]) -> dict[str, Planned]:
    """``{param_fqn: (entry_fqn, rel_name, named placement)}`` of the decoded entries; a
    parameter two entries plan keeps the first (the ``plan.param_twice`` finding's case)."""
    out: dict[str, Planned] = {}
    for fqn, entry in entries.items():
        for rel, named in (entry.params or {}).items():
            full = join_fqn(fqn, rel)
            if full not in out:
                out[full] = (fqn, rel, named)
    return out


def _named_embeddings(plan: Plan) -> list[str]:
    """Boundaries whose class is a token embedding by name (the runtime's rule)."""
    return [fqn for fqn, cls in (plan.boundary_classes or {}).items() if takes_token_ids(cls)]
