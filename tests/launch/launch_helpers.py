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

from hpcodegen.launch.procs import alive

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "llama_tp2"
LLAMA_CONFIG = REPO / "examples" / "configs" / "llama"

@dataclass
class CliRun:
    code: int
    stdout: str
    stderr: str
    seconds: float

    def json(self) -> dict:
        return json.loads(self.stdout)


def run_cli(*args: str | Path, timeout: float = 120, env: dict | None = None) -> CliRun:
    """``python -m hpcodegen launch ARGS`` as the user would run it."""
    import os

    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "hpcodegen", "launch", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, cwd=REPO,
                          env={**os.environ, **(env or {})})
    return CliRun(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - start)


def leftover(pid_dir: Path | None, extra: list[int] = ()) -> list[int]:
    """Pids still running among ``extra`` and those a test script wrote into ``pid_dir``."""
    files = list(pid_dir.iterdir()) if pid_dir is not None else []
    pids = [int(p.read_text()) for p in files if p.read_text().strip()]
    deadline = time.monotonic() + 2.0  # SIGKILLed processes can take a moment to vanish
    while time.monotonic() < deadline:
        left = [p for p in [*pids, *extra] if alive(p)]
        if not left:
            return []
        time.sleep(0.1)
    return left
