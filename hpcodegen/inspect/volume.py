"""The volume part of ``inspect-plan --hf-config``: trace shapes, then bytes per collective.

Kept apart from :mod:`hpcodegen.inspect.run` because it is the only path that loads torch
(through :mod:`hpcodegen.inspect.trace`). The formula is in :mod:`hpcodegen.plan.volume`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from hpcodegen.errors import UsageError, error, warning
from hpcodegen.hf import config_int, read_hf_config
from hpcodegen.inspect.options import Inspection, InspectOptions
from hpcodegen.placement import is_shard
from hpcodegen.plan.cp import CP, cp_op_bytes, ulysses_degree
from hpcodegen.plan.estimated import CONTEXT_PARALLEL, EXPERT_PARALLEL
from hpcodegen.plan.moe import DISPATCH_NAMES, EP, dispatch_volume, expert_count
from hpcodegen.plan.norms import norm_bytes
from hpcodegen.plan.predict import takes_token_ids
from hpcodegen.plan.volume import (
    DEFAULT_LINK_LATENCY_US,
    BoundaryVolume,
    OpVolume,
    dtype_bytes,
    loss_parallel_reduce_bytes,
    ring_factor,
    seconds,
    transition_volume,
)

if TYPE_CHECKING:
    from hpcodegen.inspect.trace import TraceResult, TraceTarget
    from hpcodegen.plan.types import Plan, PlanEntry

#: the plan's entries by module FQN
Entries = Mapping[str, "PlanEntry"]


def trace_targets(result: Inspection, entries: Entries) -> list[TraceTarget]:
    """What the tracer records per boundary (inspect-plan --hf-config and generate's cost)."""
    from hpcodegen.inspect.trace import TraceTarget

    targets = []
    for p in result.preds:
        if not p.transitions:
            continue
        entry = entries[p.fqn]
        ins = tuple(t.name for t in p.transitions if t.side == "in")
        outs = tuple((t.name, entry.output_index(t.name))
                     for t in p.transitions if t.side == "out")
        targets.append(TraceTarget(p.fqn, ins, outs))
    return targets


def _check_sizes(result: Inspection) -> None:
    missing = [a for a in result.axes if a not in result.sizes]
    if missing:
        raise UsageError([error("inspect.unknown_axis_size", "/parallel_dims",
                                f"size of mesh axis {', '.join(missing)} unknown",
                                hint="pass --mesh, e.g. --mesh tp=2")])


def _dispatch_ops(p: Any, trace: TraceResult, config: Any, float_bytes: int,
                  sizes: Any, ep: int) -> list[OpVolume]:
    """The collectives of an expert-parallel region's dispatch (:mod:`hpcodegen.plan.moe`),
    in bytes per rank from the traced tokens, top-k and hidden size; under sequence
    parallelism (the hidden states arrive sharded on tp) a rank dispatches its slice."""
    names = {o.name for o in p.in_ops + p.out_ops + p.grad_ops}
    if p.form != "region" or ("counts" not in names and "tp_gather" not in names):
        return []
    inputs = [t for t in p.transitions if t.side == "in"]
    hidden = trace.tensors.get((p.fqn, "in", inputs[0].name)) if inputs else None
    index = trace.tensors.get((p.fqn, "in", inputs[1].name)) if len(inputs) > 1 else None
    if hidden is None or index is None or len(hidden[0]) < 1 or len(index[0]) < 1:
        return []
    tokens = math.prod(hidden[0][:-1])
    tp = sizes.get("tp", 1)
    if any(is_shard(pl) for pl in inputs[0].src) and tp > 1:
        tokens //= tp  # this rank's slice of the tokens
    experts = expert_count(config)
    vol = dispatch_volume(tokens, index[0][-1], hidden[0][-1], experts, float_bytes,
                          ep, tp if "tp_gather" in names else 1)
    row = (tokens * index[0][-1], hidden[0][-1])
    out = []
    for direction, ops in (("forward", p.in_ops + p.out_ops), ("backward", p.grad_ops)):
        for op in ops:
            if op.name not in DISPATCH_NAMES:
                continue
            shape = (experts,) if op.name.endswith("counts") else row
            side = "out" if op.name in ("combine", "tp_scatter") else "in"
            out.append(OpVolume(direction, side, op.name, op.kind, op.axis or "", None, shape,
                                vol.of_name(op.name)))
    return out


def _cp_ops(p: Any, trace: TraceResult, result: Inspection, entries: Entries,
            float_bytes: int, batch: int, seq: int, ulysses: int = 1) -> list[OpVolume]:
    """The cp collectives of a CP attention from the traced kernel tensors (kv heads, not
    expanded): K/V all_gathers forward and reduce_scatters backward, Ulysses' all_to_alls
    of Q/K/V and the output both ways (:func:`hpcodegen.plan.cp.cp_op_bytes`); the root's
    gather of the batch's position ids (int64)."""
    cp = result.sizes.get(CP, 1)
    if p.form == "cp_batch":
        return [OpVolume("forward", "in", op.name, op.kind, CP, op.dim, (batch, seq),
                         ring_factor("all_gather", cp) * batch * seq * 8) for op in p.in_ops]
    out: list[OpVolume] = []
    entry = entries.get(p.fqn)
    split = result.sizes.get("tp", 1) if entry is not None and entry.splits_compute() else 1
    kv = trace.attention.get((p.fqn, "key"))
    # the existing system's CP wrapper: its K/V gathers are counted by estimate
    note = next((n for kind, n in p.estimated if kind == CONTEXT_PARALLEL), "")
    for direction, ops in (("forward", p.in_ops + p.out_ops), ("backward", p.grad_ops)):
        for op in ops:
            shape = trace.attention.get((p.fqn, op.name)) if op.axis == CP else None
            if op.axis != CP or shape is None:
                continue
            side = "out" if op.name == "output" else "in"
            out.append(OpVolume(direction, side, op.name, op.kind, CP, op.dim, shape,
                                cp_op_bytes(op.name, op.kind, shape, float_bytes, cp,
                                            ulysses, split, kv[1] if kv else 0),
                                estimated=note))
    return out


def _norm_ops(p: Any, trace: TraceResult, sizes: Any) -> list[OpVolume]:
    """The per-token sum-of-squares all_reduces of a norm split over tp (plan.norms)."""
    ops = [(d, o) for d, group in (("forward", p.in_ops), ("backward", p.grad_ops))
           for o in group if o.name == "sum_of_squares"]
    inputs = [t for t in p.transitions if t.side == "in"]
    info = trace.tensors.get((p.fqn, "in", inputs[0].name)) if ops and inputs else None
    if info is None:
        return []
    tokens = math.prod(info[0][:-1])
    nbytes = norm_bytes(tokens, sizes.get("tp", 1))
    return [OpVolume(d, "in", o.name, o.kind, o.axis or "", None, (*info[0][:-1], 1), nbytes)
            for d, o in ops]


#: module names of an LM head, whose output is the logits (``batch x seq x vocab``)
HEAD_NAMES = frozenset({"lm_head", "embed_out", "output_layer", "head"})


def _untraced_info(fqn: str, side: str, config: Mapping[str, Any], batch: int,
                   seq: int) -> tuple[tuple[tuple[int, ...], None], str] | None:
    """An estimate of a boundary tensor the trace did not see (a head called on a slice
    of the hidden states, a model whose forward routes around the hook): the hidden
    states, ``batch x seq x hidden_size``, or the logits for a head's output; with the
    note the volume shows. None when the config names no hidden size."""
    hidden = config_int(config, "hidden_size", "n_embd", "d_model")
    width, what = hidden, "hidden_size"
    if side == "out" and fqn.rsplit(".", 1)[-1] in HEAD_NAMES:
        width, what = config_int(config, "vocab_size"), "vocab_size"
    if width is None:
        return None
    return ((batch, seq, width), None), (f"not traced: taken as batch x seq x {what} "
                                        f"({batch}, {seq}, {width})")


def _estimated_dispatch_ops(p: Any, entry: Any, config: Mapping[str, Any],
                            float_bytes: int, sizes: Any, ep: int, batch: int,
                            seq: int) -> list[OpVolume]:
    """The all_to_alls of the existing system's expert compute (:mod:`hpcodegen.plan.
    estimated`), from the config: ``batch x seq`` tokens divided by every axis the
    module's input arrives sharded on, ``num_experts_per_tok`` and ``hidden_size``."""
    names = {o.name for o in p.in_ops + p.out_ops + p.grad_ops}
    if not any(kind == EXPERT_PARALLEL for kind, _ in p.estimated) or "counts" not in names:
        return []
    top_k = config_int(config, "num_experts_per_tok", "moe_topk", "top_k")
    hidden = config_int(config, "hidden_size", "d_model")
    if top_k is None or hidden is None:
        return []
    src = (entry.in_src or {}) if entry is not None else {}
    first = next(iter(src.values()), {})
    shards = math.prod(sizes.get(axis, 1) for axis, pl in first.items() if is_shard(pl))
    tokens = max(batch * seq // max(shards, 1), 1)
    experts = expert_count(config)
    vol = dispatch_volume(tokens, top_k, hidden, experts, float_bytes, ep, 1)
    note = (f"estimated from the config: {tokens} tokens x top-{top_k} x hidden {hidden} "
            f"over ep {ep} (balanced routing)")
    out = []
    for direction, ops in (("forward", p.in_ops + p.out_ops), ("backward", p.grad_ops)):
        for op in ops:
            if op.name not in DISPATCH_NAMES:
                continue
            shape = (experts,) if op.name.endswith("counts") else (tokens * top_k, hidden)
            side = "out" if op.name == "combine" else "in"
            out.append(OpVolume(direction, side, op.name, op.kind, op.axis or "", None, shape,
                                vol.of_name(op.name), estimated=note))
    return out


def boundary_volumes(result: Inspection, entries: Entries, trace: TraceResult,
                     float_bytes: int, config: Any = None, ep: int = 1, batch: int = 1,
                     seq: int = 1, records: Any = None) -> dict[str, BoundaryVolume]:
    """Each boundary's bytes per collective from the traced shapes (shared with generate)."""
    out: dict[str, BoundaryVolume] = {}
    config = config or {}
    cp = result.sizes.get(CP, 1)
    for p in result.preds:
        entry = entries.get(p.fqn)
        degree = ulysses_degree((records or {}).get(p.fqn), cp)
        cp_ops = _cp_ops(p, trace, result, entries, float_bytes, batch, seq, degree)
        dispatch = _dispatch_ops(p, trace, config, float_bytes, result.sizes, ep) or \
            _estimated_dispatch_ops(p, entry, config, float_bytes, result.sizes, ep, batch,
                                    seq)
        if not p.transitions and not cp_ops and not dispatch:
            continue
        bv = BoundaryVolume(p.fqn)
        bv.ops.extend(cp_ops)
        bv.ops.extend(dispatch)
        bv.ops.extend(_norm_ops(p, trace, result.sizes))
        for t in p.transitions:
            info = trace.tensors.get((p.fqn, t.side, t.name))
            note = ""
            if info is None:  # not traced: estimated from the config, and said so
                guess = _untraced_info(p.fqn, t.side, config, batch, seq)
                if guess is not None:
                    info, note = guess
            backward = not (t.side == "in" and (takes_token_ids(p.cls)
                                                or t.name in (entry.no_grad_inputs or ())))
            bv.ops.extend(transition_volume(t, entry, result.axes, result.sizes,
                                            info, float_bytes, backward, note))
        out[p.fqn] = bv
    return out


def _by_collective(volumes: dict[str, BoundaryVolume]) -> list[dict[str, Any]]:
    counts: Counter[tuple[str, str, str, int | None]] = Counter()
    nbytes: Counter[tuple[str, str, str, int | None]] = Counter()
    for bv in volumes.values():
        for op in bv.ops:
            key = (op.direction, op.kind, op.axis, op.dim)
            counts[key] += 1
            nbytes[key] += op.bytes or 0.0
    order = sorted(counts, key=lambda k: (k[0], k[1], k[2], k[3] is not None, k[3] or 0))
    return [{"direction": d, "kind": k, "axis": a, "dim": dim,
             "count": counts[(d, k, a, dim)], "bytes": nbytes[(d, k, a, dim)]}
            for d, k, a, dim in order]


def _rows(result: Inspection, volumes: dict[str, BoundaryVolume]) -> list[dict[str, Any]]:
    rows = []
    for row in result.rows:
        vols = [volumes[f] for f in row.fqns if f in volumes]
        if not vols or not vols[0].ops:
            continue
        rows.append({
            "fqn": row.label, "count": row.count,
            "ops": [op.to_json() for op in vols[0].ops],
            "forward_bytes": sum(v.total("forward") for v in vols),
            "backward_bytes": sum(v.total("backward") for v in vols),
        })
    return rows


def _uneven_findings(volumes: dict[str, BoundaryVolume]) -> list[Any]:
    """One warning per distinct uneven reduce_scatter, naming its first boundary."""
    seen: dict[tuple[str, str], list[str]] = {}
    for bv in volumes.values():
        for op in bv.ops:
            if op.detail:
                seen.setdefault((f"{op.name} ({op.direction})", op.detail), []).append(bv.fqn)
    return [warning("volume.uneven_reduce_scatter", fqns[0],
                    f"{name}: {detail} (on {len(fqns)} boundary instance(s))",
                    hint="choose --seq (or the plan's dim) divisible by the axis size")
            for (name, detail), fqns in seen.items()]


def _with_estimates(findings: list[Any], volumes: dict[str, BoundaryVolume]) -> list[Any]:
    """The trace's findings, an untraced tensor's saying how its bytes were estimated."""
    from dataclasses import replace

    notes = {(bv.fqn, op.side, op.name): op.estimated for bv in volumes.values()
             for op in bv.ops if op.estimated.startswith("not traced")}
    out = []
    for f in findings:
        hit = next((n for (fqn, _, name), n in notes.items()
                    if f.code == "trace.no_tensor" and fqn == f.where
                    and f"{name!r}" in f.message), None)
        out.append(replace(f, message=f.message.replace(
            "its bytes are unknown", f"its bytes are estimated ({hit[len('not traced: '):]})"))
            if hit else f)
    return out


#: what the time estimate includes, said with it
TIME_MODEL = ("bandwidth (bytes x 8 / link_gbps) plus link_latency_us per collective; "
              "ring algorithms, no overlap with compute, no contention")


def _estimated_notes(volumes: dict[str, BoundaryVolume]) -> list[dict[str, Any]]:
    """Every estimate the totals hold: its note, how many ops, their bytes."""
    seen: dict[str, dict[str, Any]] = {}
    for bv in volumes.values():
        for op in bv.ops:
            if op.estimated:
                row = seen.setdefault(op.estimated, {"note": op.estimated, "fqn": bv.fqn,
                                                     "ops": 0, "bytes": 0.0})
                row["ops"] += 1
                row["bytes"] += op.bytes or 0.0
    return list(seen.values())


def _ep_size(plan: Plan, opts: InspectOptions) -> int:
    """The ep group size the dispatch runs over: ``--mesh``'s ``ep``, else the frozen one."""
    if opts.mesh is not None:
        from hpcodegen.inspect.options import parse_mesh

        return parse_mesh(opts.mesh)[1].get(EP, 1)
    return max(plan.dims.size(EP), 1)


def volume_report(plan: Plan, result: Inspection,
                  opts: InspectOptions) -> dict[str, Any]:
    """Trace the model, then bytes per rank per collective, per forward and per backward."""
    from hpcodegen.inspect.trace import trace_boundaries

    float_bytes = dtype_bytes(opts.dtype)
    _check_sizes(result)
    config, _ = read_hf_config(opts.hf_config or "")
    entries = plan.entries
    trace = trace_boundaries(config, trace_targets(result, entries), opts.batch or 1, opts.seq or 1)
    result.findings.extend(
        warning("trace.called_repeatedly", fqn,
                f"called {n} times in one forward; counts and bytes assume once")
        for fqn, n in trace.calls.items() if n > 1)
    volumes = boundary_volumes(result, entries, trace, float_bytes, config, _ep_size(plan, opts),
                       opts.batch or 1, opts.seq or 1, plan.injections_by_fqn())
    result.findings.extend(_with_estimates(trace.findings, volumes))
    result.findings.extend(_uneven_findings(volumes))
    fwd = sum(v.total("forward") for v in volumes.values())
    bwd = sum(v.total("backward") for v in volumes.values())
    n_fwd, n_bwd = (sum(1 for v in volumes.values() for op in v.ops if op.direction == d)
                    for d in ("forward", "backward"))
    latency = DEFAULT_LINK_LATENCY_US if opts.link_latency_us is None else opts.link_latency_us
    report = {
        "dtype": opts.dtype, "batch": opts.batch, "seq": opts.seq,
        "link_gbps": opts.link_gbps,
        "per_forward_bytes": fwd, "per_backward_bytes": bwd,
        "forward_collectives": n_fwd, "backward_collectives": n_bwd,
        "link_latency_us": latency if opts.link_gbps else None,
        "time_model": TIME_MODEL if opts.link_gbps else None,
        "est_forward_s": seconds(fwd, opts.link_gbps, n_fwd, latency),
        "est_backward_s": seconds(bwd, opts.link_gbps, n_bwd, latency),
        "estimated": _estimated_notes(volumes),
        "by_collective": _by_collective(volumes),
        "boundaries": _rows(result, volumes),
    }
    if result.loss_parallel_heads:
        report["loss_parallel"] = loss_parallel_saving(result, config, opts, float_bytes)
    return report


def loss_parallel_saving(result: Inspection, config: Any, opts: InspectOptions,
                         float_bytes: int) -> dict[str, Any]:
    """What keeping the logits vocab-sharded saves: the forward all_gather of the logits
    (``batch x seq x vocab``) over tp that a gathering head runs, per rank (its backward is
    a local chunk, no communication). The vocab-parallel cross entropy adds three
    all_reduces of ``batch x seq`` fp32 values instead (max, sum of exponentials, target)."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    vocab = config.get("vocab_size") or text.get("vocab_size") or 0
    batch, seq, n = opts.batch or 1, opts.seq or 1, result.sizes.get("tp", 1)
    logits = float(batch * seq * vocab * float_bytes)
    saved = ring_factor("all_gather", n) * logits * len(result.loss_parallel_heads)
    added = loss_parallel_reduce_bytes(batch * seq, n)
    return {"heads": result.loss_parallel_heads, "logits_shape": [batch, seq, vocab],
            "gather_bytes_saved": saved, "loss_allreduce_bytes": added}

