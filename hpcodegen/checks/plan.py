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

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from hpcodegen.artifact.digest import is_hpcodegen_meta
from hpcodegen.checks.context import CheckContext, pointer
from hpcodegen.checks.cp import check_cp
from hpcodegen.checks.forms import classified
from hpcodegen.checks.plan_derived import derived_findings
from hpcodegen.checks.plan_refs import check_references
from hpcodegen.errors import Finding, error, info, warning
from hpcodegen.placement import Partial, Placement, Shard, StridedShard
from hpcodegen.plan.coverage import params_planned_twice
from hpcodegen.plan.decode import DecodedMeta, Refusal
from hpcodegen.plan.entry import ENTRYPOINTS, TRANSITION_FIELDS
from hpcodegen.plan.loss_parallel import plan_findings
from hpcodegen.plan.types import ParallelDims, Plan, PlanEntry

#: Axes a placement key may name besides the plan's own: ep routes to the expert mesh,
#: dp is FSDP-owned (decisions.md item 4).
ALWAYS_KNOWN_AXES: frozenset[str] = frozenset({"ep", "dp"})
#: Axes whose size > 1 must appear in ``mesh_dim_names`` (ep lives on the expert mesh).
DENSE_AXES: tuple[str, ...] = ("cp", "tp")


def known_axes(names: Iterable[str], dims: ParallelDims | None) -> set[str]:
    """Axis names a placement key may use: mesh_dim_names, parallel_dims axes (every
    ``*_size`` key, whatever its value), ep, dp."""
    sizes = set(dims.sizes) | {k[: -len("_size")] for k in dims.extra
                               if k.endswith("_size")} if dims is not None else set()
    return set(names) | sizes | ALWAYS_KNOWN_AXES


#: the entry fields whose leaves are named placements
_LEAF_FIELDS = ("params", *TRANSITION_FIELDS)
#: the entry fields the per-entry rules read: entries of equal content share their values
_RULE_FIELDS = (*_LEAF_FIELDS, "out_names")


def _content(entry: PlanEntry) -> tuple[int, ...]:
    """What the per-entry rules read of an entry, by identity: the codec shares one parse
    between entries of equal content (a plan of 10,000 entries has a handful), so their
    findings are judged once."""
    return tuple(id(getattr(entry, f)) for f in _RULE_FIELDS)


def _per_content(decoded: DecodedMeta, judge: Callable[[str, PlanEntry], list[Any]]
                 ) -> Iterator[tuple[str, list[Any]]]:
    """``(fqn, judge(fqn, entry))`` for each decoded entry; one verdict per content (an
    entry with a refused value is judged alone: its refusals are its own)."""
    verdicts: dict[tuple[int, ...], list[Any]] = {}
    for fqn, entry in (decoded.plan.param_plan or {}).items():
        if fqn in decoded.refused_entries:
            yield fqn, judge(fqn, entry)
            continue
        key = _content(entry)
        if key not in verdicts:
            verdicts[key] = judge(fqn, entry)
        yield fqn, verdicts[key]


def _check_placements(decoded: DecodedMeta, axes: set[str]) -> Iterator[Finding]:
    leaf_verdicts: dict[tuple[bool, str, Any], tuple[Any, ...]] = {}

    def judge(fqn: str, entry: PlanEntry) -> list[Any]:
        return _bad_leaves(decoded, fqn, entry, axes, leaf_verdicts)

    for fqn, bad in _per_content(decoded, judge):
        for field_name, name, axis, text, problems in bad:
            yield from _leaf_findings(problems, pointer("param_plan", fqn, field_name, name,
                                                        axis), axis, text, axes)


def _bad_leaves(decoded: DecodedMeta, fqn: str, entry: PlanEntry, axes: set[str],
                verdicts: dict[tuple[bool, str, Any], tuple[Any, ...]]
                ) -> list[tuple[str, str, str, str, tuple[Any, ...]]]:
    """``(field, name, axis, text, problems)`` of each placement leaf of one entry that has
    a problem, in the meta's order (a refused leaf stands where the meta has it)."""
    out = []
    for field_name in _LEAF_FIELDS:  # every (field, name, axis) leaf: ~100k in 10k entries
        is_param = field_name == "params"
        path = ("param_plan", fqn, field_name)
        for name, named in decoded.members(path, getattr(entry, field_name)):
            if isinstance(named, Refusal):
                continue  # a named placement that is no object: no leaves
            for axis, leaf in decoded.members((*path, name), named):
                key = (is_param, axis, leaf)
                problems = verdicts.get(key) if not isinstance(leaf, Refusal) else None
                if problems is None:
                    problems = _leaf_problems(is_param, axis, leaf, axes)
                    if not isinstance(leaf, Refusal):
                        verdicts[key] = problems
                if problems:
                    text = leaf.value if isinstance(leaf, Refusal) else str(leaf)
                    out.append((field_name, name, axis, text, problems))
    return out


def _leaf_problems(is_param: bool, axis: str, leaf: Placement | Refusal,
                   axes: set[str]) -> tuple[Any, ...]:
    """What is wrong with one placement leaf: ``("partial_param" | "bad_axis" |
    "negative" | the codec's refusal, ...)``; empty when nothing is."""
    out: list[Any] = []
    if is_param and isinstance(leaf, Partial):
        out.append("partial_param")
    if axis not in axes:
        out.append("bad_axis")
    if isinstance(leaf, Refusal):
        out.append(leaf)
    elif isinstance(leaf, (Shard, StridedShard)) and leaf.dim < 0:
        out.append(("negative", leaf))
    return tuple(out)


