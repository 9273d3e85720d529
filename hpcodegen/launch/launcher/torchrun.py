"""torchrun, with its per-rank failure records kept.

``python -m hpcodegen.launch.launcher.torchrun ARGS``.

This is ``torch.distributed.run`` itself (same arguments, same agent); only its end differs.
When a rank fails, torchelastic raises ``ChildFailedError`` carrying one ``ProcessFailure``
per failed rank: local rank, pid, exit code (negative: the signal), failure time and
error file. Those are written to ``$HPCODEGEN_RUN_DIR/torchrun.json`` so the launcher names
the rank that failed first and how it ended (a rank killed by a signal or calling
``os._exit`` leaves no record of its own). torchrun's banner and traceback go to its stderr,
which the launcher sends to the log dir, never to the console.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from hpcodegen.atomic import write_atomic
from hpcodegen.launch import env

FAILURES_NAME = "torchrun.json"


def failure_records(failures: dict[int, Any]) -> list[dict[str, Any]]:
    """``ProcessFailure`` objects as JSON rows, first failure first.

    torchelastic stamps failures in whole seconds, but fills the dict in the order it saw
    them: the ranks that failed on their own, then those it ended itself (SIGTERM). The
    sort is stable, so within one second that order decides, as torchrun's own "root
    cause" does (``ChildFailedError.get_first_failure``).
    """
    rows = [{"rank": int(rank), "local_rank": int(f.local_rank), "pid": int(f.pid),
             "exitcode": int(f.exitcode), "timestamp": float(f.timestamp),
             "signal": f.signal_name() if f.exitcode < 0 else None,
             "error_file": str(f.error_file)}
            for rank, f in failures.items()]
    return sorted(rows, key=lambda r: r["timestamp"])


def _write(run_dir: Path, payload: dict[str, Any]) -> None:
    write_atomic(run_dir / FAILURES_NAME, json.dumps(payload, indent=2))


def main(argv: list[str]) -> int:
    from hpcodegen.gc_pause import import_paused, own_process

    own_process()
    import_paused("torch.distributed.run")  # the collector paused: hpcodegen.gc_pause
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    run_dir = Path(env.get(env.RUN_DIR) or ".")
    try:
        torchrun(argv)
    except ChildFailedError as exc:
        _write(run_dir, {"failures": failure_records(exc.failures)})
        print(exc.format_msg(), file=sys.stderr)
        return 1
    except SignalException as exc:  # the launcher ended the job
        print(f"torchrun: ended by signal {exc.sigval}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
