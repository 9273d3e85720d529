"""Renderers of ``inspect-plan``: the documented JSON shape and rich tables.

The JSON shape is fixed by ``docs/inspect-plan.md``; keys are only ever added. rich is
imported only by the text renderer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TextIO

from hpcodegen.errors import EXIT_FAILED, EXIT_OK, Finding, Severity
from hpcodegen.inspect.options import Inspection
from hpcodegen.plan.fold import Row, fold
from hpcodegen.plan.predict import PredOp
from hpcodegen.report.envelope import ENVELOPE_VERSION, envelope, write_json
from hpcodegen.report.terminal import fold_text, human_bytes

#: the envelope's version (docs/json.md); kept under this name for callers
JSON_VERSION = ENVELOPE_VERSION


def _row_json(row: Row) -> dict[str, Any]:
    p = row.pred
    out: dict[str, Any] = {
        "fqn": row.label, "class": p.cls, "form": p.form, "count": row.count,
        "in_ops": [op.to_json() for op in p.in_ops],
        "out_ops": [op.to_json() for op in p.out_ops],
        "backward_ops": [op.to_json() for op in p.grad_ops],
        "notes": list(p.notes), "reasons": list(p.reasons),
        "opaque": [{"kind": k, "target": t} for k, t in p.opaque],
        "grad_sync_params": list(p.grad_sync),
    }
    if row.folded:
        out["fqns"] = list(row.fqns)
    return out


def _counts_json(counts: dict[tuple[str, str, int | None], int]) -> list[dict[str, Any]]:
    return [{"kind": k, "axis": a or None, "dim": d, "count": n}
            for (k, a, d), n in counts.items()]


def summary_json(result: Inspection) -> dict[str, Any]:
    """``summary``: forms, collectives per forward/backward, opaque callables."""
    s = result.summary
    return {
        "forms": dict(sorted(s.forms.items())),
        "collectives_per_forward": _counts_json(s.per_forward),
        "collectives_per_backward": _counts_json(s.per_backward),
        "opaque": [{"kind": k, "target": t, "count": len(fqns), "fqns": fqns}
                   for (k, t), fqns in s.opaque.items()],
        "grad_sync_per_backward": _counts_json(s.grad_sync),
        "grad_sync_params": s.grad_sync_params,
        "estimated": [{"note": note, "count": len(fqns), "fqns": fqns}
                      for note, fqns in s.estimated.items()],
    }


def to_json(result: Inspection) -> dict[str, Any]:
    """The whole ``--json`` document: the envelope (docs/json.md) and inspect-plan's keys."""
    failed = any(f.severity is Severity.ERROR for f in result.findings)
    payload: dict[str, Any] = {
        "meta": result.meta_path,
        "axes": list(result.axes),
        "sizes": result.sizes,
        "boundaries": [_row_json(r) for r in result.rows],
        "summary": summary_json(result),
    }
    doc = envelope("inspect-plan", EXIT_FAILED if failed else EXIT_OK, result.findings,
                   **payload)
    if result.changes is not None:
        doc["mesh"] = {"axes": list(result.axes), "sizes": result.sizes,
                       "changes": [c.to_json() for c in result.changes]}
    if result.volume is not None:
        doc["volume"] = result.volume
    if result.loss_parallel_heads:
        doc["loss_parallel_heads"] = result.loss_parallel_heads
    if result.pipeline is not None:
        doc["pipeline"] = result.pipeline
        doc["summary"]["bubble"] = result.pipeline["bubble"]
        doc["summary"]["p2p_per_step"] = result.pipeline["p2p"]
    return doc


def render_json(result: Inspection, out: TextIO) -> None:
    write_json(to_json(result), out)


def render_failure_json(findings: Sequence[Finding], out: TextIO, exit_code: int) -> None:
    """The envelope alone: the plan was refused or the input unreadable."""
    write_json(envelope("inspect-plan", exit_code, findings), out)


