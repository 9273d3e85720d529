"""Pipeline rules of a frozen plan (part of the ``plan`` check; pure, no torch).

With a ``pipeline`` section (:mod:`hpcodegen.plan.pipeline`):

* the shape: ``pp_size`` equals ``parallel_dims.pp_size``; the schedule is known and its
  stage -> rank map (``style``), stages per rank, stage count and microbatch count
  (DualPipeV: one per stage at least) agree; each stage has its index and the rank the
  map gives it;
* the split: every unit of ``module_order`` is owned by exactly one stage, the stages
  read in order give back ``module_order``, no stage is empty, repeated layers run in
  index order from 0 (their count is ``source.structure.num_hidden_layers`` when known),
  every planned module lies inside one stage (or it would span a boundary), and the
  replicated (parameter-free) modules own no planned parameter;
* the boundary: one activation, not partial, tp-sharded on the sequence exactly when the
  plan is sequence parallel;
* tied weights: every ``tied_pairs`` pair whose parameters land on different stages is
  declared in ``tied_across_stages`` with the owning stages;
* the loss contract is the exact one (sum per microbatch, global valid-token normaliser,
  ``scale_grads`` false); a split backward (zero bubble) has no tp-partial gradients
  (:func:`hpcodegen.plan.pipeline_build.split_backward_partials`, generate's rule too);
* the action list parses, passes :func:`hpcodegen.plan.schedule_sim.simulate` (every
  forward before its backward, complete microbatches, sends matched in order, no
  deadlock), matches ``actions_sha256``; one that is not the named schedule's is a warning.

``parallel_dims.pp_size > 1`` without the section is a warning: hpcodegen cannot run it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from hpcodegen.checks.context import CheckContext, as_dict
from hpcodegen.errors import Finding, error, pointer, warning
from hpcodegen.placement import REPLICATE, Partial, parse_placement
from hpcodegen.plan.pipeline import Pipeline, boundary_placements, owning_stage
from hpcodegen.plan.pipeline_build import split_backward_message, split_backward_partials
from hpcodegen.plan.schedule import (
    actions_digest,
    build_actions,
    parse_action,
    schedule_spec,
    stage_rank,
)
from hpcodegen.plan.schedule_sim import simulate

_LAYER = re.compile(r"^(.*)\.(\d+)$")
_P = "pipeline"


def check_pipeline(ctx: CheckContext) -> Iterator[Finding]:
    """The rules of the module docstring, each finding at its JSON pointer."""
    plan = ctx.plan
    pipe = plan.pipeline
    pp = plan.dims.size("pp")
    if pipe is None:
        if pp > 1 and "pipeline" not in ctx.meta:
            yield warning("plan.pp_without_pipeline", pointer("parallel_dims", "pp_size"),
                          f"pp_size {pp} but no pipeline section: no stage split is frozen, "
                          "hpcodegen cannot run or check this pipeline",
                          hint="hpcodegen generate --pp N writes one")
        return
    yield from _shape(pipe, pp)
    yield from _split(pipe, ctx)
    yield from _boundary(pipe, plan.dims.sequence_parallel is True, plan.dims.size("cp"))
    yield from _tied(pipe, plan.tied_pairs or ())
    yield from _loss(pipe)
    partial = split_backward_partials(plan.entries, pipe.schedule, plan.dims.size("tp"))
    if partial:
        yield error("plan.pp_split_backward", pointer(_P, "schedule"),
                    split_backward_message(pipe.schedule, partial),
                    hint="freeze 1F1B or Interleaved1F1B with this plan")
    yield from _actions(pipe)


def _shape(pipe: Pipeline, pp: int) -> Iterator[Finding]:
    if pipe.pp_size != pp:
        yield error("plan.pp_size", pointer(_P, "pp_size"), f"pipeline pp_size {pipe.pp_size} "
                    f"differs from parallel_dims.pp_size {pp}", expected=str(pp))
    try:
        spec = schedule_spec(pipe.schedule)
    except ValueError as exc:
        yield error("plan.pp_schedule", pointer(_P, "schedule"), str(exc))
        return
    if pipe.style != spec.style:
        yield error("plan.pp_style", pointer(_P, "style"), f"{pipe.schedule} maps stages "
                    f"to ranks {spec.style!r}, not {pipe.style!r}", expected=spec.style)
    want = spec.stages_per_rank
    if (want is not None and pipe.stages_per_rank != want) or \
            (want is None and pipe.stages_per_rank < 2):
        yield error("plan.pp_stages_per_rank", pointer(_P, "stages_per_rank"),
                    f"{pipe.schedule} runs {want if want else '2 or more'} stage(s) per rank, "
                    f"not {pipe.stages_per_rank}", expected=str(want or ">= 2"))
    problem = spec.microbatch_problem(pipe.pp_size, pipe.n_microbatches, pipe.stages_per_rank)
    if problem:
        yield error("plan.pp_microbatches", pointer(_P, "n_microbatches"), problem,
                    expected=f">= {pipe.pp_size * (want or pipe.stages_per_rank)}")
    n = pipe.pp_size * pipe.stages_per_rank
    if pipe.n_stages != n:
        yield error("plan.pp_stage_count", pointer(_P, "stages"), f"{pipe.n_stages} stages, "
                    f"expected pp_size x stages_per_rank = {n}", expected=str(n))
    for i, stage in enumerate(pipe.stages):
        if stage.index != i:
            yield error("plan.pp_stage_index", pointer(_P, "stages", i, "index"),
                        f"stage #{i} says index {stage.index}", expected=str(i))
        rank = stage_rank(i, pipe.pp_size, pipe.style)
        if stage.rank != rank:
            yield error("plan.pp_stage_rank", pointer(_P, "stages", i, "rank"),
                        f"stage {i} on rank {stage.rank}, but the {pipe.style!r} map of "
                        f"{pipe.schedule} puts it on rank {rank}", expected=str(rank))


def _split(pipe: Pipeline, ctx: CheckContext) -> Iterator[Finding]:
    seen: dict[str, int] = {}
    flat: list[tuple[str, int, int]] = []
    for i, stage in enumerate(pipe.stages):
        if not stage.modules:
            yield error("plan.pp_empty_stage", pointer(_P, "stages", i, "modules"),
                        f"stage {i} owns no module: an empty stage wastes a rank and "
                        "deadlocks some runtimes", expected="one module or more")
        for k, fqn in enumerate(stage.modules):
            if fqn in seen:
                yield error("plan.pp_module_twice", pointer(_P, "stages", i, "modules", k),
                            f"{fqn} is owned by stage {seen[fqn]} and stage {i}",
                            expected="each module in exactly one stage")
                continue
            seen[fqn] = i
            flat.append((fqn, i, k))
    order = pipe.module_order
    if order is None:
        yield error("plan.pp_module_order", pointer(_P), "no module_order: the forward order "
                    "of the split units is needed to check the split")
    else:
        for k, fqn in enumerate(order):
            if fqn not in seen:
                yield error("plan.pp_module_missing", pointer(_P, "module_order", k),
                            f"{fqn} is in no stage", expected="each module in exactly one stage")
        for fqn, i, k in (x for x in flat if x[0] not in set(order)):
            yield error("plan.pp_module_unknown", pointer(_P, "stages", i, "modules", k),
                        f"{fqn} is not in module_order")
        known = set(order)
        want = [f for f in order if f in seen]
        for (fqn, i, k), expect in zip([x for x in flat if x[0] in known], want, strict=False):
            if fqn != expect:
                yield error("plan.pp_forward_order", pointer(_P, "stages", i, "modules", k),
                            f"stage {i} runs {fqn} where the forward order runs {expect}: "
                            "stages must follow the model's forward", expected=expect)
                break
    yield from _layers(flat, ctx)
    yield from _planned(pipe, ctx)


def _layers(flat: list[tuple[str, int, int]], ctx: CheckContext) -> Iterator[Finding]:
    """Repeated layers run from index 0 up, one by one, across the stages."""
    nxt: dict[str, int] = {}
    broken: set[str] = set()  # one finding per layer list: the first break
    for fqn, i, k in flat:
        m = _LAYER.match(fqn)
        if m is None:
            continue
        prefix, index = m[1], int(m[2])
        want = nxt.get(prefix, 0)
        if index != want and prefix not in broken:
            broken.add(prefix)
            yield error("plan.pp_layer_order", pointer(_P, "stages", i, "modules", k),
                        f"{fqn} runs where {prefix}.{want} is next", expected=f"{prefix}.{want}")
        nxt[prefix] = max(index, want) + 1
    layers = as_dict(as_dict(ctx.meta.get("source")).get("structure")).get("num_hidden_layers")
    if isinstance(layers, int) and nxt and max(nxt.values()) != layers:
        prefix = max(nxt, key=lambda p: nxt[p])
        yield error("plan.pp_layer_count", pointer(_P, "module_order"),
                    f"the stages run {nxt[prefix]} of {prefix}.*, the model has "
                    f"num_hidden_layers = {layers}", expected=str(layers))


def _planned(pipe: Pipeline, ctx: CheckContext) -> Iterator[Finding]:
    """Each plan entry inside one stage; replicated modules own no planned parameter."""
    owner = pipe.stage_of()
    replicated = pipe.replicated_modules or ()
    for fqn in replicated:
        if fqn in owner:
            yield error("plan.pp_replicated_owned", pointer(_P, "replicated_modules"),
                        f"{fqn} is replicated on every stage and owned by stage {owner[fqn]}")
    for fqn, entry in ctx.plan.entries.items():
        if any(fqn == r or fqn.startswith(r + ".") for r in replicated):
            if entry.params:
                yield error("plan.pp_replicated_params", pointer("param_plan", fqn),
                            f"{fqn} has planned parameters but lies in a replicated module: "
                            "a replicated module must be parameter-free")
            continue
        if owning_stage(fqn, owner) is not None:
            continue
        under = sorted({s for unit, s in owner.items() if unit.startswith(f"{fqn}.") or not fqn})
        if len(under) == 1:
            continue
        what = (f"spans stages {under}: a boundary must lie inside one stage" if under
                else "lies in no stage")
        yield error("plan.pp_entry_stage", pointer("param_plan", fqn), f"{fqn or '<root>'} {what}")


def _boundary(pipe: Pipeline, sp: bool, cp: int) -> Iterator[Finding]:
    where = pointer(_P, "boundary")
    if pipe.boundary is None:
        yield error("plan.pp_boundary", where, "no boundary: what crosses a stage boundary "
                    "(the activation and its placement) must be declared")
        return
    placements = pipe.boundary.placements or {}
    for axis, placement in placements.items():
        if isinstance(placement, Partial):
            yield error("plan.pp_boundary", pointer(_P, "boundary", "placements", axis),
                        f"the activation is sent {placement} on {axis}: a partial value "
                        "cannot cross a stage boundary", expected="R or S(n)")
    want = boundary_placements(sp=sp, cp=cp)
    for axis in ("tp", "cp"):
        sent = placements.get(axis, REPLICATE)
        wanted = parse_placement(want[axis]) if axis in want else REPLICATE
        if sent != wanted:
            why = (f"sequence_parallel is {sp}" if axis == "tp"
                   else f"cp_size is {cp}")
            yield error("plan.pp_boundary", pointer(_P, "boundary", "placements", axis),
                        f"activation {axis} {sent} but {why}: between layers the hidden "
                        f"states are {wanted} on {axis}", expected=str(wanted))


def _tied(pipe: Pipeline, pairs: Any) -> Iterator[Finding]:
    owner = pipe.stage_of()
    declared = {frozenset(t.params) for t in pipe.tied_across_stages or ()}
    for i, t in enumerate(pipe.tied_across_stages or ()):
        want = [owning_stage(p, owner) for p in t.params]
        if list(t.stages) != want:
            yield error("plan.pp_tied_stages", pointer(_P, "tied_across_stages", i, "stages"),
                        f"{list(t.params)} are owned by stages {want}, not {list(t.stages)}",
                        expected=str(want))
    for k, pair in enumerate(pairs):
        stages = {owning_stage(p, owner) for p in pair}
        if len(stages) > 1 and frozenset(pair) not in declared:
            yield error("plan.pp_tied_missing", pointer(_P, "tied_across_stages"),
                        f"tied pair {list(pair)} (tied_pairs/{k}) lands on stages "
                        f"{sorted(s for s in stages if s is not None)} but is not declared: "
                        "their gradients must be summed between the stages",
                        expected=f"an entry with params {list(pair)}")


def _loss(pipe: Pipeline) -> Iterator[Finding]:
    loss = pipe.loss
    if loss is None or not loss.exact:
        yield error("plan.pp_loss", pointer(_P, "loss"), "the loss contract is not the exact "
                    "one: gradients would be scaled differently with and without pp",
                    expected='{"reduction": "sum", "normalizer": "global_valid_tokens", '
                             '"scale_grads": false}',
                    hint="torch's default scale_grads=True divides gradients by the "
                         "microbatch count")


def _parsed(pipe: Pipeline) -> tuple[dict[int, list], list[Finding]]:
    out: dict[int, list] = {}
    bad: list[Finding] = []
    for rank, texts in (pipe.actions or {}).items():
        if not rank.isdigit():
            bad.append(error("plan.pp_actions", pointer(_P, "actions", rank),
                             f"rank key {rank!r} is not a rank number"))
            continue
        acts = []
        for i, text in enumerate(texts):
            try:
                acts.append(parse_action(text))
            except ValueError as exc:
                bad.append(error("plan.pp_actions", pointer(_P, "actions", rank, i), str(exc)))
        out[int(rank)] = acts
    return out, bad


def _actions(pipe: Pipeline) -> Iterator[Finding]:
    if not pipe.actions:
        yield error("plan.pp_actions", pointer(_P, "actions"), "no frozen action list: the "
                    "schedule each rank runs must be frozen and validated")
        return
    actions, bad = _parsed(pipe)
    yield from bad
    if bad:
        return
    if pipe.actions_sha256 != actions_digest(actions):
        yield error("plan.pp_actions_digest", pointer(_P, "actions_sha256"),
                    "the action list does not match its digest (edited after generate?)",
                    expected=actions_digest(actions))
    sim = simulate(actions, pp=pipe.pp_size, n_stages=pipe.n_stages,
                   n_microbatches=pipe.n_microbatches, style=pipe.style)
    for p in sim.problems:
        parts = [] if p.rank is None else [str(p.rank)] + ([] if p.index is None else [p.index])
        yield error(f"plan.pp_actions_{p.code}", pointer(_P, "actions", *parts), p.message)
    if sim.ok:
        yield from _named_schedule(pipe, actions)


def _named_schedule(pipe: Pipeline, actions: Mapping[int, list]) -> Iterator[Finding]:
    try:
        built = build_actions(pipe.schedule, pipe.pp_size, pipe.n_microbatches,
                              pipe.stages_per_rank)
    except ValueError:
        return  # the shape findings say why
    if built != actions:
        yield warning("plan.pp_actions_custom", pointer(_P, "actions"),
                      f"the frozen action list is valid but is not hpcodegen's "
                      f"{pipe.schedule} order; it runs as frozen")
