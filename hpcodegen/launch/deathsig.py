"""Exec a command that the kernel ends when the launcher dies (Linux ``PR_SET_PDEATHSIG``).

Why: the launcher ends the whole torchrun job on every path it can see (a rank's error,
``--timeout``, Ctrl-C, SIGTERM), but a launcher killed with SIGKILL (an OOM killer, a CI
runner's hard stop) runs no code at all. torchrun is therefore started through this shim:
the kernel sends it SIGTERM when its parent, the launcher, dies, and torchrun then ends its
ranks as it does on any SIGTERM.

Usage (internal): ``python -m hpcodegen.launch.deathsig LAUNCHER_PID COMMAND [ARGS...]``.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def wrap(argv: list[str], launcher_pid: int | str | None = None) -> list[str]:
    """``argv`` run through this shim where the platform has PDEATHSIG, else unchanged.

    ``launcher_pid`` defaults to this process; ``--dry-run`` shows a placeholder instead.
    """
    if not sys.platform.startswith("linux"):
        return argv
    pid = os.getpid() if launcher_pid is None else launcher_pid
    return [sys.executable, "-m", __name__, str(pid), *argv]


def main(args: list[str]) -> None:
    parent, command = int(args[0]), args[1:]
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:  # the launcher died before the prctl took effect
        sys.exit(1)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