def _ops_cell(ops: Sequence[PredOp]) -> str:
    return "\n".join(op.label() for op in ops) or "-"


def _boundary_table(result: Inspection) -> Any:
    from rich.table import Table

    table = Table(title="Boundaries", show_lines=False)
    table.add_column("boundary", overflow="fold")
    for col in ("class", "form", "inputs", "outputs"):
        table.add_column(col, overflow="fold")
    table.add_column("transitions", overflow="fold", min_width=28)
    for row in result.rows:
        p = row.pred
        label = f"{row.label} x{row.count}" if row.folded else row.label or "<root>"
        notes = list(p.notes) + [f"opaque {k}: {t}" for k, t in p.opaque]
        table.add_row(label, p.cls or "-", p.form, _ops_cell(p.in_ops), _ops_cell(p.out_ops),
                      "\n".join(notes) or "-")
    return table


def _counts_table(result: Inspection) -> Any:
    from rich.table import Table

    s = result.summary
    table = Table(title="Collectives per step (every boundary instance)")
    for col in ("kind", "axis", "dim", "forward", "backward"):
        table.add_column(col, justify="right" if col in ("forward", "backward") else "left")
    for key in sorted(set(s.per_forward) | set(s.per_backward),
                      key=lambda k: (k[0], k[1], -1 if k[2] is None else k[2])):
        kind, axis, dim = key
        table.add_row(kind, axis or "-", "-" if dim is None else str(dim),
                      str(s.per_forward.get(key, 0)), str(s.per_backward.get(key, 0)))
    return table


def _changes_table(result: Inspection) -> Any:
    from rich.table import Table

    table = Table(title="Form changes on the live mesh")
    for col in ("boundary", "frozen", "live", "runs as", "why"):
        table.add_column(col, overflow="fold")
    by_fqn = {c.fqn: c for c in result.changes or ()}
    preds = [p for p in result.preds if p.fqn in by_fqn]
    for row in fold(preds):
        c = by_fqn[row.fqns[0]]
        label = f"{row.label} x{row.count}" if row.folded else row.label
        table.add_row(label, c.frozen_form, c.live_form, c.effective_form, c.reason)
    return table


def _volume_table(volume: dict[str, Any]) -> Any:
    from rich.table import Table

    table = Table(title=f"Bytes per rank (batch {volume['batch']}, seq {volume['seq']}, "
                        f"{volume['dtype']})")
    for col in ("boundary", "op", "shape", "bytes/rank each", "fwd total", "bwd total"):
        table.add_column(col, overflow="fold")
    for row in volume["boundaries"]:
        label = f"{row['fqn']} x{row['count']}" if row["count"] > 1 else row["fqn"]
        ops = "\n".join(f"{o['direction'][0]}wd {o['name']}: {o['kind']}({o['axis']})"
                        for o in row["ops"])
        shapes = "\n".join(str(tuple(o["shape"])) if o["shape"] else "?" for o in row["ops"])
        each = "\n".join(human_bytes(o["bytes"]) for o in row["ops"])
        table.add_row(label, ops, shapes, each, human_bytes(row["forward_bytes"]),
                      human_bytes(row["backward_bytes"]))
    return table


def _summary_lines(result: Inspection) -> list[str]:
    s = result.summary
    forms = ", ".join(f"{k} {v}" for k, v in sorted(s.forms.items()))
    lines = [f"boundaries per form: {forms}"]
    for (kind, axis, _), n in s.grad_sync.items():
        lines.append(f"parameter gradient sync (partial_grad_params): {s.grad_sync_params} "
                     f"parameter(s) summed in {n} flattened {kind}({axis}) per backward (one "
                     "per parameter dtype), besides the boundary collectives below")
    if s.opaque:
        lines.append("injected callables (their communication is opaque, not predicted):")
        lines.extend(f"  {k}: {t} on {len(fqns)} module(s), e.g. {fqns[0]}"
                     for (k, t), fqns in s.opaque.items())
    if s.estimated:
        lines.append("counted by estimate (the factory's code is not read):")
        lines.extend(f"  {note}, on {len(fqns)} module(s), e.g. {fqns[0]}"
                     for note, fqns in s.estimated.items())
    return lines


