"""``launch --timeout`` over the launcher's own pre-start checks, not only the job.

The checks before any rank starts read untrusted input (the artifact, the config, the
checkpoint's record and metadata); each read is bounded, but the promise of ``--timeout S``
is the whole command ends within S seconds. :func:`deadline` arms a real-time timer for
the checks (main thread only: where signals are delivered) and turns its expiry into a
``launch.timeout`` finding; :func:`left` is what remains for the job.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from hpcodegen.errors import PlanError, error


class PreStartTimeout(PlanError):
    """The pre-start checks ran past ``--timeout`` (exit 1, as a job that timed out)."""


@contextmanager
def deadline(seconds: float | None) -> Iterator[None]:
    """Raise :class:`PreStartTimeout` in the body once ``seconds`` have passed."""
    if seconds is None or not 0 < seconds < float("inf") \
            or threading.current_thread() is not threading.main_thread():  # check() refuses
        yield
        return

    def expire(signum: int, frame: object) -> None:
        raise PreStartTimeout([error("launch.timeout", "--timeout",
                                     f"the launcher's checks before any rank starts ran past "
                                     f"--timeout {seconds:g} s; nothing was started",
                                     hint="an input (artifact, config, checkpoint) is too "
                                          "large to check in that time")])

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def left(seconds: float | None, since: float) -> float | None:
    """What remains of ``seconds`` after the checks that began at ``since`` (monotonic)."""
    if seconds is None:
        return None
    return max(0.001, seconds - (time.monotonic() - since))
