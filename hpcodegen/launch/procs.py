"""Ending a torchrun job completely: the agent, its ranks, and whatever they started.

torchrun starts each rank in a *new session* (``start_new_session=True`` in torch's
subprocess handler), so killing torchrun's process group alone would orphan the ranks. The
launcher therefore starts torchrun in its own session too and ends the job by session:
every process whose session id is torchrun's or one of its descendants' gets SIGTERM, then
SIGKILL after a grace period. Process discovery reads ``/proc`` (Linux); elsewhere only the
process groups of torchrun and the ranks' reported pids are signalled.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable
from pathlib import Path

_PROC = Path("/proc")


def _stat(pid: int) -> tuple[str, int, int] | None:
    """``(state, ppid, session id)`` of a live process, None when it is gone."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return fields[0], int(fields[1]), int(fields[3])


def alive(pid: int) -> bool:
    """Running (or stopped), not a zombie waiting to be reaped, not gone."""
    if _PROC.is_dir():
        stat = _stat(pid)
        return stat is not None and stat[0] not in ("Z", "X")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _all_stats() -> dict[int, tuple[str, int, int]]:
    out = {}
    for entry in _PROC.iterdir() if _PROC.is_dir() else ():
        if entry.name.isdigit():
            stat = _stat(int(entry.name))
            if stat is not None:
                out[int(entry.name)] = stat
    return out


def job_processes(root: int, extra: Iterable[int] = ()) -> set[int]:
    """Live pids of the job: ``root``'s descendants and everything in their sessions."""
    stats = _all_stats()
    children: dict[int, list[int]] = {}
    for pid, (_, ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = set(), [root, *extra]
    while todo:
        pid = todo.pop()
        if pid in found or pid not in stats:
            continue
        found.add(pid)
        todo.extend(children.get(pid, ()))
    sessions = {stats[p][2] for p in found} - {os.getsid(0)}
    found |= {p for p, (_, _, sid) in stats.items() if sid in sessions}
    found.discard(os.getpid())
    return {p for p in found if stats[p][0] not in ("Z", "X")}


def _signal_all(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def end_job(root: int, extra: Iterable[int] = (), grace: float = 3.0) -> set[int]:
    """SIGTERM the whole job, SIGKILL what is left after ``grace`` seconds.

    Returns:
        The pids that were signalled (for reports and tests).
    """
    extra = tuple(extra)
    pids = job_processes(root, extra) | {p for p in (root, *extra) if alive(p)}
    _signal_all(pids, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not any(alive(p) for p in pids):
            return pids
        time.sleep(0.05)
    left = job_processes(root, extra) | {p for p in pids if alive(p)}
    _signal_all(left, signal.SIGKILL)
    return pids | left
