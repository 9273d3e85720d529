"""How a launch looks: the per-rank table, the live progress view and the JSON document.

rich is used only here. The table has one row per rank: rank, device, local parameter
bytes, forward time, parity max diffs, status; below it the largest peak resident memory,
the smoke batch's shape (and why a sliding window was not exercised) and the losses. JSON
(``--json``) goes to stdout in the envelope of docs/json.md with launch's keys:
``message``, ``mesh``, ``ranks``, ...
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.table import Table

from hpcodegen.launch.results import (
    STATUS_ENDED,
    STATUS_ERROR,
    STATUS_FAIL,
    STATUS_KILLED,
    STATUS_LOST,
    STATUS_OK,
    STATUS_REFUSED,
    RankRecord,
)
from hpcodegen.report.terminal import human_bytes

_STYLE = {STATUS_OK: "green", STATUS_FAIL: "red", STATUS_ERROR: "red", STATUS_LOST: "red",
          STATUS_KILLED: "red", STATUS_REFUSED: "red", STATUS_ENDED: "yellow"}
_FINAL_LOOKING = (STATUS_LOST, STATUS_ENDED, STATUS_KILLED)


def _bytes(n: int | None) -> str:
    return "-" if n is None else human_bytes(n, precision=1)


def _diff(value: Any) -> str:
    return "-" if value is None else f"{float(value):.2e}"


def _status(record: RankRecord) -> str:
    style = _STYLE.get(record.status, "yellow")
    final = record.done or record.status in _FINAL_LOOKING
    text = record.status if final else record.phase
    return f"[{style}]{text}[/{style}]"


COLUMNS = ("rank", "device", "local params", "forward", "logits diff", "grad diff", "loss",
           "status")


def _cells(rec: RankRecord) -> tuple[str, ...]:
    parity = rec.parity or {}
    fwd = "-" if rec.forward_ms is None else f"{rec.forward_ms:.1f} ms"
    loss = f"{rec.losses[-1]:.4f}" if rec.losses else "-"
    return (str(rec.rank), rec.device or "-", _bytes(rec.local_param_bytes), fwd,
            _diff(parity.get("logits_max_diff")), _diff(parity.get("grad_max_diff")), loss,
            _status(rec))


OPTIONAL = ("forward", "logits diff", "grad diff", "loss")


def rank_table(records: Mapping[int, RankRecord], expected: int, title: str,
               script: bool = False) -> Table:
    """The per-rank table; ranks not heard from yet show as ``starting``.

    Optional columns (forward, diffs, loss) appear once some rank has a value for them; a
    user script's table never has them.
    """
    table = Table(title=title, title_justify="left")
    rows = []
    for rank in sorted(set(records) | set(range(expected))):
        rec = records.get(rank)
        rows.append(_cells(rec) if rec is not None
                    else (str(rank), *["-"] * (len(COLUMNS) - 2), "[yellow]starting[/yellow]"))
    keep = [i for i, c in enumerate(COLUMNS)
            if c not in OPTIONAL or (not script and any(row[i] != "-" for row in rows))]
    for i in keep:
        table.add_column(COLUMNS[i], justify="left" if COLUMNS[i] == "status" else "right",
                         no_wrap=True)
    for row in rows:
        table.add_row(*(row[i] for i in keep))
    return table


def batch_lines(records: Mapping[int, RankRecord]) -> list[str]:
    """The largest peak resident memory of the ranks, the smoke batch's shape, and why the
    config's sliding window was not exercised when it was not (the ranks share one batch:
    the lowest rank that reported it)."""
    peaks = [(r.peak_rss_bytes, r.rank) for r in records.values() if r.peak_rss_bytes]
    lines = []
    if peaks:
        top, rank = max(peaks)
        lines.append(f"peak resident memory: {_bytes(top)} (rank {rank}, the largest of "
                     f"{len(peaks)})")
    batch = next((r.batch for _, r in sorted(records.items()) if r.batch), None)
    if not batch:
        return lines
    window = batch.get("window")
    line = f"smoke batch: {batch.get('rows')} x {batch.get('length')} tokens"
    if window is not None and batch.get("window_exercised"):
        line += f" (sliding window {window} exercised)"
    lines.append(line)
    if batch.get("note"):
        lines.append(f"note: {batch['note']}")
    return lines


def loss_lines(records: Mapping[int, RankRecord]) -> list[str]:
    """The loss per step of the lowest rank that has losses (tp ranks share one loss), and
    the unsharded reference's when parity was checked."""
    with_losses = [r for _, r in sorted(records.items()) if r.losses]
    if not with_losses:
        return []
    rec = with_losses[0]
    head = f"loss per step (rank {rec.rank}): "
    lines = [head + " ".join(f"{x:.6f}" for x in rec.losses)]
    if rec.ref_losses:
        ref = "unsharded reference: ".ljust(len(head))
        lines.append(ref + " ".join(f"{x:.6f}" for x in rec.ref_losses))
    return lines


def progress_line(rec: RankRecord) -> str:
    """One plain line per phase change, for consoles that are not terminals."""
    loss = f" loss {rec.losses[-1]:.4f}" if rec.losses and rec.phase.startswith("step") else ""
    return f"[launch] rank {rec.rank}: {rec.status if rec.done else rec.phase}{loss}"


def print_json(exit_code: int, findings: Any = (), **payload: Any) -> None:
    """The ``--json`` document on stdout: the envelope (docs/json.md) of ``launch``."""
    import sys

    from hpcodegen.report.envelope import emit

    emit("launch", exit_code, findings, sys.stdout, **payload)


def make_console(stderr: bool = False) -> Console:
    """A console that honours NO_COLOR; its width is COLUMNS, the terminal's, or 80."""
    from hpcodegen.report.terminal import console

    return console(stderr=stderr, highlight=False)
