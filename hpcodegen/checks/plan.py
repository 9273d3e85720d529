"""The ``plan`` check: what the schema cannot say about a frozen plan.

Placements parse and name known axes; ``mesh_dim_names`` agrees with ``parallel_dims``;
``out_src``/``out_dst`` names are declared in ``out_names``; a plan that claims coverage is
not empty; ``loss_parallel`` is set only where the plan keeps an output vocab-sharded
(:func:`hpcodegen.plan.loss_parallel.plan_findings`); the cross references
(``boundary_classes``, injections, handlers, tied pairs, ``frozen_sharded_params``) are
checked in :mod:`hpcodegen.checks.plan_refs`; what the placements decide (partial
gradients and outputs, ``tp_rank0_params``, ``ep_size``, executable transitions) in
:mod:`hpcodegen.checks.plan_derived`. Informational findings note a negative
``S(n)`` (torch semantics, decisions.md item 3) and top-level keys the schema does not know
(allowed, as the reference system ignores them). Injection targets are the ``targets``
check's (:mod:`hpcodegen.checks.targets`); the context-parallel rules are
:mod:`hpcodegen.checks.cp`'s, the pipeline rules :mod:`hpcodegen.checks.pipeline`'s.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from hpcodegen.artifact.digest import is_hpcodegen_meta
from hpcodegen.checks.context import CheckContext, as_dict, as_list, plan_entries, pointer
from hpcodegen.checks.cp import check_cp
from hpcodegen.checks.forms import classified
from hpcodegen.checks.plan_derived import derived_findings
from hpcodegen.checks.plan_refs import check_references
from hpcodegen.errors import Finding, error, info, warning
from hpcodegen.placement import Partial, Shard, StridedShard, parse_placement
from hpcodegen.plan.coverage import params_planned_twice
from hpcodegen.plan.entry import ENTRYPOINTS, TRANSITION_FIELDS
from hpcodegen.plan.loss_parallel import plan_findings

#: Axes a placement key may name besides the plan's own: ep routes to the expert mesh,
#: dp is FSDP-owned (decisions.md item 4).
ALWAYS_KNOWN_AXES: frozenset[str] = frozenset({"ep", "dp"})
#: Axes whose size > 1 must appear in ``mesh_dim_names`` (ep lives on the expert mesh).
DENSE_AXES: tuple[str, ...] = ("cp", "tp")


def known_axes(mesh_dim_names: Any, parallel_dims: Any) -> set[str]:
    """Axis names a placement key may use: mesh_dim_names, parallel_dims axes, ep, dp (the
    two JSON values as the meta holds them)."""
    names = {n for n in as_list(mesh_dim_names) if isinstance(n, str)}
    sizes = {k[: -len("_size")] for k in as_dict(parallel_dims) if k.endswith("_size")}
    return names | sizes | ALWAYS_KNOWN_AXES


#: the entry fields whose leaves are named placements
_LEAF_FIELDS = ("params", *TRANSITION_FIELDS)


def _parsed(text: Any, memo: dict[Any, Any]) -> Any:
    """``parse_placement`` memoized per run (a plan repeats a handful of strings); the
    exception instance stands for a string outside the grammar."""
    key = (type(text), text) if isinstance(text, (str, int, float, bool, type(None))) else None
    if key is not None and key in memo:
        return memo[key]
    try:
        value: Any = parse_placement(text)
    except ValueError as exc:
        value = exc
    if key is not None:
        memo[key] = value
    return value


def _check_placements(entries: Mapping[str, Mapping[str, Any]], axes: set[str],
                      entry_keys: Mapping[str, str | bytes | None]) -> Iterator[Finding]:
    memo: dict[Any, Any] = {}
    #: (field kind, axis, raw type and text) -> its problems, or () when the leaf is fine: a plan
    #: repeats a few dozen such leaves tens of thousands of times
    verdicts: dict[tuple[bool, str, type, Any], tuple[Any, ...]] = {}
    #: an entry's content (:meth:`CheckContext.entry_keys`) -> its leaves with problems
    by_content: dict[str | bytes, list[tuple[str, Any, Any, Any, tuple[Any, ...]]]] = {}
    for fqn, entry in entries.items():
        key = entry_keys.get(fqn)
        bad = by_content.get(key) if key is not None else None
        if bad is None:
            bad = _bad_leaves(entry, axes, memo, verdicts)
            if key is not None:
                by_content[key] = bad
        for field_name, name, axis, text, problems in bad:
            yield from _leaf_findings(problems, pointer("param_plan", fqn, field_name, name,
                                                        axis), axis, text, axes)


def _bad_leaves(entry: Mapping[str, Any], axes: set[str], memo: dict[Any, Any],
                verdicts: dict[tuple[bool, str, type, Any], tuple[Any, ...]]
                ) -> list[tuple[str, Any, Any, Any, tuple[Any, ...]]]:
    """``(field, name, axis, text, problems)`` of each placement leaf of one entry that has
    a problem, in order."""
    out = []
    for field_name in _LEAF_FIELDS:  # every (field, name, axis) leaf: ~100k in 10k entries
        is_param = field_name == "params"
        for name, named in as_dict(entry.get(field_name)).items():
            for axis, text in as_dict(named).items():
                try:
                    key: Any = (is_param, axis, type(text), text)
                    problems = verdicts.get(key)
                except TypeError:  # an unhashable leaf (a schema error): judged each time
                    key, problems = None, None
                if problems is None:
                    problems = _leaf_problems(is_param, axis, text, axes, memo)
                    if key is not None:
                        verdicts[key] = problems
                if problems:
                    out.append((field_name, name, axis, text, problems))
    return out


def _leaf_problems(is_param: bool, axis: Any, text: Any, axes: set[str],
                   memo: dict[Any, Any]) -> tuple[Any, ...]:
    """What is wrong with one placement leaf: ``("partial_param" | "bad_axis" |
    "negative" | the parse error, ...)``; empty when nothing is."""
    placement = _parsed(text, memo)
    out: list[Any] = []
    if is_param and isinstance(placement, Partial):
        out.append("partial_param")
    if axis not in axes:
        out.append("bad_axis")
    if isinstance(placement, ValueError):
        out.append(placement)
    elif isinstance(placement, (Shard, StridedShard)) and placement.dim < 0:
        out.append(("negative", placement))
    return tuple(out)


def _leaf_findings(problems: tuple[Any, ...], where: str, axis: Any, text: Any,
                   axes: set[str]) -> Iterator[Finding]:
    for problem in problems:
        if problem == "partial_param":
            yield error("plan.partial_param", where, f"parameter placement {text} is "
                        "Partial: a parameter is a value, never a pending reduction",
                        expected="R, S(n) or SS(d,f)")
        elif problem == "bad_axis":
            yield error("plan.unknown_axis", where, f"axis {axis!r} is not a mesh axis of "
                        "this plan", expected="one of " + ", ".join(sorted(axes)),
                        hint="add it to mesh_dim_names / parallel_dims or fix the key")
        elif isinstance(problem, ValueError):
            yield error("plan.bad_placement", where, str(problem))
        else:
            dim = problem[1].dim
            yield info("plan.negative_shard_dim", where,
                       f"{text} counts dims from the end (torch semantics: S(-1) is the last "
                       "dim); the reference system read it as an uneven shard of dim "
                       f"{-dim - 1}")


def _check_mesh(names: Any, parallel_dims: Any) -> Iterator[Finding]:
    dims = as_dict(parallel_dims)
    if not isinstance(names, list):
        return
    seen: set[str] = set()
    for i, name in enumerate(names):
        where = pointer("mesh_dim_names", i)
        if not isinstance(name, str):
            continue  # a schema error
        if name in seen:
            yield error("plan.duplicate_axis", where, f"axis {name!r} is listed twice")
        seen.add(name)
        size = dims.get(f"{name}_size")
        if name == "dp":
            yield warning("plan.fsdp_axis", where, "dp is an FSDP axis, not a plan axis",
                          hint="drop it from mesh_dim_names")
        elif size is None:
            yield warning("plan.axis_without_size", where,
                          f"parallel_dims has no {name}_size for axis {name!r}")
        elif size == 1:
            yield info("plan.size_one_axis", where, f"axis {name!r} has size 1: every "
                       "transition on it is identity")
    for axis in DENSE_AXES:
        size = dims.get(f"{axis}_size")
        if isinstance(size, int) and size > 1 and axis not in seen:
            yield error("plan.axis_not_in_mesh", pointer("mesh_dim_names"),
                        f"parallel_dims.{axis}_size is {size} but {axis!r} is not in "
                        "mesh_dim_names, so every placement on it would be dropped",
                        expected=f"{axis!r} among {names}")


def _check_outputs_names(entries: Mapping[str, Mapping[str, Any]],
                         entry_keys: Mapping[str, str | bytes | None]) -> Iterator[Finding]:
    by_content: dict[str | bytes, list[tuple[str, Any, list[Any]]]] = {}
    for fqn, entry in entries.items():
        key = entry_keys.get(fqn)
        bad = by_content.get(key) if key is not None else None
        if bad is None:
            bad = _undeclared_outputs(entry)
            if key is not None:
                by_content[key] = bad
        for side, name, names in bad:
            yield error("plan.unknown_output", pointer("param_plan", fqn, side, name),
                        f"{fqn}: output {name!r} is not in out_names",
                        expected="one of " + ", ".join(map(str, names)))


def _undeclared_outputs(entry: Mapping[str, Any]) -> list[tuple[str, Any, list[Any]]]:
    """``(side, output name, out_names)`` of each ``out_src``/``out_dst`` name that a
    non-empty ``out_names`` lacks."""
    names = entry.get("out_names")
    if not isinstance(names, list) or not names:
        return []
    return [(side, name, names) for side in ("out_src", "out_dst")
            for name in as_dict(entry.get(side)) if name not in names]


def _check_coverage(param_plan: Any, covered_record: Any) -> Iterator[Finding]:
    empty = not isinstance(param_plan, Mapping) or not param_plan
    covered = as_dict(covered_record).get("sharding_plan")
    if empty and covered is True:
        yield error("plan.covered_but_empty", pointer("covered", "sharding_plan"),
                    "covered.sharding_plan is true but param_plan is empty",
                    hint="regenerate the artifact; generation never freezes an empty plan")
    elif empty:
        yield error("plan.empty", pointer("param_plan"), "param_plan is empty: the artifact "
                    "shards nothing", hint="regenerate the artifact")
    elif covered is False:
        yield info("plan.not_covered", pointer("covered", "sharding_plan"),
                   "covered.sharding_plan is false although param_plan is not empty")


def _check_params_once(entries: Mapping[str, Mapping[str, Any]]) -> Iterator[Finding]:
    for full, first, second in params_planned_twice(entries):
        yield error("plan.param_twice", pointer("param_plan", second, "params"),
                    f"parameter {full!r} is planned by both {first!r} and {second!r}",
                    expected="each parameter in one entry's params",
                    hint="keep the placement in one entry")


def _check_entrypoint(entrypoints: Any) -> Iterator[Finding]:
    name = as_dict(entrypoints).get("parallelize")
    if name is None:
        yield warning("plan.no_entrypoint", pointer("entrypoints", "parallelize"),
                      "entrypoints.parallelize is missing; the reference runtime refuses such "
                      "a meta", expected=" or ".join(ENTRYPOINTS))
    elif name not in ENTRYPOINTS:
        yield info("plan.custom_entrypoint", pointer("entrypoints", "parallelize"),
                   f"entrypoint {name!r} is neither of the known names",
                   expected=" or ".join(ENTRYPOINTS))


def _check_unknown_keys(keys: Iterable[str]) -> Iterator[Finding]:
    from hpcodegen.checks.schema import top_level_keys

    known = top_level_keys()
    for key in keys:
        if key not in known:
            yield info("plan.unknown_key", pointer(key), f"top-level key {key!r} is not part of "
                       "the meta format; it is ignored")


def _check_pipeline(ctx: CheckContext) -> Iterator[Finding]:
    """:func:`hpcodegen.checks.pipeline.check_pipeline`, imported for a plan that has a
    pipeline or a pp axis (it reports nothing else; its schedule simulator is ~6 ms of
    start-up a plan without one never needs)."""
    if ctx.plan.pipeline is None and ctx.plan.dims.size("pp") <= 1:
        return
    from hpcodegen.checks.pipeline import check_pipeline

    yield from check_pipeline(ctx)


def check_plan(ctx: CheckContext) -> Iterator[Finding]:
    """Semantic rules of the frozen plan (see the module docstring). The rules before
    ``check_references`` judge the JSON as it is (a meta the schema rejects still gets them,
    field by field): the meta is read here once and each rule gets the fields it judges;
    the rest read the typed :attr:`CheckContext.plan`."""
    meta = ctx.meta
    entries = plan_entries(meta.get("param_plan"))
    yield from _check_coverage(meta.get("param_plan"), meta.get("covered"))
    yield from _check_params_once(entries)
    yield from _check_placements(entries, known_axes(meta.get("mesh_dim_names"),
                                                     meta.get("parallel_dims")),
                                 ctx.entry_keys())
    yield from _check_mesh(meta.get("mesh_dim_names"), meta.get("parallel_dims"))
    yield from _check_outputs_names(entries, ctx.entry_keys())
    yield from check_references(ctx)
    forms = classified(ctx)
    if forms is not None:  # None: the fields it reads break the schema (reported there)
        yield from derived_findings(ctx.plan, forms, is_hpcodegen_meta(meta))
    yield from plan_findings(ctx.plan, "plan", is_hpcodegen_meta(meta))
    yield from check_cp(ctx.plan)
    yield from _check_pipeline(ctx)
    yield from _check_entrypoint(meta.get("entrypoints"))
    yield from _check_unknown_keys(meta)
