"""``generate --pp N``: read the split units off the meta-device model and freeze a pipeline.

The units, in registration order (the forward order of HF causal LMs): every outermost
repeated layer (:func:`hpcodegen.generate.checks.layer_split.layer_blocks`), and every other
module holding parameters that contains no layer (the embedding, the final norm, the
head). Parameter-free modules beside them (rotary embeddings, dropout) are kept on every
stage. The stage runtime feeds a non-first stage's hidden states to the base model as
``inputs_embeds``, so the module holding the layers must take that argument; a model
whose forward does not is refused here rather than at run time.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hpcodegen.errors import PlanError, UsageError, error
from hpcodegen.generate.checks.layer_split import layer_blocks
from hpcodegen.placement import REPLICATE, is_shard
from hpcodegen.plan.entry import join_fqn
from hpcodegen.plan.pipeline import boundary_placements, fold_modules
from hpcodegen.plan.pipeline_build import (
    SplitError,
    Unit,
    build_pipeline,
    split_backward_message,
    split_backward_partials,
    stage_param_counts,
)
from hpcodegen.plan.schedule import SCHEDULES
from hpcodegen.plan.types import TP, PlanEntry


@dataclass(frozen=True)
class PipelineArgs:
    """The ``--pp`` options."""

    pp: int
    schedule: str = "1F1B"
    microbatches: int | None = None
    """None: ``pp`` x stages per rank (enough to fill the pipeline once)."""
    layout: tuple[int, ...] | None = None
    stages_per_rank: int = 2


def parse_layout(text: str | None) -> tuple[int, ...] | None:
    """``"3,5"`` -> ``(3, 5)`` (decoder layers per stage); UsageError otherwise."""
    if text is None:
        return None
    try:
        counts = tuple(int(x) for x in text.split(","))
    except ValueError:
        counts = ()
    if not counts or any(n < 0 for n in counts):
        raise UsageError([error("generate.pp_layout", "--pp-layout", f"cannot read {text!r}",
                                expected="decoder layers per stage, comma-separated, e.g. 3,5")])
    return counts


def check_pp_args(args: PipelineArgs) -> None:
    """Usage errors before the model is built. Every other axis composes: ``--ep`` (its
    ranks are carved inside each stage's data-parallel ranks, see
    :mod:`hpcodegen.launch.rank.mesh`), ``--cp`` and ``--sp`` (the boundary is
    sequence-sharded over cp and over tp, see
    :func:`hpcodegen.plan.pipeline.boundary_placements`; each stage rebuilds its cp batch
    view from the shard it receives, :class:`hpcodegen.runtime.pipeline_stage.StageModule`),
    ``--loss-parallel`` (the last stage takes the loss on its vocabulary slice of the
    logits, :class:`hpcodegen.runtime.pipeline_run.PipelineRunner`)."""
    if args.pp < 2:
        raise UsageError([error("generate.pp", "--pp", f"--pp must be >= 2, got {args.pp}")])
    if args.schedule not in SCHEDULES:
        raise UsageError([error("generate.pp_schedule", "--pp-schedule",
                                f"unknown schedule {args.schedule!r}",
                                expected=", ".join(SCHEDULES))])
    if args.microbatches is not None and args.microbatches < 1:
        raise UsageError([error("generate.pp", "--microbatches", "must be >= 1")])
    if args.microbatches is not None:
        problem = SCHEDULES[args.schedule].microbatch_problem(args.pp, args.microbatches,
                                                             args.stages_per_rank)
        if problem:
            raise UsageError([error("generate.pp_microbatches", "--microbatches", problem,
                                    hint="leave --microbatches out for one per stage")])


def _param_count(module: Any) -> int:
    return sum(p.numel() for _, p in module.named_parameters(remove_duplicate=False))


def model_units(model: Any) -> tuple[list[Unit], list[str], str]:
    """``(units, parameter-free modules, the FQN of the module holding the layers)``."""
    blocks = layer_blocks(model)
    if not blocks:
        raise PlanError([error("generate.pp_no_layers", "--pp", "the model has no repeated "
                               "layers to split into stages")])
    lists = {fqn.rpartition(".")[0] for fqn in blocks}
    if len(lists) != 1:
        raise PlanError([error("generate.pp_layer_lists", "--pp", "the model has several "
                               f"layer lists ({', '.join(sorted(lists))}): one stack is split",
                               hint="pipeline an encoder-decoder or a vision tower later")])
    units: list[Unit] = []
    replicated: list[str] = []

    def walk(prefix: str, module: Any) -> None:
        for name, child in module.named_children():
            fqn = join_fqn(prefix, name)
            if fqn in blocks:
                units.append(Unit(fqn, _param_count(child), True))
            elif not any(b.startswith(f"{fqn}.") for b in blocks):
                count = _param_count(child)
                if count:
                    units.append(Unit(fqn, count, False))
                else:
                    replicated.append(fqn)
            else:
                walk(fqn, child)
    walk("", model)
    layer_list = next(iter(lists))
    return units, replicated, layer_list.rpartition(".")[0]


def _check_base(model: Any, base: str) -> None:
    module = model.get_submodule(base) if base else model
    if "inputs_embeds" not in inspect.signature(module.forward).parameters:
        raise PlanError([error("generate.pp_base", base or "<root>",
                               f"{type(module).__name__}.forward takes no inputs_embeds: a "
                               "stage after the first cannot feed it hidden states")])


def _per_rank(units: Sequence[Unit], model: Any, entries: Mapping[str, PlanEntry],
              tp: int, stages: Sequence[Sequence[str]]) -> list[int]:
    """Parameters one rank of each stage holds: a tp-sharded parameter counts 1/tp."""
    sharded = {join_fqn(fqn, rel) for fqn, entry in entries.items()
               for rel, named in (entry.params or {}).items()
               if is_shard(named.get(TP, REPLICATE))}
    out = []
    for mods in stages:
        total = 0
        for unit in mods:
            module = model.get_submodule(unit)
            for name, p in module.named_parameters(remove_duplicate=False):
                n = p.numel()
                total += n // tp if join_fqn(unit, name) in sharded else n
        out.append(total)
    return out


def pipeline_section(model: Any, entries: Mapping[str, PlanEntry], tp: int, sp: bool,
                     args: PipelineArgs, tied: Sequence[Sequence[str]],
                     notes: list[str] | None, *, cp: int = 1) -> dict[str, Any]:
    """The ``pipeline`` section for ``model`` and its frozen plan ``entries``; a note says
    how it split."""
    units, replicated, base = model_units(model)
    _check_base(model, base)
    spec = SCHEDULES[args.schedule]
    partial = split_backward_partials(entries, args.schedule, tp)
    if partial:
        raise PlanError([error("generate.pp_split_backward", "--pp-schedule",
                               split_backward_message(args.schedule, partial),
                               hint="use 1F1B or Interleaved1F1B with this plan")])
    v = spec.stages_per_rank or args.stages_per_rank
    m = args.microbatches or args.pp * v
    try:
        section = build_pipeline(units, pp=args.pp, schedule=args.schedule, n_microbatches=m,
                                 stages_per_rank=v, layout=args.layout, replicated=replicated,
                                 placements=boundary_placements(sp=sp and tp > 1, cp=cp),
                                 tied=tied)
    except SplitError as exc:
        flag = "--pp-layout" if args.layout is not None else "--pp"
        raise PlanError([error("generate.pp_split", flag, str(exc))]) from None
    stages = [s["modules"] for s in section["stages"]]
    counts = stage_param_counts(units, stages)
    for stage, total, local in zip(section["stages"], counts,
                                   _per_rank(units, model, entries, tp, stages), strict=True):
        stage["params"], stage["params_per_rank"] = total, local
    if notes is not None:
        notes.append(split_note(section, counts, args.layout is None))
    return section


def split_note(section: Mapping[str, Any], counts: Sequence[int], balanced: bool) -> str:
    """One line: the schedule, each stage's layers and parameters, the balance."""
    parts = [f"stage {stage['index']} (rank {stage['rank']}): "
             f"{fold_modules(stage['modules'])}, {n:,} params"
             for stage, n in zip(section["stages"], counts, strict=True)]
    mean = sum(counts) / len(counts)
    how = "balanced by parameter count" if balanced else "--pp-layout"
    return (f"pipeline {section['schedule']} pp={section['pp_size']} "
            f"m={section['n_microbatches']} ({how}, max/mean {max(counts) / mean:.3f}): "
            + "; ".join(parts))
