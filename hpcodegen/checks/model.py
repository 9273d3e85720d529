"""The ``model`` check: the frozen plan fits the real model built from ``--hf-config``.

The only check that loads torch and transformers (lazily, through
:func:`hpcodegen.hf.build_meta_model`: the real structure on the meta device, no weights, no
download). Every planned ``<fqn>.<param>`` must exist (``""`` names the entry itself), every
plan FQN must name a module (nothing is skipped silently, unlike torch's plan application),
every trainable parameter must be covered by a planned key (equal, or below it:
:func:`hpcodegen.plan.coverage.uncovered`, the rule ``generate`` refuses by), head and
kv-head counts (:func:`hpcodegen.plan.tp_divisible.tp_divisibility`, the rule ``generate``
refuses by; an MLP width or vocab that does not divide is a warning there) and each
``tp_divide_attrs`` attribute must divide the tp size, and a sharded dim that does not divide
its axis size is a warning (torch shards it unevenly). With ``parallel_dims.loss_parallel``
the output head must be vocab-sharded and the forward may only apply elementwise steps to
its logits; without it, the plan must not leave the head's logits vocab-sharded
(:func:`hpcodegen.tracer.loss_parallel.model_findings`, the rule of ``generate
--loss-parallel`` and of the runtime's install).

An injection's ``ep_stack`` is honoured: the stacked parameter is made from its per-expert
sources (which must exist, all of one shape, and are covered by it).
``module_overrides`` (:mod:`hpcodegen.plan.overrides`) are honoured: a replaced module must
exist where the record says and be of its declared ``module_type``; what the plan says at or
below it (parameter names such as a fused ``linear_qkv``, the replacement's class in
``boundary_classes``, ``tp_divide_attrs``) describes the replacement, which is foreign code and
never built here, so it is reported once per replaced module as info and not compared with the
HF module; the HF parameters under it are owned by the replacement and need no plan entry.
An artifact whose modeling source is not a transformers module (its own modeling package, or
remote code) cannot be built from transformers either: the check is skipped and says so.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from hpcodegen.artifact.digest import is_hpcodegen_meta
from hpcodegen.checks.context import (
    NEEDS_CONFIG,
    CheckContext,
    SkipCheck,
    pointer,
)
from hpcodegen.checks.model_derived import input_name_findings, leaf_form_findings
from hpcodegen.checks.schema import subtree_valid
from hpcodegen.checks.source import read_modeling_tree
from hpcodegen.checks.source_scan import kept_attributes, scan_module
from hpcodegen.errors import Finding, HpcodegenError, error, info, warning
from hpcodegen.hf import EXPERT_COUNT_FIELDS
from hpcodegen.placement import REPLICATE, Shard, StridedShard
from hpcodegen.plan.coverage import trainable_names, uncovered
from hpcodegen.plan.entry import join_fqn, takes_token_ids
from hpcodegen.plan.loss_parallel import declared
from hpcodegen.plan.overrides import Override, class_matches, read_overrides, replaced_by
from hpcodegen.plan.overrides import replaced_modules as select_replaced
from hpcodegen.plan.tp_divisible import (
    MISSING,
    config_size,
    divide_attr_findings,
    tp_divisibility,
)
from hpcodegen.plan.types import Plan, PlanEntry, PlannedParam
from hpcodegen.plan.vocab import vocab_parallel_findings
from hpcodegen.tracer.loss_parallel import model_findings

#: At most this many uncovered parameters are listed one by one.
MAX_LISTED = 20


def _resolve(root: Any, fqn: str) -> Any:
    """``root.a.b.0.c`` by getattr (digit segments too), or None when any step is missing."""
    obj = root
    for part in fqn.split(".") if fqn else ():
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


@dataclass
class _Scope:
    """Where each plan name is checked on the HF model, given the replaced modules.

    Below a replaced module the plan names the replacement's attributes. Those the replacement
    keeps from the original (``self.o_proj = module.o_proj`` in its class in the modeling file)
    are the original's modules and are checked there; the others cannot be (None).
    """

    replaced: Mapping[str, Override]
    #: replaced FQN -> {replacement attribute: the original's child it keeps}
    kept: Mapping[str, Mapping[str, str]]
    #: stacked parameter FQN -> (JSON pointer of its ``ep_stack`` list, source parameter FQNs)
    stacks: Mapping[str, tuple[str, list[str]]]

    def hf_name(self, name: str) -> str | None:
        """The HF FQN to check plan name ``name`` at, or None when it is not checkable."""
        owner = replaced_by(name, self.replaced)
        if owner is None:
            return name
        if owner == name:
            return None
        head, _, rest = name[len(owner) + 1:].partition(".")
        child = self.kept.get(owner, {}).get(head)
        return None if child is None else join_fqn(join_fqn(owner, child), rest)

    def covering_name(self, hf_param: str) -> str | None:
        """The plan name that must cover HF parameter ``hf_param``; None when the replacement
        owns it (it is gone from the replaced model)."""
        owner = replaced_by(hf_param, self.replaced)
        if owner is None:
            return hf_param
        head, _, rest = hf_param[len(owner) + 1:].partition(".")
        for attr, child in self.kept.get(owner, {}).items():
            if child == head:
                return join_fqn(join_fqn(owner, attr), rest)
        return None


def _planned(plan: Plan) -> dict[str, PlannedParam]:
    """Each planned parameter FQN with the first entry that plans it (a second one is the
    plan check's ``plan.param_twice``)."""
    out: dict[str, PlannedParam] = {}
    for param in plan.parameters():
        out.setdefault(param.fqn, param)
    return out


def ep_stacks(plan: Plan) -> dict[str, tuple[str, list[str]]]:
    """``{stacked param FQN: (pointer, [source param FQNs])}`` from the injections' ``ep_stack``.

    ``ep_stack`` (``{stacked rel path: [per-expert source paths]}``, relative to the injection's
    module) makes the runtime stack per-expert parameters into one ``[E, ...]`` parameter
    before sharding it on ``ep``: the stacked name exists only after that, the sources are
    consumed by it.
    """
    out: dict[str, tuple[str, list[str]]] = {}
    for i, record in enumerate(plan.injections or ()):
        for fqn in record.fqns:
            for rel, sources in (record.ep_stack or {}).items():
                srcs = [join_fqn(fqn, x) for x in sources]
                out.setdefault(join_fqn(fqn, rel),
                               (pointer("injections", i, "ep_stack", rel), srcs))
    return out


def _stack_sources(model: Any, scope: _Scope) -> Iterator[Finding]:
    """Every ``ep_stack`` source is a parameter of the model, all of one shape."""
    for stacked, (where, sources) in scope.stacks.items():
        shapes: dict[tuple[int, ...], str] = {}
        for j, src in enumerate(sources):
            hf = scope.hf_name(src)
            if hf is None:
                continue
            target = _resolve(model, hf)
            if target is None or not hasattr(target, "requires_grad"):
                yield error("model.ep_stack_source_missing", f"{where}/{j}", f"{stacked} stacks "
                            f"{src}, which is not a parameter of {type(model).__name__}")
                continue
            shapes.setdefault(tuple(target.shape), src)
        if len(shapes) > 1:
            listed = ", ".join(f"{name} {list(shape)}" for shape, name in shapes.items())
            yield error("model.ep_stack_shapes_differ", where, f"{stacked} stacks parameters "
                        f"of different shapes: {listed}")


def _shape(model: Any, scope: _Scope, param_fqn: str) -> tuple[int, ...] | None:
    """The shape a planned parameter has when it is sharded (a stack: ``[E, *source]``)."""
    if param_fqn in scope.stacks:
        sources = scope.stacks[param_fqn][1]
        hf = scope.hf_name(sources[0]) if sources else None
        first = None if hf is None else getattr(_resolve(model, hf), "shape", None)
        return None if first is None else (len(sources), *first)
    hf = scope.hf_name(param_fqn)
    shape = None if hf is None else getattr(_resolve(model, hf), "shape", None)
    return None if shape is None else tuple(shape)


def _fqns(plan: Plan, model: Any, scope: _Scope) -> Iterator[Finding]:
    for fqn in plan.entries:
        hf = scope.hf_name(fqn)
        if hf is not None and _resolve(model, hf) is None:
            yield error("model.unknown_module", pointer("param_plan", fqn),
                        f"plan FQN {fqn!r} matches no module of {type(model).__name__}"
                        + (f" (it is {hf} of the replaced module)" if hf != fqn else ""))
    for param_fqn, param in _planned(plan).items():
        entry, rel = param.entry, param.name
        hf, hf_entry = scope.hf_name(param_fqn), scope.hf_name(entry)
        if param_fqn in scope.stacks:
            continue  # made by stacking its sources (checked by _stack_sources)
        if hf is None or (hf_entry is not None and _resolve(model, hf_entry) is None):
            continue  # not checkable, or its module is missing (reported above)
        target = _resolve(model, hf)
        if target is None or not hasattr(target, "requires_grad"):
            what = "is missing from the model" if target is None else "is not a parameter"
            kept = f" (kept as {hf})" if hf != param_fqn else ""
            yield error("model.missing_param", pointer("param_plan", entry, "params", rel),
                        f"planned parameter {param_fqn}{kept} {what}")
    for fqn, cls in (plan.boundary_classes or {}).items():
        hf = scope.hf_name(fqn)
        module = None if hf is None else _resolve(model, hf)
        if module is not None and type(module).__name__ != cls:
            yield error("model.class_mismatch", pointer("boundary_classes", fqn),
                        f"{fqn or '<root>'} is a {type(module).__name__}, the plan says {cls}",
                        expected=type(module).__name__)


def _divide_attrs(entries: Mapping[str, PlanEntry], model: Any, tp: int,
                  scope: _Scope) -> list[Finding]:
    """``tp_divide_attrs`` name integer attributes the runtime divides by the tp size
    (:func:`hpcodegen.plan.tp_divisible.divide_attr_findings`, its own rule); those under a
    replaced module describe the replacement and are not checkable here."""
    def resolve(fqn: str, attr: str) -> Any:
        hf = scope.hf_name(fqn)
        module = None if hf is None else _resolve(model, hf)
        if module is None:
            return None  # unknown module (reported by _fqns) or not checkable
        value = _resolve(module, attr)
        return MISSING if value is None else value

    return divide_attr_findings(entries, tp, resolve, "model",
                                lambda fqn, i, _: pointer("param_plan", fqn, "tp_divide_attrs",
                                                          i))


def _coverage(plan: Plan, model: Any, scope: _Scope) -> Iterator[Finding]:
    names = [n for n in map(scope.covering_name, trainable_names(model)) if n is not None]
    planned = _planned(plan)
    stacked = [src for fqn, (_, srcs) in scope.stacks.items() if fqn in planned for src in srcs]
    missing = uncovered(names, [*planned, *stacked])
    for name in missing[:MAX_LISTED]:
        yield error("model.uncovered_param", name, f"trainable parameter {name} is not covered "
                    "by the frozen plan", hint="add it (R if replicated) to its entry's params")
    if len(missing) > MAX_LISTED:
        yield error("model.uncovered_param", "", f"{len(missing) - MAX_LISTED} more trainable "
                    "parameters are not covered")


def _divisibility(plan: Plan, model: Any, scope: _Scope) -> Iterator[Finding]:
    sizes = plan.dims.sizes
    for param_fqn, param in _planned(plan).items():
        shape = _shape(model, scope, param_fqn)
        if shape is None:
            continue
        for axis, p in param.placements.items():
            size = sizes.get(axis, 1)
            if not isinstance(p, (Shard, StridedShard)) or size <= 1:
                continue
            where = pointer("param_plan", param.entry, "params", param.name, axis)
            dim = p.dim + len(shape) if p.dim < 0 else p.dim
            if not 0 <= dim < len(shape):
                yield error("model.shard_dim_out_of_range", where, f"{param_fqn}: {p} needs "
                            f"dim < {len(shape)} ({len(shape)}-D tensor {tuple(shape)})",
                            hint="S(-1) names the last dim")
                continue
            chunks = size * (p.split_factor if isinstance(p, StridedShard) else 1)
            if shape[dim] % chunks:
                yield warning("model.uneven_shard", where, f"{param_fqn}: dim {dim} of size "
                              f"{shape[dim]} does not divide into {chunks} on {axis}; torch "
                              "shards it unevenly")


def _mro(module: Any) -> list[tuple[str, str]]:
    return [(c.__module__, c.__qualname__) for c in type(module).__mro__]


def _planned_below(plan: Plan, scope: _Scope) -> dict[str, tuple[int, int]]:
    """Per replaced module: how many plan names (entries, parameters, boundary classes) at or
    below it are (checkable, not checkable)."""
    count: dict[str, tuple[int, int]] = {}
    names = [*plan.entries, *_planned(plan), *(plan.boundary_classes or {})]
    for name in names:
        owner = replaced_by(name, scope.replaced)
        if owner is not None:
            checked, unchecked = count.get(owner, (0, 0))
            known = scope.hf_name(name) is not None
            count[owner] = (checked + known, unchecked + (not known))
    return count


def _kept_children(ctx: CheckContext, model: Any,
                   replaced: Mapping[str, Override]) -> dict[str, dict[str, str]]:
    """Children each replacement keeps from the original, read from its class in the modeling
    file (``boundary_classes`` names it) and confirmed on the live original; nothing is
    imported."""
    classes = ctx.plan.boundary_classes or {}
    wanted = {fqn: classes.get(fqn) for fqn in replaced}
    if not any(isinstance(c, str) for c in wanted.values()):
        return {}
    tree, _, _ = read_modeling_tree(ctx)
    if tree is None:
        return {}
    scan = scan_module(tree)
    out: dict[str, dict[str, str]] = {}
    for fqn, cls in wanted.items():
        info_ = scan.classes.get(cls) if isinstance(cls, str) else None
        original = _resolve(model, fqn)
        if info_ is None or original is None:
            continue
        children = dict(original.named_children())
        kept = {a: c for a, c in kept_attributes(info_).items() if c in children}
        if kept:
            out[fqn] = kept
    return out


def _overrides(plan: Plan, model: Any, scope: _Scope) -> Iterator[Finding]:
    """Each replaced module exists and has the declared type; the rest is reported once."""
    planned = _planned_below(plan, scope)
    for fqn, override in scope.replaced.items():
        module = _resolve(model, fqn)
        where = pointer("module_overrides", override.index)
        if module is None:
            yield error("model.override_unknown_module", where, f"module_overrides replaces "
                        f"{fqn!r}, which is not a module of {type(model).__name__}",
                        hint="the artifact was made for another model structure; regenerate")
            continue
        if not class_matches(override, _mro(module)):
            exact = "exactly " if override.exact_type else ""
            yield error("model.override_type_mismatch", pointer("module_overrides",
                        override.index, "module_type"), f"{fqn} is a {type(module).__name__}, "
                        f"the override replaces {exact}{override.module_type}",
                        expected=type(module).__name__,
                        hint="the model changed under the artifact; regenerate")
            continue
        checked, unchecked = planned.get(fqn, (0, 0))
        if unchecked:
            kept = scope.kept.get(fqn, {})
            also = (f"; {checked} under the children it keeps ({', '.join(sorted(kept))}) were "
                    "checked against the original" if checked else "")
            yield info("model.replaced_module", where, f"{fqn} is replaced by "
                       f"{override.target}; its structure is not checkable here "
                       f"({unchecked} planned name(s) describe the replacement, not "
                       f"{type(module).__name__}{also})")


def _experts_divide_ep(config: Mapping[str, Any], plan: Plan) -> Iterator[Finding]:
    """Experts sharded over ``ep`` need a whole number of experts per rank."""
    ep = plan.dims.size("ep")
    if ep <= 1 or not any(param.placements.get("ep", REPLICATE) != REPLICATE
                          for param in _planned(plan).values()):
        return
    for key in EXPERT_COUNT_FIELDS:
        size = config_size(config, key)
        if size is not None:
            if size[1] % ep:
                yield error("model.experts_not_divisible", pointer("parallel_dims", "ep_size"),
                            f"{size[0][1:].replace('/', '.')} = {size[1]} experts do not divide "
                            f"over ep_size = {ep}",
                            expected=f"an ep_size that divides {size[1]}")
            return


def _wrapper_args(plan: Any, modules: Mapping[str, Any], replaced: Mapping[str, Any]
                  ) -> Iterator[Finding]:
    """Each ``inner_wrapper`` of hpcodegen's context-parallel factories can wrap its module
    with its arguments (:func:`hpcodegen.runtime.cp.wrappers.wrapper_problem`, the rule the
    install applies once the ranks have started), checked on the built model first."""
    from hpcodegen.plan.types import Target
    from hpcodegen.runtime.cp.wrappers import wrapper_problem
    from hpcodegen.targets import target_spec

    for i, record in enumerate(plan.injections or ()):
        wrapper = record.inner_wrapper
        if wrapper is None:
            continue
        path = wrapper.path if isinstance(wrapper, Target) else str(wrapper)
        kwargs = dict(wrapper.kwargs) if isinstance(wrapper, Target) else {}
        spec = target_spec(path) or ""
        module_name, _, factory = spec.partition(":")
        if module_name != "hpcodegen.runtime.cp.wrappers":
            continue
        for fqn in record.fqns:
            module = modules.get(fqn)
            if module is None or replaced_by(fqn, replaced) is not None:
                continue
            problem = wrapper_problem(factory, module, kwargs)
            if problem is not None:
                yield error(f"model.wrapper_{problem[0].removeprefix('bad_')}",
                            pointer("injections", i, "inner_wrapper"),
                            f"{fqn}: {problem[1]}; the runtime refuses this at install, "
                            "after the ranks have started")


def _foreign_source(plan: Plan) -> str | None:
    """The modeling module when it is not part of transformers (never built here)."""
    source = plan.provenance.source
    name = None if source is None else source.module_name
    if isinstance(name, str) and name and name != "transformers" \
            and not name.startswith("transformers."):
        return name
    return None


def _vocab_parallel(plan: Plan, modules: Mapping[str, Any]) -> Iterator[Finding]:
    """Every ``nn.Embedding`` instance (any class name) that is row-sharded must reduce its
    partial lookup itself (:mod:`hpcodegen.plan.vocab`); the plan check covers the
    ``*Embedding``-named boundary classes already."""
    from torch import nn

    named = {fqn for fqn, cls in (plan.boundary_classes or {}).items() if takes_token_ids(cls)}
    embeddings = [fqn for fqn, m in modules.items() if fqn not in named and (
        isinstance(m, nn.Embedding) or takes_token_ids(type(m).__name__))]
    yield from vocab_parallel_findings(plan, embeddings, "model")


def _pipeline_units(ctx: CheckContext, model: Any) -> Iterator[Finding]:
    """A pipeline's units are the model's own, in its order, and its parameter-free
    modules (rotary embeddings) are kept on every stage: read off the built model by the
    rule generate splits by (:func:`hpcodegen.generate.layouts.pipeline.model_units`)."""
    pipe = ctx.plan.pipeline
    if pipe is None:
        return
    from hpcodegen.generate.layouts.pipeline import model_units

    try:
        units, replicated, _base = model_units(model)
    except HpcodegenError as exc:
        yield from exc.findings
        return
    want = [u.fqn for u in units]
    if list(pipe.module_order or ()) != want:
        got = list(pipe.module_order or ())
        first = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b),
                     min(len(got), len(want)))
        yield error("model.pp_units", pointer("pipeline", "module_order", first),
                    f"the pipeline's units differ from the model's at #{first}: "
                    f"{got[first] if first < len(got) else '(none)'}",
                    expected=want[first] if first < len(want) else "(none)")
    missing = sorted(set(replicated) - set(pipe.replicated_modules or ()))
    if missing:
        yield error("model.pp_replicated", pointer("pipeline", "replicated_modules"),
                    f"{', '.join(missing)} (parameter-free) must be kept on every stage: the "
                    "layers of each stage use it", expected=str(sorted(replicated)))


