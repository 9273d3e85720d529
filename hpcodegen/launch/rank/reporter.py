"""The running rank's own record, written to the run dir on every change.

One reporter exists per rank process (``current()``): the worker creates it, and the smoke
job or :func:`hpcodegen.launch.setup` inside a user script update the same record. Outside
a launch (no ``HPCODEGEN_RUN_DIR``) updates are kept in memory only.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hpcodegen.launch import env
from hpcodegen.launch.results import (
    STATUS_ERROR,
    STATUS_FAIL,
    STATUS_OK,
    STATUS_REFUSED,
    RankRecord,
    write_record,
)

MAX_ERROR_CHARS = 400
#: Lines of a user script's traceback kept in its record (the console shows them).
TRACEBACK_LINES = 15


def script_traceback(exc: BaseException, script: str) -> list[str]:
    """The last lines of ``exc``'s traceback from the first frame in ``script`` on: the
    script's own traceback, without the launcher's frames above it."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    mine = [i for i, frame in enumerate(frames) if frame.filename == script]
    tb = traceback.StackSummary.from_list(frames[mine[0]:] if mine else frames)
    lines = "".join([*tb.format(), *traceback.format_exception_only(type(exc), exc)])
    return lines.rstrip("\n").splitlines()[-TRACEBACK_LINES:]


class RankReporter:
    """Holds this rank's :class:`RankRecord` and persists it atomically."""

    def __init__(self, run_dir: Path | None, record: RankRecord) -> None:
        self.run_dir = run_dir
        self.record = record
        if run_dir is not None:
            run_dir.mkdir(parents=True, exist_ok=True)

    def update(self, **fields: Any) -> None:
        """Set fields (``phase="build"``, ``forward_ms=...``) and write the record."""
        for key, value in fields.items():
            setattr(self.record, key, value)
        from hpcodegen.launch.rank.memory import peak_rss

        self.record.peak_rss_bytes = peak_rss()
        if self.run_dir is not None:
            write_record(self.run_dir, self.record)

    def finish(self, failure: str | None = None) -> None:
        """Final state: ``ok``, or ``fail`` with the failed check's message."""
        self.update(status=STATUS_FAIL if failure else STATUS_OK, phase="done",
                    error=failure)

    def refuse(self, reason: str) -> None:
        """Final state ``refused``: the job cannot run as asked (its memory check)."""
        self.update(status=STATUS_REFUSED, phase="refused", error=reason)

    def fail_with(self, exc: BaseException, script: str | None = None) -> None:
        """Final state ``error`` with ``Type: first line of the message`` (and, for a user
        ``script``, the tail of its traceback)."""
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        message = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
        if len(message) > MAX_ERROR_CHARS:
            message = message[: MAX_ERROR_CHARS - 3] + "..."
        tail = script_traceback(exc, script) if script and exc.__traceback__ else None
        self.update(status=STATUS_ERROR, error=message, traceback=tail)


_CURRENT: RankReporter | None = None


def from_environment() -> RankReporter:
    """The reporter for this process, created from torchrun's and hpcodegen's variables."""
    global _CURRENT
    if _CURRENT is None:
        run_dir = env.get(env.RUN_DIR)
        record = RankRecord(rank=int(os.environ.get("RANK", "0")),
                            local_rank=int(os.environ.get("LOCAL_RANK", "0")),
                            world_size=int(os.environ.get("WORLD_SIZE", "1")),
                            device=env.get(env.DEVICE, "auto"))
        _CURRENT = RankReporter(Path(run_dir) if run_dir else None, record)
    return _CURRENT


def current() -> RankReporter:
    """This process's reporter (created on first use)."""
    return from_environment()
