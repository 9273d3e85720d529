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
from hpcodegen.hf import read_hf_config
from hpcodegen.inspect.options import Inspection, InspectOptions
from hpcodegen.placement import is_shard
from hpcodegen.plan.cp import CP, cp_op_bytes, ulysses_degree
from hpcodegen.plan.moe import DISPATCH_NAMES, EP, dispatch_volume, expert_count
from hpcodegen.plan.norms import norm_bytes
from hpcodegen.plan.predict import takes_token_ids
from hpcodegen.plan.volume import (
    BoundaryVolume,
    OpVolume,
    dtype_bytes,
    ring_factor,
    seconds,
    transition_volume,
)

if TYPE_CHECKING:
    from hpcodegen.inspect.trace import TraceResult, TraceTarget
    from hpcodegen.plan.types import Plan, PlanEntry

#: the plan's entries by module FQN
Entries = Mapping[str, "PlanEntry"]


def _targets(result: Inspection, entries: Entries) -> list[TraceTarget]:
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
    for direction, ops in (("forward", p.in_ops + p.out_ops), ("backward", p.grad_ops)):
        for op in ops:
            shape = trace.attention.get((p.fqn, op.name)) if op.axis == CP else None
            if op.axis != CP or shape is None:
                continue
            side = "out" if op.name == "output" else "in"
            out.append(OpVolume(direction, side, op.name, op.kind, CP, op.dim, shape,
                                cp_op_bytes(op.name, op.kind, shape, float_bytes, cp,
                                            ulysses, split, kv[1] if kv else 0)))
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


def _volumes(result: Inspection, entries: Entries, trace: TraceResult,
             float_bytes: int, config: Any = None, ep: int = 1, batch: int = 1,
             seq: int = 1, records: Any = None) -> dict[str, BoundaryVolume]:
    out: dict[str, BoundaryVolume] = {}
    cp = result.sizes.get(CP, 1)
    for p in result.preds:
        degree = ulysses_degree((records or {}).get(p.fqn), cp)
        cp_ops = _cp_ops(p, trace, result, entries, float_bytes, batch, seq, degree)
        if not p.transitions and not cp_ops:
            continue
        bv = BoundaryVolume(p.fqn)
        bv.ops.extend(cp_ops)
        bv.ops.extend(_dispatch_ops(p, trace, config or {}, float_bytes, result.sizes, ep))
        bv.ops.extend(_norm_ops(p, trace, result.sizes))
        entry = entries.get(p.fqn)
        for t in p.transitions:
            info = trace.tensors.get((p.fqn, t.side, t.name))
            backward = not (t.side == "in" and (takes_token_ids(p.cls)
                                                or t.name in (entry.no_grad_inputs or ())))
            bv.ops.extend(transition_volume(t, entry, result.axes, result.sizes,
                                            info, float_bytes, backward))
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
    trace = trace_boundaries(config, _targets(result, entries), opts.batch or 1, opts.seq or 1)
    result.findings.extend(trace.findings)
    result.findings.extend(
        warning("trace.called_repeatedly", fqn,
                f"called {n} times in one forward; counts and bytes assume once")
        for fqn, n in trace.calls.items() if n > 1)
    volumes = _volumes(result, entries, trace, float_bytes, config, _ep_size(plan, opts),
                       opts.batch or 1, opts.seq or 1, plan.injections_by_fqn())
    result.findings.extend(_uneven_findings(volumes))
    fwd = sum(v.total("forward") for v in volumes.values())
    bwd = sum(v.total("backward") for v in volumes.values())
    report = {
        "dtype": opts.dtype, "batch": opts.batch, "seq": opts.seq,
        "link_gbps": opts.link_gbps,
        "per_forward_bytes": fwd, "per_backward_bytes": bwd,
        "est_forward_s": seconds(fwd, opts.link_gbps),
        "est_backward_s": seconds(bwd, opts.link_gbps),
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
    added = 3 * ring_factor("all_reduce", n) * batch * seq * 4.0
    return {"heads": result.loss_parallel_heads, "logits_shape": [batch, seq, vocab],
            "gather_bytes_saved": saved, "loss_allreduce_bytes": added}

