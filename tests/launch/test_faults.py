"""Faults end the whole job: a raising rank promptly, a hang at --timeout; no process left.

No wall clock is asserted. "Promptly" is an event: the peer of a failing rank sleeps far
longer than the test's hard timeout, so a job that ends at all was ended by the launcher
(and the peer never reaches its end marker). Every wait is for an event (pid files
written, processes gone) under a generous bound that only guards against a hang.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from launch_helpers import EXAMPLE, LLAMA_CONFIG, check_in_process, leftover, run_cli

RAISE_ON_1 = """
import os, pathlib, sys, time
rank = int(os.environ["RANK"])
pathlib.Path(sys.argv[1], f"pid{rank}").write_text(str(os.getpid()))
assert os.environ["HPCODEGEN_ARTIFACT"]
if rank == 1:
    time.sleep(1)
    raise ValueError("boom from rank one")
time.sleep(900)   # a rank blocked forever, as in a collective its peer never joins
pathlib.Path(sys.argv[1], "finished").write_text("the launcher let rank 0 run to its end")
"""

HANG_ON_0 = """
import os, pathlib, subprocess, sys, time
rank = int(os.environ["RANK"])
pathlib.Path(sys.argv[1], f"pid{rank}").write_text(str(os.getpid()))
if rank == 0:   # a grandchild in the rank's session must be ended too
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(900)"])
    pathlib.Path(sys.argv[1], "child").write_text(str(child.pid))
time.sleep(900)
"""


def _script(tmp_path, text):
    tmp_path.mkdir(parents=True, exist_ok=True)
    script = tmp_path / "job.py"
    script.write_text(text)
    pids = tmp_path / "pids"
    pids.mkdir()
    return script, pids


def _wait_for_ranks(pids: Path, proc, count: int = 3) -> None:
    """Until ``count`` pid files exist (both ranks and rank 0's child): the event the test
    needs before it signals the launcher. Bounded only against a hang."""
    import time

    deadline = time.monotonic() + 240
    while len(list(pids.iterdir())) < count:
        assert proc.poll() is None, "the launcher ended before its ranks started"
        assert time.monotonic() < deadline, f"ranks never started: {sorted(pids.iterdir())}"
        time.sleep(0.2)


@pytest.mark.timeout(400)  # below rank 0's 900 s sleep: ending at all is ending early
def test_raising_rank_ends_the_job(tmp_path):
    script, pids = _script(tmp_path, RAISE_ON_1)
    logs = tmp_path / "logs"
    run = run_cli(EXAMPLE, "--nproc", "2", "--device", "cpu", "--log-dir", logs, "--",
                  script, pids, timeout=300)
    assert run.code == 1
    failure = [line for line in run.stderr.splitlines() if line.startswith("rank 1 failed")]
    assert len(failure) == 1, run.stderr
    assert "ValueError: boom from rank one" in failure[0]
    assert "stderr.log" in failure[0]
    assert len(list(pids.iterdir())) == 2  # both pid files; no "finished": ended, not done
    assert leftover(pids) == []
    log = failure[0].split("(log: ")[1].rstrip(")")
    assert "boom from rank one" in Path(log).read_text()


@pytest.mark.timeout(400)
def test_injected_fault_in_the_smoke_job(tmp_path):
    """HPCODEGEN_FAULT=raise:1: rank 1 raises at start-up while rank 0 builds the model
    (and would then wait in its first collective for gloo's 30-minute timeout)."""
    check_in_process(EXAMPLE, LLAMA_CONFIG)  # the launch reads the verdict: no check child
    run = run_cli(EXAMPLE, "--nproc", "2", "--device", "cpu", "--model-dir", LLAMA_CONFIG,
                  "--json", "--log-dir", tmp_path / "logs",
                  env={"HPCODEGEN_FAULT": "raise:1"}, timeout=300)
    assert run.code == 1
    doc = run.json()
    assert doc["message"].startswith("rank 1 failed: InjectedFault")
    assert (doc["status"], doc["findings"][0]["code"]) == ("fail", "launch.failed")
    assert Path(doc["run_dir"]).is_dir()  # kept (--log-dir): reported
    statuses = {r["rank"]: r["status"] for r in doc["ranks"]}
    assert statuses[1] == "error" and statuses[0] != "ok"  # rank 0 was ended, it never finished
    assert leftover(None, [p for p in doc["pids"] if p]) == []


@pytest.mark.timeout(400)
def test_hang_ends_at_timeout(tmp_path):
    """The grandchild must exist when --timeout fires: a start-up slower than the timeout
    (a loaded machine) is run again with a timeout twice as long, until it does (6 s, 12,
    24, 48, then 120). Doubling bounds the wait by about twice the start-up it needs, where
    a jump from 6 s to 30 s waited 36 s for a start-up of 7 s."""
    for limit in ("6", "12", "24", "48", "120"):
        script, pids = _script(tmp_path / limit, HANG_ON_0)
        run = run_cli(EXAMPLE, "--nproc", "2", "--device", "cpu", "--timeout", limit,
                      "--json", "--log-dir", tmp_path / limit / "logs", "--", script, pids,
                      timeout=float(limit) + 120)
        if (pids / "child").exists():
            break
    assert run.code == 1
    doc = run.json()
    assert doc["timed_out"] is True
    assert doc["message"].startswith(f"timed out after {limit} s")
    assert {r["status"] for r in doc["ranks"]} == {"ended"}
    assert (pids / "child").exists(), "no start-up finished within 120 s"
    assert leftover(pids, doc["pids"]) == []


@pytest.mark.timeout(400)
def test_sigterm_to_the_launcher_ends_the_job(tmp_path):
    """A CI runner killing the launcher must not orphan torchrun or its ranks."""
    import os
    import signal
    import subprocess
    import sys

    script, pids = _script(tmp_path, HANG_ON_0)
    proc = subprocess.Popen([sys.executable, "-m", "hpcodegen", "launch", str(EXAMPLE),
                             "--nproc", "2", "--device", "cpu", "--json", "--log-dir",
                             str(tmp_path / "logs"), "--", str(script),
                             str(pids)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)
    _wait_for_ranks(pids, proc)
    os.kill(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 1
    doc = json.loads(out)
    assert doc["message"].startswith("interrupted")
    assert leftover(pids, doc["pids"]) == []


def _children(pid: int) -> list[int]:
    """Direct children of ``pid`` (Linux /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
@pytest.mark.timeout(400)
def test_sigkill_of_the_launcher_still_ends_the_job(tmp_path):
    """A launcher that runs no code (SIGKILL) must not orphan torchrun or its ranks."""
    import os
    import signal
    import subprocess
    import sys

    script, pids = _script(tmp_path, HANG_ON_0)
    proc = subprocess.Popen([sys.executable, "-m", "hpcodegen", "launch", str(EXAMPLE),
                             "--nproc", "2", "--device", "cpu", "--log-dir",
                             str(tmp_path / "logs"), "--", str(script), str(pids)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_for_ranks(pids, proc)
    torchrun = _children(proc.pid)
    assert torchrun, "the launcher started no torchrun"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=300)
    # torchrun gets SIGTERM and ends its ranks: leftover() waits until they are gone
    assert leftover(pids, torchrun, within=120) == []
