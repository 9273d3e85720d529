"""Helpers for launch tests: run the real CLI (in a fresh process, or in this one for
refusals), check an artifact before its launch in this process, find leftover processes.

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


def run_here(*args: str | Path, env: dict | None = None) -> CliRun:
    """``hpcodegen launch ARGS`` in this process, through the console script's entry point
    (``tests/cli/inproc.py``: its exit code, stdout and stderr as a pipe would give them).

    For requests that start no process (refused before start, or ``--dry-run``), where the
    launcher's own process is not what is checked: a fresh interpreter costs about 0.2 s of
    CPU per run. A test that reads python's import log (torch left unimported) keeps
    :func:`run_cli`: only a fresh process has one."""
    cli = str(Path(__file__).resolve().parents[1] / "cli")
    if cli not in sys.path:
        sys.path.insert(0, cli)
    from inproc import run

    done = run("launch", *args, cwd=REPO, env=env)
    return CliRun(done.returncode, done.stdout, done.stderr)


def check_in_process(artifact: Path, model_dir: Path) -> list[dict]:
    """Run launch's pre-start model check (verify ``--only model``, what its child runs) in
    this test process and record the pass in the suite's verdict cache, so the launch of
    ``artifact`` that follows reads the verdict instead of starting the child.

    Why: the child is a fresh process importing torch and transformers (about 7 s of CPU);
    a test that has just generated the artifact in-process has them loaded already. The
    check itself still runs on the exact bytes the launch will read (the verdict is keyed
    by them), so a failing artifact still fails, here. Tests of the child itself
    (``test_model_check_prestart.py``, ``test_check_cache.py``) do not use this. Returns
    the recorded warnings; an AssertionError names the artifact when the check fails.
    """
    import io

    from hpcodegen.artifact.load import resolve_meta_path
    from hpcodegen.launch.launcher.check_cache import (
        cache_dir,
        load_verdict,
        store_verdict,
        verdict_inputs,
    )
    from hpcodegen.verify import run_verify

    config_path = Path(model_dir) / "config.json"
    cache = cache_dir()
    assert cache is not None, "the suite's verdict cache is off: nothing to record"
    inputs = verdict_inputs(resolve_meta_path(artifact), config_path)
    recorded = load_verdict(cache, inputs)
    if recorded is not None:  # these bytes were checked earlier in this run
        return recorded
    out = io.StringIO()
    code = run_verify([artifact], hf_config=config_path, only=("model",), output="json",
                      stdout=out, stderr=out)
    assert code == 0, f"model check of {artifact} failed (exit {code}): {out.getvalue()[-3000:]}"
    warnings = [f for f in json.loads(out.getvalue())["findings"] if f["severity"] != "info"]
    assert store_verdict(cache, inputs, warnings) is not None, cache
    return warnings


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