def _leaf_findings(problems: tuple[Any, ...], where: str, axis: str, text: Any,
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
        elif isinstance(problem, Refusal):
            yield error("plan.bad_placement", where, problem.message)
        else:
            dim = problem[1].dim
            yield info("plan.negative_shard_dim", where,
                       f"{text} counts dims from the end (torch semantics: S(-1) is the last "
                       "dim); the reference system read it as an uneven shard of dim "
                       f"{-dim - 1}")


def _check_mesh(decoded: DecodedMeta) -> Iterator[Finding]:
    plan = decoded.plan
    if plan.mesh_dim_names is None:
        return  # absent, or no array (a schema error)
    dims = plan.parallel_dims or ParallelDims()
    seen: set[str] = set()
    for i, name in decoded.items(("mesh_dim_names",), plan.mesh_dim_names):
        where = pointer("mesh_dim_names", i)
        if isinstance(name, Refusal):
            continue  # a schema error
        if name in seen:
            yield error("plan.duplicate_axis", where, f"axis {name!r} is listed twice")
        seen.add(name)
        size = dims.sizes[name] if name in dims.sizes else dims.extra.get(f"{name}_size")
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
        size = dims.sizes.get(axis)
        if size is not None and size > 1 and axis not in seen:
            names = decoded.values(("mesh_dim_names",), plan.mesh_dim_names)
            yield error("plan.axis_not_in_mesh", pointer("mesh_dim_names"),
                        f"parallel_dims.{axis}_size is {size} but {axis!r} is not in "
                        "mesh_dim_names, so every placement on it would be dropped",
                        expected=f"{axis!r} among {names}")


def _check_outputs_names(decoded: DecodedMeta) -> Iterator[Finding]:
    def judge(fqn: str, entry: PlanEntry) -> list[Any]:
        return _undeclared_outputs(decoded, fqn, entry)

    for fqn, bad in _per_content(decoded, judge):
        for side, name, names in bad:
            yield error("plan.unknown_output", pointer("param_plan", fqn, side, name),
                        f"{fqn}: output {name!r} is not in out_names",
                        expected="one of " + ", ".join(map(str, names)))


def _undeclared_outputs(decoded: DecodedMeta, fqn: str, entry: PlanEntry
                        ) -> list[tuple[str, str, list[Any]]]:
    """``(side, output name, out_names)`` of each ``out_src``/``out_dst`` name that a
    non-empty ``out_names`` lacks (``out_names`` as the meta holds it)."""
    if entry.out_names is None:
        return []
    names = decoded.values(("param_plan", fqn, "out_names"), entry.out_names)
    if not names:
        return []
    return [(side, name, names) for side in ("out_src", "out_dst")
            for name in getattr(entry, side) or () if name not in names]


def _check_coverage(decoded: DecodedMeta) -> Iterator[Finding]:
    plan = decoded.plan
    empty = next(decoded.members(("param_plan",), plan.param_plan), None) is None
    covered = (plan.provenance.covered or {}).get("sharding_plan")
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


def _check_params_once(entries: Mapping[str, PlanEntry]) -> Iterator[Finding]:
    for full, first, second in params_planned_twice(entries):
        yield error("plan.param_twice", pointer("param_plan", second, "params"),
                    f"parameter {full!r} is planned by both {first!r} and {second!r}",
                    expected="each parameter in one entry's params",
                    hint="keep the placement in one entry")


def _check_entrypoint(decoded: DecodedMeta) -> Iterator[Finding]:
    name = dict(decoded.members(("entrypoints",), decoded.plan.entrypoints)).get("parallelize")
    if isinstance(name, Refusal):
        name = name.value  # no string (a schema error): reported as found
    if name is None:
        yield warning("plan.no_entrypoint", pointer("entrypoints", "parallelize"),
                      "entrypoints.parallelize is missing; the reference runtime refuses such "
                      "a meta", expected=" or ".join(ENTRYPOINTS))
    elif name not in ENTRYPOINTS:
        yield info("plan.custom_entrypoint", pointer("entrypoints", "parallelize"),
                   f"entrypoint {name!r} is neither of the known names",
                   expected=" or ".join(ENTRYPOINTS))


def _check_unknown_keys(plan: Plan) -> Iterator[Finding]:
    from hpcodegen.checks.schema import top_level_keys

    known = top_level_keys()
    for key in plan.extra:  # the keys the codec does not model (and known ones set to null)
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
    decoded = ctx.decoded
    plan = decoded.plan
    entries = plan.param_plan or {}
    yield from _check_coverage(decoded)
    yield from _check_params_once(entries)
    names = [n for _, n in decoded.items(("mesh_dim_names",), plan.mesh_dim_names)
             if not isinstance(n, Refusal)]
    yield from _check_placements(decoded, known_axes(names, plan.parallel_dims))
    yield from _check_mesh(decoded)
    yield from _check_outputs_names(decoded)
    yield from check_references(ctx)
    hpcodegen_meta = is_hpcodegen_meta(ctx.meta)
    forms = classified(ctx)
    if forms is not None:  # None: the fields it reads break the schema (reported there)
        yield from derived_findings(ctx.plan, forms, hpcodegen_meta)
    yield from plan_findings(ctx.plan, "plan", hpcodegen_meta)
    yield from check_cp(ctx.plan)
    yield from _check_pipeline(ctx)
    yield from _check_entrypoint(decoded)
    yield from _check_unknown_keys(plan)