def print_findings(findings: Sequence[Finding], err: TextIO, verbosity: int = 0) -> None:
    """``severity: where: message`` per finding, folded to the width; info only with -v;
    identical findings once, with their count and other places (:mod:`..report.findings`)."""
    from hpcodegen.report.findings import plain_lines

    shown = [f for f in findings if f.severity is not Severity.INFO or verbosity > 0]
    for line in plain_lines(shown, lambda f: f"{f.severity}: "):
        err.write(fold_text(line) + "\n")


def render_text(result: Inspection, out: TextIO, err: TextIO, verbosity: int = 0) -> None:
    """Tables on ``out``; warnings and errors on ``err``. ``verbosity`` -1 (``--quiet``):
    findings only; 1 (``-v``): info findings too.

    The width is ``COLUMNS``, else the terminal's, else 80: the tables fold to it.
    """
    from rich.markup import escape

    from hpcodegen.report.terminal import console as make_console

    if verbosity < 0:
        print_findings(result.findings, err, verbosity)
        return
    console = make_console(file=out, highlight=False)
    sizes = " ".join(f"{a}={n}" for a, n in result.sizes.items())
    axes = ", ".join(result.axes)
    console.print(f"[bold]{escape(result.meta_path)}[/bold]  axes ({axes})  {sizes}")
    console.print(_boundary_table(result))
    for line in _summary_lines(result):
        console.print(line, markup=False)
    if result.summary.per_forward or result.summary.per_backward:
        console.print(_counts_table(result))
    else:
        console.print("no collectives at the boundaries, forward or backward")
    if result.loss_parallel_heads:
        console.print(f"loss parallel: {', '.join(result.loss_parallel_heads)} output stays "
                      "vocab-sharded (tp S(-1)): no logits all_gather; compute the loss with "
                      "hpcodegen.runtime.loss.vocab_parallel_cross_entropy", markup=False)
    if result.changes is not None:
        if result.changes:
            console.print(_changes_table(result))
        else:
            console.print("live mesh: no boundary changes form")
    if result.volume is not None:
        v = result.volume
        console.print(_volume_table(v))
        line = (f"per forward: {human_bytes(v['per_forward_bytes'])}/rank, "
                f"per backward: {human_bytes(v['per_backward_bytes'])}/rank")
        if v["link_gbps"]:
            line += (f"; at {v['link_gbps']} Gb/s + {v['link_latency_us']:g} us per collective "
                     f"({v['forward_collectives']} forward, {v['backward_collectives']} "
                     f"backward): forward {v['est_forward_s'] * 1e3:.3f} ms, "
                     f"backward {v['est_backward_s'] * 1e3:.3f} ms")
        console.print(line, markup=False)
        if v["link_gbps"]:
            console.print(f"time model: {v['time_model']}", markup=False)
        for est in v.get("estimated") or ():
            console.print(f"estimated in the totals: {human_bytes(est['bytes'])}/rank over "
                          f"{est['ops']} op(s) (e.g. {est['fqn']}): {est['note']}",
                          markup=False)
        lp = v.get("loss_parallel")
        if lp:
            console.print(f"loss parallel saves {human_bytes(lp['gather_bytes_saved'])}/rank per "
                          f"forward (the logits all_gather, logits {tuple(lp['logits_shape'])}); "
                          f"its cross entropy adds {human_bytes(lp['loss_allreduce_bytes'])}/rank",
                          markup=False)
    if result.pipeline is not None:
        from hpcodegen.inspect.pipeline import text_lines

        for line in text_lines(result.pipeline):
            console.print(line, markup=False)
    print_findings(result.findings, err, verbosity)
