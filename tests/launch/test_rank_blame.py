"""launch names the rank that failed first, from torchrun's own per-rank failure records,
and keeps torchrun's banners and tracebacks off the console (issue 10, item 8)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from launch_helpers import EXAMPLE, LLAMA_CONFIG, check_in_process, run_cli, run_here

#: What torchrun prints on a failure; none of it may reach the console.
TORCHRUN_NOISE = re.compile(r"ChildFailedError|SignalException|torch\.distributed\.elastic|"
                            r"Root Cause|Traceback \(most recent call last\)|\*{20}")

DIE_ON_1 = """
import os, signal, sys, time
if int(os.environ["RANK"]) == 1:
    time.sleep(1)
    if sys.argv[1] == "exit":
        os._exit(3)
    os.kill(os.getpid(), getattr(signal, sys.argv[1]))
time.sleep(120)
"""

RAISE_ON_1 = """
import os, time
print("script output from rank", os.environ["RANK"], flush=True)
def deep():
    raise ValueError("boom from rank one")
if int(os.environ["RANK"]) == 1:
    time.sleep(1)
    deep()
time.sleep(120)
"""


def _script(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "job.py"
    path.write_text(text)
    return path


def _report(run) -> str:
    lines = [line for line in run.stderr.splitlines() if line.startswith("rank ")]
    assert len(lines) == 1, run.stderr
    return lines[0]


@pytest.mark.timeout(400)
@pytest.mark.parametrize(("how", "said"), [
    ("exit", "rank 1 exited with code 3 before reporting a result"),
    ("SIGKILL", "rank 1 was killed by signal 9 (SIGKILL) before reporting a result"),
    ("SIGSEGV", "rank 1 was killed by signal 11 (SIGSEGV) before reporting a result")])
def test_rank_ending_without_a_record_is_named_from_torchrun(tmp_path, how, said):
    logs = tmp_path / "logs"
    run = run_cli(EXAMPLE, "--nproc", "2", "--device", "cpu", "--log-dir", logs, "--",
                  _script(tmp_path, DIE_ON_1), how)
    assert run.code == 1
    report = _report(run)
    assert report.startswith(said), report
    killed = how != "exit"  # a signal: the row says killed, the line the likely cause
    assert ("likely cause: " in report) is killed, report
    assert ("killed" in run.stdout) is killed and ("lost" in run.stdout) is not killed
    log = Path(report.split("(log: ")[1].split(")")[0])
    assert log.name == "stderr.log" and log.parent.name == "1" and log.exists()
    assert not TORCHRUN_NOISE.search(run.stdout + run.stderr), run.stderr
    assert "Root Cause" in (logs / "torchrun.log").read_text()  # torchrun's report, kept


@pytest.mark.timeout(400)
def test_smoke_job_rank_killed_is_named(tmp_path):
    check_in_process(EXAMPLE, LLAMA_CONFIG)  # the launch reads the verdict: no check child
    run = run_cli(EXAMPLE, "--nproc", "2", "--device", "cpu", "--model-dir", LLAMA_CONFIG,
                  env={"HPCODEGEN_FAULT": "kill:1"})
    assert run.code == 1
    assert _report(run).startswith("rank 1 was killed by signal 9 (SIGKILL)"), run.stderr
    assert not TORCHRUN_NOISE.search(run.stdout + run.stderr), run.stderr


@pytest.mark.timeout(400)
def test_user_script_failure_shows_its_own_traceback_tail(tmp_path):
    run = run_cli(EXAMPLE, "--nproc", "2", "--device", "cpu", "--",
                  _script(tmp_path, RAISE_ON_1))
    assert run.code == 1
    assert _report(run).startswith("rank 1 failed: ValueError: boom from rank one (log: ")
    lines = run.stderr.splitlines()
    head = lines.index(next(line for line in lines if line.startswith("traceback of job.py")))
    assert "on rank 1" in lines[head]
    tail = lines[head + 1:]
    assert tail[-1] == "  | ValueError: boom from rank one"
    assert any('job.py", line 5, in deep' in line for line in tail)
    assert not any("hpcodegen/launch" in line or "runpy" in line for line in tail), tail
    assert "script output from rank" in run.stdout  # the script's own stdout stays visible
    assert not TORCHRUN_NOISE.search(run.stdout + "\n".join(lines[:head])), run.stderr


def test_more_cpu_ranks_than_cores_is_a_warning_with_both_numbers():
    import os

    cores = len(os.sched_getaffinity(0))
    run = run_here(EXAMPLE, "--nproc", str(cores * 16), "--device", "cpu", "--model-dir",
                   LLAMA_CONFIG, "--dry-run")
    assert run.code == 0
    warning = [line for line in run.stderr.splitlines() if "warning" in line]
    assert len(warning) == 1, run.stderr
    assert f"{cores * 16} CPU ranks on {cores} core" in warning[0]
    quiet = run_here(EXAMPLE, "--nproc", "1", "--device", "cpu", "--model-dir", LLAMA_CONFIG,
                     "--dry-run")
    assert "warning" not in quiet.stderr
