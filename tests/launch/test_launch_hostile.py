"""launch reports what each rank recorded, and leaves no process behind, double-forked
``setsid`` daemons included (issue 23)."""

from __future__ import annotations

from pathlib import Path

import pytest
from launch_helpers import EXAMPLE, LLAMA_CONFIG, check_in_process, leftover, run_cli

from hpcodegen.launch.launcher.options import LaunchOptions
from hpcodegen.launch.launcher.supervise import JobOutcome
from hpcodegen.launch.launcher.verdict import verdict
from hpcodegen.launch.results import RankRecord

OPTS = LaunchOptions(artifact=Path("art"), nproc=2, timeout=5.0)


def _row(rank: int, code: int) -> dict:
    return {"rank": rank, "local_rank": rank, "pid": 10 + rank, "exitcode": code,
            "signal": None}


def test_a_recorded_check_failure_is_reported_as_such(tmp_path) -> None:
    """The rank wrote ``fail`` and then exited 1: torchrun's failure row must not turn it
    into a rank that "exited before reporting a result"."""
    fail = RankRecord(rank=0, status="fail", error="parity grad max diff 3e-4 > tolerance")
    outcome = JobOutcome(records={0: fail, 1: RankRecord(rank=1, status="ok")},
                         returncode=1, failures=[_row(0, 1)])
    code, message = verdict(outcome, OPTS, None, tmp_path)
    assert code == 1 and message.startswith("rank 0 check failed: parity grad"), message


def test_a_rank_that_reported_ok_then_failed_is_named(tmp_path) -> None:
    ok = {r: RankRecord(rank=r, status="ok") for r in range(2)}
    outcome = JobOutcome(records=ok, returncode=1, failures=[_row(1, 3)])
    code, message = verdict(outcome, OPTS, None, tmp_path)
    assert code == 1 and message.startswith("rank 1 reported ok, then exited with code 3")


def test_the_report_claims_every_process_ended_only_when_true(tmp_path) -> None:
    pending = {0: RankRecord(rank=0, phase="step 1/2")}
    clean = JobOutcome(records=dict(pending), timed_out=True)
    assert "every process of the job was ended" in verdict(clean, OPTS, None, tmp_path)[1]
    stuck = JobOutcome(records=dict(pending), timed_out=True, survivors=[4242])
    message = verdict(stuck, OPTS, None, tmp_path)[1]
    assert "every process" not in message and "could not be ended (pid 4242)" in message


@pytest.mark.gloo
@pytest.mark.timeout(400)
def test_a_parity_failure_is_reported_from_the_ranks_record(tmp_path) -> None:
    check_in_process(EXAMPLE, LLAMA_CONFIG)  # the launch reads the verdict: no check child
    run = run_cli(EXAMPLE, "--nproc", "2", "--device", "cpu", "--model-dir", LLAMA_CONFIG,
                  "--check-parity", "--tolerance", "1e-30", "--json", timeout=300)
    doc = run.json()
    assert run.code == 1 and "check failed: parity" in doc["message"], doc["message"]
    assert "before reporting" not in doc["message"]
    assert {r["status"] for r in doc["ranks"]} == {"fail"}


DAEMON = """
import os, pathlib, signal, sys, time
out = pathlib.Path(sys.argv[1])
rank = os.environ["RANK"]
if os.fork() == 0:              # double fork + setsid: a daemon in a session of its own
    os.setsid()
    if os.fork() == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)   # it even ignores SIGTERM
        (out / f"daemon{rank}").write_text(str(os.getpid()))
        time.sleep(300)
    os._exit(0)
os.wait()
while not (out / f"daemon{rank}").exists():
    time.sleep(0.05)
(out / f"rank{rank}").write_text(str(os.getpid()))
if sys.argv[2] == "hang":
    time.sleep(300)
"""


@pytest.mark.parametrize("how", ["hang", "exit"])
@pytest.mark.timeout(400)
def test_a_double_forked_daemon_is_ended_with_the_job(tmp_path, how) -> None:
    """No wall clock: ``exit`` ends by itself (its --timeout only guards a hang); ``hang``
    needs both daemons started before --timeout fires, so a start-up slower than the
    timeout (a loaded machine) runs again with one twice as long (8 s, 16, 32, 64, then
    120): the wait stays within about twice the start-up it needs."""
    for limit in ("8", "16", "32", "64", "120") if how == "hang" else ("240",):
        script = tmp_path / limit / "job.py"
        pids = tmp_path / limit / "pids"
        pids.mkdir(parents=True)
        script.write_text(DAEMON)
        run = run_cli(EXAMPLE, "--nproc", "2", "--device", "cpu", "--timeout", limit, "--json",
                      "--", script, pids, how, timeout=float(limit) + 120)
        if len(list(pids.glob("daemon*"))) == 2:
            break
    doc = run.json()
    assert len(list(pids.glob("daemon*"))) == 2, run.stderr
    assert leftover(pids) == [], f"a daemon survived: {doc['message']}"
    if how == "hang":
        assert doc["timed_out"] and "every process of the job was ended" in doc["message"]
    else:
        assert run.code == 0, doc["message"]
