"""Helpers for launch tests: run the real CLI, find leftover processes.

Imported by module name (tests/ directories are not packages).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from hpcodegen.launch.launcher.procs import alive

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "llama_tp2"
LLAMA_CONFIG = REPO / "examples" / "configs" / "llama"

@dataclass
class CliRun:
    code: int
    stdout: str
    stderr: str

    def json(self) -> dict:
        return json.loads(self.stdout)


def run_cli(*args: str | Path, timeout: float = 300, env: dict | None = None) -> CliRun:
    """``python -m hpcodegen launch ARGS`` as the user would run it."""
    import os

    proc = subprocess.run([sys.executable, "-m", "hpcodegen", "launch", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, cwd=REPO,
                          env={**os.environ, **(env or {})})
    return CliRun(proc.returncode, proc.stdout, proc.stderr)


def leftover(pid_dir: Path | None, extra: list[int] = (), within: float = 30.0) -> list[int]:
    """Pids still running among ``extra`` and those a test script wrote into ``pid_dir``,
    once they have had ``within`` seconds to go (SIGKILLed processes take a moment to be
    reaped; on a loaded machine, longer). Returns as soon as none is left: the bound only
    keeps a test from hanging, it times nothing."""
    files = list(pid_dir.iterdir()) if pid_dir is not None else []
    pids = [int(p.read_text()) for p in files if p.read_text().strip()]
    deadline = time.monotonic() + within
    while True:
        left = [p for p in [*pids, *extra] if alive(p)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.1)
