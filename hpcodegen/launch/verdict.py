"""From what the ranks reported to one exit code and one line saying why.

Exit 0 only when every expected rank reported ``ok``; exit 2 when a rank's memory check
refused the job (nothing was built: the request cannot run as asked). Otherwise exit 1 and
the line names the root cause: the first rank that raised (with its error and log file), or
the first rank torchrun saw end without a record of its own (its exit code or signal, from
torchrun's per-rank failure records; a signal makes its row ``killed`` and the line says
the likely cause), a rank whose check failed, ranks that never reported, or the timeout.
Text from the ranks is shown escaped (one line stays one line).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpcodegen.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE, printable
from hpcodegen.launch.options import LaunchOptions
from hpcodegen.launch.results import (
    STATUS_ENDED,
    STATUS_ERROR,
    STATUS_FAIL,
    STATUS_KILLED,
    STATUS_LOST,
    STATUS_OK,
    STATUS_REFUSED,
    RankRecord,
    first_error,
)
from hpcodegen.launch.supervise import JobOutcome


def rank_log(logs: Path | None, local_rank: int) -> Path | None:
    """torchrun's ``stderr.log`` of ``local_rank`` under ``--log-dir`` (newest attempt)."""
    if logs is None:
        return None
    found = sorted(Path(logs).glob(f"*/attempt_*/{local_rank}/stderr.log"),
                   key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def _where(logs: Path | None, rec: RankRecord | None, local_rank: int) -> str:
    log = rank_log(logs, rec.local_rank if rec else local_rank)
    return f" (log: {log})" if log else ""


def _mark_lost(outcome: JobOutcome, expected: int) -> list[int]:
    """Ranks without a final state become ``ended`` (the launcher ended the job) or
    ``lost`` (they died on their own); returns them."""
    ended = outcome.timed_out or outcome.ended_early or outcome.interrupted
    status = STATUS_ENDED if ended else STATUS_LOST
    lost = []
    for rank in range(expected):
        if rank not in outcome.records:
            outcome.records[rank] = RankRecord(rank=rank, local_rank=rank, pid=0,
                                               status=status, phase="never reported")
            lost.append(rank)
    for rank, rec in outcome.records.items():
        if not rec.done and rec.status not in (STATUS_LOST, STATUS_ENDED):
            rec.status = status
            lost.append(rank)
    return sorted(set(lost))


def _root_cause(outcome: JobOutcome) -> tuple[dict[str, Any] | None, RankRecord | None]:
    """``(torchrun's failure row, None)`` when the first rank torchrun saw fail left no
    result of its own (a signal, ``os._exit``, a crash before its final record); else
    ``(None, the first error record)``: torchrun's order decides which rank was first, our
    records what it said. A rank that wrote its final record (its check failed, or it
    raised) and then exited non-zero is reported by that record, never as "exited before
    reporting a result"."""
    if outcome.failures:
        row = outcome.failures[0]
        rec = outcome.records.get(row.get("rank"))
        if rec is None or not rec.done:
            return row, None
        if rec.status == STATUS_ERROR:
            return None, rec
    return None, first_error(outcome.records)


#: what most often sends a signal that ends a rank, when the launcher did not send it
LIKELY_CAUSE = {
    "SIGSEGV": "a crash in native code (an extension, a kernel, the driver)",
    "SIGBUS": "a bus error, often /dev/shm too small for the ranks' shared memory",
    "SIGABRT": "an abort in native code (a failed C++ check, NCCL/gloo giving up)",
    "SIGTERM": "something outside the job ended it (a scheduler, a kill)",
    "SIGINT": "an interrupt from outside the job",
    "SIGHUP": "its terminal or session went away",
}


def likely_cause(signal_name: str, oom_kills: int | None) -> str:
    """Why a signal the launcher did not send most likely ended a rank. For SIGKILL (what
    the kernel's OOM killer sends) ``oom_kills`` is how many OOM kills the kernel counted
    during the job (None: its counter is not readable here)."""
    if signal_name != "SIGKILL":
        return LIKELY_CAUSE.get(signal_name, "a signal from outside the job")
    if oom_kills:
        return (f"out of memory: the kernel's OOM killer killed {oom_kills} process(es) "
                "during the job (/proc/vmstat oom_kill); see dmesg, and lower the memory "
                "the job needs (docs/launch.md: memory)")
    seen = "" if oom_kills is None else " (the kernel counted no OOM kill during the job, " \
        "so perhaps a kill -9 from outside)"
    return f"out of memory, the kernel's OOM killer sends SIGKILL{seen}; see dmesg"


def _failed_after_ok(outcome: JobOutcome) -> dict[str, Any] | None:
    """torchrun's first failure row of a rank whose own record says ok (it failed in its
    teardown: an exit hook, a process group that did not close)."""
    for row in outcome.failures:
        rec = outcome.records.get(row.get("rank"))
        if rec is not None and rec.status == STATUS_OK:
            return row
    return None


def _how(row: dict[str, Any], oom_kills: int | None = None) -> tuple[str, str]:
    """``("was killed by signal 9 (SIGKILL)", "; likely cause: ...")`` or
    ``("exited with code 3", "")``: what torchrun saw, and for a signal why, most likely."""
    code = int(row.get("exitcode", 0))
    if code < 0:
        name = row.get("signal") or "unknown"
        return (f"was killed by signal {-code} ({name})",
                f"; likely cause: {likely_cause(str(name), oom_kills)}")
    return f"exited with code {code}", ""


def _refused(outcome: JobOutcome, expected: int) -> tuple[int, str] | None:
    """Exit 2 and the line when a rank's memory check refused the job."""
    refused = [r for _, r in sorted(outcome.records.items()) if r.status == STATUS_REFUSED]
    if not refused:
        return None
    from hpcodegen.launch.memory import HINT

    _mark_lost(outcome, expected)
    rec = refused[0]
    outcome.blamed = rec.rank
    return EXIT_USAGE, (f"refused before building the model: rank {rec.rank} cannot fit: "
                        f"{printable(rec.error or '')}; hint: {HINT}")


def _ended(outcome: JobOutcome) -> str:
    """What the launcher did to the job, as it is: every process ended, or which not."""
    left = outcome.survivors
    if not left:
        return "every process of the job was ended"
    return (f"{len(left)} process(es) of the job could not be ended (pid "
            f"{', '.join(map(str, left[:5]))})")


def _pending(records: dict[int, RankRecord]) -> str:
    return ", ".join(f"{r} ({rec.phase})" for r, rec in sorted(records.items())
                     if not rec.done) or "none"


def verdict(outcome: JobOutcome, opts: LaunchOptions, logs: Path | None,
            run_dir: Path, console_log: Path | None = None,
            oom_kills: int | None = None) -> tuple[int, str]:
    """``(exit code, one-line message)`` for the finished job; ``oom_kills``: the kernel's
    OOM kills counted while it ran (None: unknown)."""
    expected = 0 if opts.multi_node else opts.nproc
    keep = "" if opts.log_dir is not None else f"; run files kept in {run_dir}"
    if outcome.interrupted:
        _mark_lost(outcome, expected)
        return EXIT_FAILED, f"interrupted; {_ended(outcome)}{keep}"
    if not outcome.records and not outcome.timed_out:
        console = f"; torchrun output: {console_log}" if console_log else ""
        return EXIT_FAILED, (f"no rank reported (torchrun exit code {outcome.returncode})"
                             f"{console}{keep}")
    refused = _refused(outcome, expected)
    if refused is not None:
        return refused
    if outcome.timed_out:
        pending = _pending(outcome.records)
        _mark_lost(outcome, expected)
        return EXIT_FAILED, (f"timed out after {opts.timeout:g} s with ranks still running: "
                             f"{pending}; {_ended(outcome)}{keep}")
    dead, failed = _root_cause(outcome)
    if dead is not None:
        rank = int(dead["rank"])
        _mark_lost(outcome, expected)
        for other, rec in outcome.records.items():
            if other != rank and rec.status == STATUS_LOST:
                rec.status = STATUS_ENDED  # torchrun ended the others after this rank
        if rank in outcome.records:  # its own row says what ended it, not "ended"
            outcome.records[rank].status = STATUS_KILLED \
                if int(dead.get("exitcode", 0)) < 0 else STATUS_LOST
        outcome.blamed = rank
        log = rank_log(logs, int(dead.get("local_rank", rank)))
        where = f" (log: {log})" if log else ""
        how, cause = _how(dead, oom_kills)
        return EXIT_FAILED, f"rank {rank} {how} before reporting a result{cause}{where}{keep}"
    if failed is not None:
        _mark_lost(outcome, expected)
        outcome.blamed = failed.rank
        return EXIT_FAILED, (f"rank {failed.rank} failed: {printable(failed.error or '')}"
                             f"{_where(logs, failed, failed.rank)}")
    lost = _mark_lost(outcome, max(expected, opts.nproc if not opts.multi_node else 0))
    bad = [r for _, r in sorted(outcome.records.items()) if r.status == STATUS_FAIL]
    if bad:
        rec = bad[0]
        outcome.blamed = rec.rank
        return EXIT_FAILED, f"rank {rec.rank} check failed: {printable(rec.error or '')}{keep}"
    after = _failed_after_ok(outcome)
    if after is not None:
        rank = int(after["rank"])
        outcome.blamed = rank
        how, cause = _how(after, oom_kills)
        return EXIT_FAILED, (f"rank {rank} reported ok, then {how}{cause}"
                             f"{_where(logs, None, int(after.get('local_rank', rank)))}{keep}")
    if lost or len(outcome.records) < opts.nproc:
        rank = lost[0] if lost else len(outcome.records)
        return EXIT_FAILED, (f"rank {rank} ended without a result (torchrun exit code "
                             f"{outcome.returncode}){_where(logs, None, rank)}{keep}")
    if all(r.status == STATUS_OK for r in outcome.records.values()):
        return EXIT_OK, _success(outcome)
    return EXIT_FAILED, f"ranks did not all succeed{keep}"


def _success(outcome: JobOutcome) -> str:
    records = list(outcome.records.values())
    n = len(records)
    text = f"{'all ' if n > 1 else ''}{n} rank{'s' if n > 1 else ''} ok in {outcome.elapsed:.1f} s"
    parity = [r.parity for r in records if r.parity]
    if parity:
        logits = max(float(p.get("logits_max_diff") or 0.0) for p in parity)
        grads = max(float(p.get("grad_max_diff") or 0.0) for p in parity)
        tol = parity[0].get("tolerance")
        text += f"; parity max diff logits {logits:.2e}, grads {grads:.2e} (tolerance {tol})"
        losses = max((float(p.get("loss_max_diff") or 0.0) for p in parity), default=0.0)
        if any("loss_max_diff" in p for p in parity):
            text += f", losses {losses:.2e}"
    return text