def check_model(ctx: CheckContext) -> Iterator[Finding]:
    """Build the model on the meta device and fit the plan to it."""
    if ctx.hf_config is None:
        raise SkipCheck(NEEDS_CONFIG)
    config = ctx.require_hf_config()
    if not subtree_valid(ctx, "param_plan", "parallel_dims", "boundary_classes",
                         "module_overrides"):
        raise SkipCheck("param_plan, parallel_dims, boundary_classes or module_overrides "
                        "violate the schema")
    # param_plan and parallel_dims are schema-valid: the Plan holds them whole
    live = ctx.live_sizes is not None and "tp" in ctx.live_sizes
    tp, entries = ctx.sizes().get("tp", 1), ctx.plan.entries
    # pure (config JSON + plan): holds for foreign modeling code too, which is never built;
    # the plan says which heads it splits (no rule file is read: the gate needs no YAML)
    sizes = tp_divisibility(config, tp, "model",
                            "--mesh" if live else pointer("parallel_dims", "tp_size"),
                            plan=entries)
    from hpcodegen.checks.cp import config_heads_findings

    sizes = [*sizes, *config_heads_findings(ctx.plan, config)]
    foreign = _foreign_source(ctx.plan)
    if foreign is not None:
        why = (f"the modeling source {foreign} is not a transformers module; its structure "
               "is not checkable here (signature still compares architecture and structure)")
        if not sizes:
            raise SkipCheck(why)
        yield from sizes
        yield info("model.foreign_source", pointer("source", "module_name"),
                   f"only the config's sizes were checked: {why}")
        return
    yield from sizes
    from hpcodegen.hf import architecture_of, build_meta_model
    from hpcodegen.progress import steps

    with steps("verify model check", 4 if declared(ctx.plan) else 3) as advance:
        advance(f"building {architecture_of(config) or 'the model'} on the meta device")
        try:
            model = build_meta_model(config)
        except HpcodegenError as exc:  # about the config: say so, not the meta
            yield from (replace(f, file=f.file or str(ctx.hf_config_path))
                        for f in exc.findings)
            return
        except Exception as exc:  # transformers rejects the config in many ways
            yield error("model.build_failed", "", f"transformers cannot build the model from "
                        f"the config: {type(exc).__name__}: {exc}",
                        file=str(ctx.hf_config_path))
            return
        advance("fitting the plan to the model")
        modules = dict(model.named_modules())
        plan = ctx.plan
        replaced = select_replaced(read_overrides(plan), modules, _mro)
        scope = _Scope(replaced, _kept_children(ctx, model, replaced), ep_stacks(plan))
        findings = [*_overrides(plan, model, scope),
                    *_experts_divide_ep(config, plan),
                    *_fqns(plan, model, scope),
                    *_stack_sources(model, scope),
                    *_divide_attrs(entries, model, tp, scope),
                    *_coverage(plan, model, scope),
                    *_divisibility(plan, model, scope),
                    *_vocab_parallel(plan, modules),
                    *leaf_form_findings(plan, modules),
                    *input_name_findings(plan.entries, modules, set(replaced)),
                    *_pipeline_units(ctx, model),
                    *_wrapper_args(ctx.plan, modules, replaced)]
        if declared(ctx.plan):
            advance("watching the logits after the head (loss_parallel)")
        # last: its meta forward (loss_parallel declared only) switches the model to eager
        # attention and stubs experts; the checks above only read the model
        findings += model_findings(model, ctx.plan, "model", is_hpcodegen_meta(ctx.meta))
        advance("deriving placements and gradients by propagation (fake process group)")
        findings += derivation_findings(
            ctx.plan, config, is_hpcodegen_meta(ctx.meta),
            sizes=ctx.sizes() if ctx.live_sizes is not None else None,
            replaced={fqn: f"replaced by {o.target} (module_overrides)"
                      for fqn, o in replaced.items()},
            model=None if declared(ctx.plan) else model)
    yield from findings


def derivation_findings(plan: Any, config: Mapping[str, Any], ours: bool,
                        sizes: Mapping[str, int] | None = None,
                        replaced: Mapping[str, str] | None = None,
                        model: Any = None) -> list[Finding]:
    """The plan run symbolically on a fresh meta model (:mod:`hpcodegen.derive`), compared
    with what it declares (:mod:`hpcodegen.checks.derived`); the one derivation verify,
    generate and the runtime's install check share.

    ``model``: that meta model, when the caller built it from ``config`` and nothing has
    run it yet (the model check, whose structure checks only read it: a second build is a
    good part of a verify); it is consumed. None: built here."""
    from hpcodegen.checks.derived import derived_findings
    from hpcodegen.derive.propagate import derive
    from hpcodegen.hf import build_meta_model

    if model is None:
        try:
            model = build_meta_model(dict(config))
        except Exception as exc:  # the model check above reported the build already
            return [info("derive.skipped", "", f"not derived: the model cannot be built "
                         f"({type(exc).__name__})")]
    return derived_findings(plan, derive(model, plan, sizes, replaced), ours)
