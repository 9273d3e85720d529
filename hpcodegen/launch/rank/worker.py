"""The per-rank entry point: ``python -m hpcodegen.launch.rank.worker [SCRIPT ARGS...]``.

torchrun starts one of these per rank. Without arguments it runs the built-in smoke job
(:mod:`hpcodegen.launch.rank.smoke`); with a script it runs that script as ``__main__`` (like
``python SCRIPT ARGS``). Either way the rank's final state (ok, a failed check, or the
exception that ended it) is written to its result file before the process exits, so the
launcher can name the failing rank and its error without reading tracebacks.

Fault injection (tests, drills): ``HPCODEGEN_FAULT=raise:RANK`` makes that rank raise
right after start-up, ``hang:RANK`` makes it sleep forever, ``exit:RANK`` ends it with
``os._exit(3)`` and ``kill:RANK`` with SIGKILL (neither leaves a record: torchrun's own
failure record names them); several comma-separated entries are allowed.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path

from hpcodegen.gc_pause import MODEL_STACK, import_paused, own_process
from hpcodegen.launch import env
from hpcodegen.launch.rank.reporter import RankReporter, from_environment

#: ``HPCODEGEN_FAULT`` actions: raise an exception, hang, ``os._exit(3)``, SIGKILL itself.
FAULTS: tuple[str, ...] = ("raise", "hang", "exit", "kill")


class InjectedFault(RuntimeError):
    """Raised by ``HPCODEGEN_FAULT=raise:RANK``."""


def inject_fault(spec: str, rank: int) -> None:
    """Honour ``HPCODEGEN_FAULT`` for this rank (no-op when it names other ranks)."""
    for item in filter(None, (part.strip() for part in spec.split(","))):
        action, _, target = item.partition(":")
        if action not in FAULTS or not target.isdigit():
            raise ValueError(f"{env.FAULT}={spec!r}: expected ACTION:RANK with ACTION one of "
                             f"{', '.join(FAULTS)}")
        if int(target) != rank:
            continue
        if action == "raise":
            raise InjectedFault(f"injected by {env.FAULT}={spec} on rank {rank}")
        if action == "exit":  # no record, no cleanup: only torchrun sees the exit code
            os._exit(3)
        if action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        while True:
            time.sleep(3600)


def _run_script(argv: Sequence[str]) -> None:
    """Run a user script as ``__main__`` with its own argv and directory on sys.path."""
    script = str(Path(argv[0]).resolve())
    sys.argv = [argv[0], *argv[1:]]
    sys.path.insert(0, str(Path(script).parent))
    runpy.run_path(script, run_name="__main__")


def _shutdown(ok: bool) -> None:
    """Destroy the process group if this rank made one (torch only if already loaded).

    After a job that ended well, every rank first waits for the others (a barrier): a rank
    that closes its gloo sockets while a peer still reads the tail of the last collective
    makes that peer abort in native code ("terminate called without an active exception",
    SIGABRT after its result was recorded; seen under load). After a failure no rank waits:
    the peers may never come, and torchrun ends the job anyway."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        if ok:
            dist.barrier()
        dist.destroy_process_group()


def run_rank(argv: Sequence[str], reporter: RankReporter) -> int:
    """Run this rank's job and record its outcome; returns the process exit code."""
    try:
        reporter.update(phase="init")
        inject_fault(env.get(env.FAULT), reporter.record.rank)
        if argv:
            reporter.update(phase="script")
            _run_script(argv)
            reporter.finish()
        else:
            import_paused(*MODEL_STACK)  # the collector paused: hpcodegen.gc_pause
            from hpcodegen.launch.rank import smoke

            smoke.run(reporter)
    except SystemExit as exc:
        if exc.code not in (None, 0):
            reporter.fail_with(exc)
            return exc.code if isinstance(exc.code, int) else 1
        reporter.finish()
    except BaseException as exc:
        traceback.print_exc()
        reporter.fail_with(exc, str(Path(argv[0]).resolve()) if argv else None)
        return 1
    finally:
        try:
            _shutdown(reporter.record.status == "ok")
        except Exception:  # teardown must not mask the job outcome
            traceback.print_exc()
    return 0 if reporter.record.status == "ok" else 1


def main() -> None:
    own_process()
    sys.exit(run_rank(sys.argv[1:], from_environment()))


if __name__ == "__main__":
    main()
