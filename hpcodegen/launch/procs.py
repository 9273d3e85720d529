"""Ending a torchrun job completely: the agent, its ranks, and whatever they started.

torchrun starts each rank in a *new session* (``start_new_session=True`` in torch's
subprocess handler), so killing torchrun's process group alone would orphan the ranks. The
launcher therefore starts torchrun in its own session too and ends the job by descent and
by session: every descendant of the job's root, and every process whose session id is one
of theirs, gets SIGTERM, then SIGKILL after a grace period. On Linux the root is the
:mod:`hpcodegen.launch.deathsig` shim, a child subreaper: a process a rank double-forked
into a session of its own is reparented to it, so it is still a descendant here. psutil
lists the processes (parents, states) on every OS; a zombie counts as gone (it only waits
to be reaped).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable

import psutil

_GONE = (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)


def alive(pid: int) -> bool:
    """Running (or stopped), not a zombie waiting to be reaped, not gone."""
    try:
        return psutil.Process(pid).status() not in _GONE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


def _sid(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None


def job_processes(root: int, extra: Iterable[int] = ()) -> set[int]:
    """Live pids of the job: ``root``'s descendants and everything in their sessions."""
    found: set[int] = set()
    for pid in (root, *extra):
        with contextlib.suppress(psutil.Error):
            found |= {pid, *(c.pid for c in psutil.Process(pid).children(recursive=True))}
    sessions = {_sid(p) for p in found} - {_sid(0), None}
    if sessions:
        found |= {p.pid for p in psutil.process_iter() if _sid(p.pid) in sessions}
    found.discard(os.getpid())
    return {p for p in found if alive(p)}


def _signal_all(pids: Iterable[int], kill: bool) -> None:
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            proc.kill() if kill else proc.terminate()


def end_job(root: int, extra: Iterable[int] = (), grace: float = 3.0) -> set[int]:
    """SIGTERM the whole job, SIGKILL what is left after ``grace`` seconds.

    Returns:
        The pids that were signalled (for reports and tests).
    """
    extra = tuple(extra)
    pids = job_processes(root, extra) | {p for p in (root, *extra) if alive(p)}
    _signal_all(pids, kill=False)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not any(alive(p) for p in pids):
            return pids
        time.sleep(0.05)
    left = job_processes(root, extra) | {p for p in pids if alive(p)}
    _signal_all(left, kill=True)
    deadline = time.monotonic() + grace  # SIGKILLed processes take a moment to vanish
    while any(alive(p) for p in left) and time.monotonic() < deadline:
        time.sleep(0.05)
    return pids | left
