"""Run torchrun as a child and watch the ranks' files until the job is decided.

The job is decided by the first of: every rank reported a final state; a rank reported an
error (the rest are ended at once, so one raising rank ends the job in seconds instead of
at the collective timeout); torchrun exited; ``--timeout`` passed. Whatever decided it, no
process of the job is left running afterwards (``procs.end_job``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcodegen.launch.deathsig import wrap
from hpcodegen.launch.procs import alive, end_job
from hpcodegen.launch.results import RankRecord, first_error, read_records

POLL_S = 0.2
#: After every rank reported success, how long torchrun gets to exit on its own.
EXIT_GRACE_S = 15.0
#: After a rank reported an error, how long torchrun gets to notice, end the others and
#: write its failure records (its order says which rank failed first) before it is ended.
ERROR_GRACE_S = 3.0


@dataclass(kw_only=True)
class JobOutcome:
    """What the watch loop saw.

    Attributes:
        records: the last state of every rank that reported.
        returncode: torchrun's exit code (None when the launcher ended it).
        timed_out: ``--timeout`` passed before the job was decided.
        ended_early: the launcher ended the job after a rank's error.
        interrupted: the launcher got Ctrl-C or SIGTERM and ended the job.
        elapsed: seconds from start to decision.
        pids: torchrun and every rank pid the launcher knew of (all gone afterwards).
        failures: torchrun's own per-rank failure records (``hpcodegen.launch.torchrun``),
            first failure first: rank, local rank, pid, exit code, signal, time.
        blamed: the rank the verdict names as the root cause, once decided.
    """

    records: dict[int, RankRecord] = field(default_factory=dict)
    returncode: int | None = None
    timed_out: bool = False
    ended_early: bool = False
    interrupted: bool = False
    elapsed: float = 0.0
    pids: list[int] = field(default_factory=list)
    failures: list[dict[str, Any]] = field(default_factory=list)
    blamed: int | None = None
    #: processes of the job still alive after it was ended (none, unless one is stuck in
    #: the kernel): the report says so instead of claiming every process was ended
    survivors: list[int] = field(default_factory=list)


def _start(argv: Sequence[str], environ: Mapping[str, str], log: Path,
           script_stdout: bool, keep_stdout: bool) -> subprocess.Popen:
    """torchrun in its own session, ended by the kernel if the launcher dies.

    Its stderr (banners, logging, tracebacks) goes to ``log``; so does its stdout, unless
    ``script_stdout``: then the user script's stdout (tee'd by torchrun) reaches the console
    (on stderr when not ``keep_stdout``: ``--json`` owns stdout)."""
    common = {"env": dict(environ), "start_new_session": True, "stdin": subprocess.DEVNULL}
    argv = wrap(list(argv))  # torchrun also ends if the launcher is SIGKILLed
    with open(log, "ab") as out:
        stdout: Any = out
        if script_stdout:
            stdout = None if keep_stdout else sys.stderr.fileno()
        return subprocess.Popen(list(argv), stdout=stdout, stderr=out, **common)


def _wait_quietly(proc: subprocess.Popen, seconds: float) -> None:
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=seconds)


class _Terminated(Exception):
    """The launcher itself got SIGTERM (e.g. a CI timeout): end the job, then stop."""


@contextlib.contextmanager
def _sigterm_ends_job() -> Iterator[None]:
    """While the job runs, SIGTERM to the launcher unwinds (so the job is ended) instead of
    killing the launcher and orphaning torchrun. Only possible on the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        raise _Terminated()

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _watch(proc: subprocess.Popen, outcome: JobOutcome, run_dir: Path, expected: int,
           timeout: float | None, start: float,
           on_update: Callable[[dict[int, RankRecord]], None]) -> None:
    """Poll the rank files until the job is decided; records the reason in ``outcome``."""
    seen: dict[int, float] = {}
    while True:
        records = read_records(run_dir)
        if any(seen.get(r) != rec.updated for r, rec in records.items()):
            seen = {r: rec.updated for r, rec in records.items()}
            on_update(records)
        outcome.records = records
        if first_error(records) is not None:
            outcome.ended_early = True
            _wait_quietly(proc, ERROR_GRACE_S)
            return
        if len(records) >= expected and all(r.done for r in records.values()):
            left = EXIT_GRACE_S if timeout is None else timeout - (time.monotonic() - start)
            _wait_quietly(proc, max(0.0, min(EXIT_GRACE_S, left)))
            return
        if proc.poll() is not None:
            return
        if timeout is not None and time.monotonic() - start > timeout:
            outcome.timed_out = True
            return
        time.sleep(POLL_S)


def run_job(argv: Sequence[str], environ: Mapping[str, str], *, run_dir: Path,
            expected: int, timeout: float | None, console_log: Path,
            script_stdout: bool = False, keep_stdout: bool = True,
            on_update: Callable[[dict[int, RankRecord]], None]) -> JobOutcome:
    """Start torchrun, watch ``run_dir``, and end the job when it is decided.

    Args:
        argv: the torchrun command (``command.torchrun_argv``).
        environ: its full environment.
        run_dir: where the ranks write ``rank<N>.json``.
        expected: how many ranks this node runs.
        timeout: seconds before the job is ended (None: no limit).
        console_log: file for torchrun's own output (banners, logging, tracebacks).
        script_stdout: copy the ranks' stdout (tee'd by torchrun) to the console.
        keep_stdout: that copy goes to stdout (else to stderr: ``--json`` owns stdout).
        on_update: called with the records whenever one changed (progress display).

    .. note:: Ctrl-C or SIGTERM to the launcher ends the job too (``interrupted``).
    """
    start = time.monotonic()
    outcome = JobOutcome()
    with _sigterm_ends_job():
        proc = _start(argv, environ, console_log, script_stdout, keep_stdout)
        outcome.pids.append(proc.pid)
        try:
            _watch(proc, outcome, run_dir, expected, timeout, start, on_update)
        except (KeyboardInterrupt, _Terminated):
            outcome.interrupted = True
        finally:
            rank_pids = [r.pid for r in outcome.records.values() if r.pid != os.getpid()]
            outcome.pids += rank_pids
            signalled: set[int] = set()
            if proc.poll() is None or any(alive(p) for p in rank_pids):
                signalled = end_job(proc.pid, rank_pids)
            outcome.returncode = proc.wait()
            outcome.survivors = sorted(p for p in signalled | {*rank_pids} if alive(p))
            outcome.elapsed = time.monotonic() - start
    outcome.records = read_records(run_dir)
    outcome.failures = read_failures(run_dir)
    return outcome


def read_failures(run_dir: Path) -> list[dict[str, Any]]:
    """torchrun's failure records (``torchrun.json``), or ``[]`` when it wrote none."""
    from hpcodegen.launch.torchrun import FAILURES_NAME

    try:
        data = json.loads((run_dir / FAILURES_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    rows = data.get("failures") if isinstance(data, dict) else None
    return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []
