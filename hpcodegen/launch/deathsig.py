"""The process torchrun runs under: it ends with the launcher and leaves nothing behind.

Why: the launcher ends the whole torchrun job on every path it can see (a rank's error,
``--timeout``, Ctrl-C, SIGTERM), but

* a launcher killed with SIGKILL (an OOM killer, a CI runner's hard stop) runs no code at
  all: the kernel sends this shim SIGTERM when the launcher dies (``PR_SET_PDEATHSIG``);
* a process a rank started can leave the job's process tree: a double fork and
  ``setsid`` make it an orphan in a session of its own, which no walk of torchrun's
  descendants or sessions finds. This shim is a *child subreaper*
  (``PR_SET_CHILD_SUBREAPER``): the kernel reparents every orphan of the job to it, so
  every process the job created stays its descendant.

The shim starts torchrun as its child, forwards SIGTERM, SIGINT and SIGHUP to it, and once
torchrun has exited (or on such a signal) ends every descendant still running (SIGTERM,
then SIGKILL after a grace period) and reaps them, then exits with torchrun's status. The
launcher ends the job through the shim's pid, whose descendants are the whole job.

Usage (internal): ``python -m hpcodegen.launch.deathsig LAUNCHER_PID COMMAND [ARGS...]``.
On platforms without ``prctl`` the command runs unwrapped (:func:`wrap`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
#: Seconds descendants get between SIGTERM and SIGKILL when the shim ends them.
GRACE_S = 3.0
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def wrap(argv: list[str], launcher_pid: int | str | None = None) -> list[str]:
    """``argv`` run through this shim where the platform has PDEATHSIG, else unchanged.

    ``launcher_pid`` defaults to this process; ``--dry-run`` shows a placeholder instead.
    """
    if not sys.platform.startswith("linux"):
        return argv
    pid = os.getpid() if launcher_pid is None else launcher_pid
    return [sys.executable, "-m", __name__, str(pid), *argv]


def _prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}) failed")


def _reap() -> None:
    """Collect every exited child (orphans the kernel handed to this subreaper)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _descendants() -> list[int]:
    """Live descendants of this process, zombies left out."""
    import psutil

    out = []
    for proc in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc.pid)
    return out


def end_descendants(grace: float = GRACE_S) -> list[int]:
    """SIGTERM every descendant, SIGKILL what is left after ``grace``, reap them all.

    Loops until none is left (a process may fork while being ended). Returns the pids
    that could not be ended (none, unless a descendant is stuck in the kernel)."""
    deadline = time.monotonic() + grace
    sig = signal.SIGTERM
    while True:
        _reap()
        pids = _descendants()
        if not pids:
            return []
        if time.monotonic() > deadline:
            sig = signal.SIGKILL
        if time.monotonic() > deadline + 10 * max(grace, 1.0):
            return pids
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        time.sleep(0.05)


def main(args: list[str]) -> None:
    parent, command = int(args[0]), args[1:]
    _prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))
    if os.getppid() != parent:  # the launcher died before the prctl took effect
        sys.exit(1)
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    child = subprocess.Popen(command)
    received: list[int] = []

    def forward(signum: int, frame: object) -> None:
        received.append(signum)
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signum)

    for sig in _FORWARDED:
        signal.signal(sig, forward)
    while True:
        try:
            code = child.wait()
            break
        except InterruptedError:  # pragma: no cover (PEP 475 retries)
            continue
    end_descendants()
    if code < 0:  # killed by a signal: die of the same one, as torchrun would have
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


if __name__ == "__main__":
    main(sys.argv[1:])
