"""The pipeline part of ``inspect-plan``: per stage what it holds and sends, the bubble, and
a timeline a person can open (pure: no torch).

Everything comes from the frozen section and :func:`hpcodegen.plan.schedule_sim.simulate`
run on its action list (F=1, B=2, I=W=1, stages weighted by their parameter counts when
the meta records them): the bubble fraction, the microbatches each stage holds
activations for at once, and the sends. Bytes need a microbatch shape: with
``--hf-config --batch --seq`` one activation is ``batch/microbatches x seq/cp x hidden``
elements, divided by tp when the boundary is sequence-sharded on tp (``S(1)``); its
gradient comes back the same size. Under loss parallelism the last stage's row lists the
vocab-parallel cross entropy's all-reduces over tp, per microbatch (the non-pipelined
report's ``volume.loss_parallel`` figure, for one microbatch's tokens).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hpcodegen.errors import UsageError, error
from hpcodegen.placement import Shard
from hpcodegen.plan.pipeline import Pipeline, fold_modules
from hpcodegen.plan.schedule import parse_action
from hpcodegen.plan.schedule_sim import Problem, Simulation, simulate
from hpcodegen.plan.types import TP, Plan
from hpcodegen.plan.volume import LOSS_PARALLEL_REDUCES, loss_parallel_reduce_bytes


def simulate_pipeline(pipe: Pipeline) -> Simulation:
    """The frozen action list, simulated (verify has checked it; an unreadable or invalid
    one, read with ``--no-checks``, comes back with its problems and no timeline)."""
    try:
        actions = {int(r): [parse_action(a) for a in acts]
                   for r, acts in (pipe.actions or {}).items()}
    except ValueError as exc:
        return Simulation(problems=[Problem("actions", None, None, str(exc))])
    return simulate(actions, pp=pipe.pp_size, n_stages=pipe.n_stages,
                    n_microbatches=pipe.n_microbatches, style=pipe.style)


def activations_in_flight(pipe: Pipeline, per_microbatch: Mapping[int, int] | int,
                          sim: Simulation | None = None) -> dict[int, int | None]:
    """Bytes of activations each stage holds at its peak under the frozen schedule: the
    microbatches it holds at once (the simulation's ``in_flight``) times one microbatch's
    bytes (one figure for every stage, or ``{stage index: bytes}``); None where the action
    list cannot be simulated. ``inspect-plan`` (boundary activations) and the launch's
    memory check (a stage's whole activations) both read it, so the count is one rule."""
    sim = sim if sim is not None else simulate_pipeline(pipe)
    out: dict[int, int | None] = {}
    for stage in pipe.stages:
        held = sim.in_flight.get(stage.index)
        each = per_microbatch if isinstance(per_microbatch, int) \
            else per_microbatch.get(stage.index, 0)
        out[stage.index] = None if held is None else held * each
    return out


def activation_elements(plan: Plan, pipe: Pipeline, config: Mapping[str, Any],
                        batch: int, seq: int) -> int:
    """Elements of one microbatch's boundary activation on one rank."""
    hidden = config.get("hidden_size") or config.get("n_embd") or config.get("d_model")
    if not isinstance(hidden, int):
        raise UsageError([error("inspect.pp_hidden", "--hf-config",
                                "the config names no hidden size (hidden_size, n_embd, d_model)")])
    if batch % pipe.n_microbatches:
        raise UsageError([error("inspect.usage", "--batch", f"--batch {batch} does not split "
                                f"into {pipe.n_microbatches} microbatches",
                                expected=f"a multiple of {pipe.n_microbatches}")])
    mb = batch // pipe.n_microbatches
    placements = (pipe.boundary.placements if pipe.boundary else None) or {}
    shards = 1  # the frozen boundary says which axes cut the sequence (tp under sp, cp)
    for axis, placement in placements.items():
        if placement == Shard(1):
            shards *= plan.dims.size(axis)
    return mb * seq * hidden // shards


def loss_collectives(plan: Plan, pipe: Pipeline, batch: int | None,
                     seq: int | None) -> list[dict[str, Any]]:
    """The last stage's collectives over tp under loss parallelism (none without): the
    cross entropy's all-reduces per microbatch, with bytes when the shape is known (one
    microbatch's tokens on a rank: ``batch/m x seq/cp``; the head's output keeps the whole
    sequence of the rank's cp shard, sequence parallel or not)."""
    heads = plan.vocab_sharded_heads()
    if not heads:
        return []
    row: dict[str, Any] = {"kind": "all_reduce", "axis": TP, "direction": "forward",
                           "why": "loss_parallel", "heads": heads,
                           "count_per_microbatch": LOSS_PARALLEL_REDUCES}
    if batch is not None and seq is not None and batch % pipe.n_microbatches == 0:
        tokens = batch // pipe.n_microbatches * seq // plan.dims.size("cp")
        row["bytes_per_microbatch"] = loss_parallel_reduce_bytes(tokens, plan.dims.size(TP))
    return [row]


def pipeline_report(plan: Plan, *, config: Mapping[str, Any] | None = None,
                    batch: int | None = None, seq: int | None = None,
                    element_bytes: int = 2) -> dict[str, Any] | None:
    """The ``pipeline`` key of ``inspect-plan --json`` (None: the plan is not pipelined)."""
    pipe = plan.pipeline
    if pipe is None:
        return None
    sim = simulate_pipeline(pipe)
    act_bytes = None
    if config is not None and batch is not None and seq is not None:
        act_bytes = activation_elements(plan, pipe, config, batch, seq) * element_bytes
    held = activations_in_flight(pipe, act_bytes, sim) if act_bytes is not None else {}
    stages = []
    for stage in pipe.stages:
        sends = {k: sum(1 for a in pipe.actions.get(str(stage.rank), ())
                        if a.startswith(f"{stage.index}{k}")) for k in ("SEND_F", "SEND_B")}
        row = {"index": stage.index, "rank": stage.rank, "modules": list(stage.modules),
               "modules_folded": fold_modules(stage.modules),
               "params": stage.params, "params_per_rank": stage.params_per_rank,
               "in_flight": sim.in_flight.get(stage.index),
               "sends_per_step": sends,
               "collectives": loss_collectives(plan, pipe, batch, seq)
               if stage.index == pipe.n_stages - 1 else []}
        if act_bytes is not None:
            row["p2p_forward_bytes_per_microbatch"] = act_bytes if sends["SEND_F"] else 0
            row["p2p_backward_bytes_per_microbatch"] = act_bytes if sends["SEND_B"] else 0
            if held.get(stage.index) is not None:
                row["activation_bytes_in_flight"] = held[stage.index]
        stages.append(row)
    return {"schedule": pipe.schedule, "pp": pipe.pp_size, "style": pipe.style,
            "stages_per_rank": pipe.stages_per_rank, "n_microbatches": pipe.n_microbatches,
            "bubble": round(sim.bubble, 6), "valid": sim.ok,
            "tied_across_stages": [list(t.params) for t in pipe.tied_across_stages or ()],
            "stages": stages, "p2p": _p2p(sim, act_bytes)}


def _p2p(sim: Simulation, act_bytes: int | None) -> list[dict[str, Any]]:
    """The point-to-point collectives of one step, by direction, over the ``pp`` axis."""
    out = []
    for kind, direction in (("SEND_F", "forward"), ("SEND_B", "backward")):
        n = sim.sends.get(kind, 0)
        row: dict[str, Any] = {"kind": "send_recv", "axis": "pp", "direction": direction,
                               "count_per_step": n}
        if act_bytes is not None:
            row["bytes_per_microbatch"] = act_bytes
            row["bytes_per_step"] = act_bytes * n
        out.append(row)
    return out


def chrome_trace(pipe: Pipeline) -> dict[str, Any]:
    """The simulated schedule as a Chrome trace (chrome://tracing, Perfetto): one row per
    pp rank, one slice per compute, 1 time unit = 1 ms (F=1, B=2, I=W=1)."""
    sim = simulate_pipeline(pipe)
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": 0, "args": {"name": f"{pipe.schedule} "
         f"pp={pipe.pp_size} m={pipe.n_microbatches} bubble={sim.bubble:.3f}"}}]
    for r in range(pipe.pp_size):
        events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": r,
                       "args": {"name": f"pp rank {r}"}})
    for span in sim.timeline:
        a = span.action
        events.append({"name": f"{a.kind}{a.mb}", "cat": a.kind, "ph": "X", "pid": 0,
                       "tid": span.rank, "ts": span.start * 1000, "dur": (span.end - span.start)
                       * 1000, "args": {"stage": a.stage, "microbatch": a.mb}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_timeline(pipe: Pipeline | None, path: str) -> None:
    """Write :func:`chrome_trace` to ``path`` atomically; a plan without a pipeline or an
    unwritable path is a usage error."""
    from hpcodegen.atomic import write_atomic

    if pipe is None:
        raise UsageError([error("inspect.usage", "--timeline", "the plan has no pipeline "
                                "section: there is no schedule to draw")])
    target = Path(path)
    if not target.parent.is_dir():
        raise UsageError([error("inspect.usage", "--timeline", f"{target.parent} is not a "
                                "directory", expected="a file path in an existing directory")])
    trace = chrome_trace(pipe)
    write_atomic(target, lambda stream: json.dump(trace, stream))


def text_lines(report: Mapping[str, Any]) -> list[str]:
    """Plain lines for the text output: one per stage, then the bubble and the p2p."""
    lines = [f"pipeline: {report['schedule']} pp={report['pp']} "
             f"({report['stages_per_rank']} stage(s)/rank, {report['style']}), "
             f"{report['n_microbatches']} microbatches, bubble {report['bubble']:.3f}"]
    for s in report["stages"]:
        params = f", {s['params']:,} params" if s.get("params") is not None else ""
        bytes_ = ""
        if "p2p_forward_bytes_per_microbatch" in s:
            bytes_ = (f", p2p/microbatch fwd {s['p2p_forward_bytes_per_microbatch']:,} B "
                      f"bwd {s['p2p_backward_bytes_per_microbatch']:,} B")
        lines.append(f"  stage {s['index']} (rank {s['rank']}): {s['modules_folded']}{params}, "
                     f"{s['in_flight']} microbatch(es) of activations in flight{bytes_}")
        for c in s.get("collectives", ()):
            size = (f", {c['bytes_per_microbatch']:,.0f} B" if "bytes_per_microbatch" in c
                    else "")
            lines.append(f"    {c['why']}: {c['count_per_microbatch']} {c['kind']} over "
                         f"{c['axis']} per microbatch{size}")
    for p in report["p2p"]:
        lines.append(f"  pp {p['direction']}: {p['count_per_step']} send/recv per step"
                     + (f", {p['bytes_per_step']:,} B" if "bytes_per_step" in p else ""))
    return lines
