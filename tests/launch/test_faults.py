"""Faults end the whole job: a raising rank promptly, a hang at --timeout; no process left."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from launch_helpers import EXAMPLE, LLAMA_CONFIG, leftover, run_cli

RAISE_ON_1 = """
import os, pathlib, sys, time
rank = int(os.environ["RANK"])
pathlib.Path(sys.argv[1], f"pid{rank}").write_text(str(os.getpid()))
assert os.environ["HPCODEGEN_ARTIFACT"]
if rank == 1:
    time.sleep(1)
    raise ValueError("boom from rank one")
time.sleep(300)   # a rank blocked forever, as in a collective its peer never joins
"""

HANG_ON_0 = """
import os, pathlib, subprocess, sys, time
rank = int(os.environ["RANK"])
pathlib.Path(sys.argv[1], f"pid{rank}").write_text(str(os.getpid()))
if rank == 0:   # a grandchild in the rank's session must be ended too
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    pathlib.Path(sys.argv[1], "child").write_text(str(child.pid))
time.sleep(300)
"""


def _script(tmp_path, text):
    script = tmp_path / "job.py"
    script.write_text(text)
    pids = tmp_path / "pids"
    pids.mkdir()
    return script, pids


@pytest.mark.timeout(60)
def test_raising_rank_ends_the_job(tmp_path):
    script, pids = _script(tmp_path, RAISE_ON_1)
    logs = tmp_path / "logs"
    run = run_cli(EXAMPLE, "--nproc", "2", "--device", "cpu", "--log-dir", logs, "--",
                  script, pids)
    assert run.code == 1
    failure = [line for line in run.stderr.splitlines() if line.startswith("rank 1 failed")]
    assert len(failure) == 1, run.stderr
    assert "ValueError: boom from rank one" in failure[0]
    assert "stderr.log" in failure[0]
    assert run.seconds < 15
    assert len(list(pids.iterdir())) == 2
    assert leftover(pids) == []
    log = failure[0].split("(log: ")[1].rstrip(")")
    assert "boom from rank one" in Path(log).read_text()


@pytest.mark.timeout(60)
def test_injected_fault_in_the_smoke_job(tmp_path):
    """HPCODEGEN_FAULT=raise:1: rank 1 raises at start-up while rank 0 builds the model."""
    run = run_cli(EXAMPLE, "--nproc", "2", "--device", "cpu", "--model-dir", LLAMA_CONFIG,
                  "--json", "--log-dir", tmp_path / "logs",
                  env={"HPCODEGEN_FAULT": "raise:1"})
    assert run.code == 1
    doc = run.json()
    assert doc["message"].startswith("rank 1 failed: InjectedFault")
    assert (doc["status"], doc["findings"][0]["code"]) == ("fail", "launch.failed")
    assert Path(doc["run_dir"]).is_dir()  # kept (--log-dir): reported
    statuses = {r["rank"]: r["status"] for r in doc["ranks"]}
    assert statuses[1] == "error"
    assert run.seconds < 15
    assert leftover(None, [p for p in doc["pids"] if p]) == []


@pytest.mark.timeout(60)
def test_hang_ends_at_timeout(tmp_path):
    script, pids = _script(tmp_path, HANG_ON_0)
    run = run_cli(EXAMPLE, "--nproc", "2", "--device", "cpu", "--timeout", "6",
                  "--json", "--log-dir", tmp_path / "logs", "--", script, pids)
    assert run.code == 1
    doc = run.json()
    assert doc["timed_out"] is True
    assert doc["message"].startswith("timed out after 6 s")
    assert {r["status"] for r in doc["ranks"]} == {"ended"}
    assert 6 <= run.seconds < 20
    assert (pids / "child").exists()
    assert leftover(pids, doc["pids"]) == []


@pytest.mark.timeout(60)
def test_sigterm_to_the_launcher_ends_the_job(tmp_path):
    """A CI runner killing the launcher must not orphan torchrun or its ranks."""
    import os
    import signal
    import subprocess
    import sys
    import time

    script, pids = _script(tmp_path, HANG_ON_0)
    proc = subprocess.Popen([sys.executable, "-m", "hpcodegen", "launch", str(EXAMPLE),
                             "--nproc", "2", "--device", "cpu", "--json", "--log-dir",
                             str(tmp_path / "logs"), "--", str(script),
                             str(pids)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)
    deadline = time.monotonic() + 40
    while len(list(pids.iterdir())) < 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
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
@pytest.mark.timeout(60)
def test_sigkill_of_the_launcher_still_ends_the_job(tmp_path):
    """A launcher that runs no code (SIGKILL) must not orphan torchrun or its ranks."""
    import os
    import signal
    import subprocess
    import sys
    import time

    script, pids = _script(tmp_path, HANG_ON_0)
    proc = subprocess.Popen([sys.executable, "-m", "hpcodegen", "launch", str(EXAMPLE),
                             "--nproc", "2", "--device", "cpu", "--log-dir",
                             str(tmp_path / "logs"), "--", str(script), str(pids)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 40
    while len(list(pids.iterdir())) < 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    torchrun = _children(proc.pid)
    assert torchrun, "the launcher started no torchrun"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    deadline = time.monotonic() + 20  # torchrun gets SIGTERM and ends its ranks
    while leftover(pids, torchrun) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert leftover(pids, torchrun) == []
