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
its axis size is a warning (torch shards it unevenly).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any

from hpcodegen.checks.context import CheckContext, SkipCheck, as_dict, planned_params, pointer
from hpcodegen.checks.schema import subtree_valid
from hpcodegen.errors import Finding, HpcodegenError, error, warning
from hpcodegen.placement import Shard, StridedShard, parse_placement
from hpcodegen.plan.coverage import trainable_names, uncovered
from hpcodegen.plan.entry import axis_sizes, param_plan
from hpcodegen.plan.tp_divisible import tp_divisibility

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


def _fqns(meta: Mapping[str, Any], model: Any) -> Iterator[Finding]:
    for fqn in param_plan(meta):
        if _resolve(model, fqn) is None:
            yield error("model.unknown_module", pointer("param_plan", fqn),
                        f"plan FQN {fqn!r} matches no module of {type(model).__name__}")
    for param_fqn, (entry, rel, _) in planned_params(meta).items():
        if _resolve(model, entry) is None:
            continue
        target = _resolve(model, param_fqn)
        if target is None or not hasattr(target, "requires_grad"):
            what = "is missing from the model" if target is None else "is not a parameter"
            yield error("model.missing_param", pointer("param_plan", entry, "params", rel),
                        f"planned parameter {param_fqn} {what}")
    for fqn, cls in as_dict(meta.get("boundary_classes")).items():
        module = _resolve(model, fqn)
        if module is not None and type(module).__name__ != cls:
            yield error("model.class_mismatch", pointer("boundary_classes", fqn),
                        f"{fqn or '<root>'} is a {type(module).__name__}, the plan says {cls}",
                        expected=str(cls))


def _divide_attrs(meta: Mapping[str, Any], model: Any, tp: int) -> Iterator[Finding]:
    """``tp_divide_attrs`` name integer attributes the runtime divides by the tp size."""
    for fqn, entry in param_plan(meta).items():
        module = _resolve(model, fqn)
        if module is None:
            continue
        for i, attr in enumerate(entry.get("tp_divide_attrs") or ()):
            where = pointer("param_plan", fqn, "tp_divide_attrs", i)
            value = _resolve(module, attr)
            if value is None:
                yield error("model.missing_attr", where, f"{fqn}.{attr} does not exist on "
                            f"{type(module).__name__}; the runtime cannot divide it by tp")
            elif not isinstance(value, int) or isinstance(value, bool) or value % tp:
                yield error("model.indivisible_attr", where, f"{fqn}.{attr} = {value!r} is not "
                            f"an integer divisible by tp_size = {tp}")


def _coverage(meta: Mapping[str, Any], model: Any) -> Iterator[Finding]:
    missing = uncovered(trainable_names(model), planned_params(meta))
    for name in missing[:MAX_LISTED]:
        yield error("model.uncovered_param", name, f"trainable parameter {name} is not covered "
                    "by the frozen plan", hint="add it (R if replicated) to its entry's params")
    if len(missing) > MAX_LISTED:
        yield error("model.uncovered_param", "", f"{len(missing) - MAX_LISTED} more trainable "
                    "parameters are not covered")


def _divisibility(meta: Mapping[str, Any], model: Any) -> Iterator[Finding]:
    sizes = axis_sizes(meta)
    for param_fqn, (entry, rel, named) in planned_params(meta).items():
        shape = getattr(_resolve(model, param_fqn), "shape", None)
        if shape is None:
            continue
        for axis, text in named.items():
            try:
                p = parse_placement(text)
            except ValueError:
                continue
            size = sizes.get(axis, 1)
            if not isinstance(p, (Shard, StridedShard)) or size <= 1:
                continue
            where = pointer("param_plan", entry, "params", rel, axis)
            dim = p.dim + len(shape) if p.dim < 0 else p.dim
            if not 0 <= dim < len(shape):
                yield error("model.shard_dim_out_of_range", where, f"{param_fqn}: {text} needs "
                            f"dim < {len(shape)} ({len(shape)}-D tensor {tuple(shape)})",
                            hint="S(-1) names the last dim")
                continue
            chunks = size * (p.split_factor if isinstance(p, StridedShard) else 1)
            if shape[dim] % chunks:
                yield warning("model.uneven_shard", where, f"{param_fqn}: dim {dim} of size "
                              f"{shape[dim]} does not divide into {chunks} on {axis}; torch "
                              "shards it unevenly")


def check_model(ctx: CheckContext) -> Iterator[Finding]:
    """Build the model on the meta device and fit the plan to it."""
    config = ctx.require_hf_config()
    if not subtree_valid(ctx, "param_plan", "parallel_dims", "boundary_classes"):
        raise SkipCheck("param_plan, parallel_dims or boundary_classes violate the schema")
    tp = axis_sizes(ctx.meta).get("tp", 1)
    yield from tp_divisibility(config, tp, "model", pointer("parallel_dims", "tp_size"))
    from hpcodegen.hf import architecture_of, build_meta_model
    from hpcodegen.progress import steps

    with steps("verify model check", 2) as advance:
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
        findings = [*_fqns(ctx.meta, model), *_divide_attrs(ctx.meta, model, tp),
                    *_coverage(ctx.meta, model), *_divisibility(ctx.meta, model)]
    yield from findings
