"""``hpcodegen ARGS...`` in the test's own process, through the console script's entry point.

A CLI subprocess that imports torch and transformers pays 2 to 4 s of CPU before the verb
starts; run here, the verb pays its own work only (the worker imports torch once). The run
goes through :func:`hpcodegen.cli.app.main`, the function the ``hpcodegen`` console script
calls, so Click usage errors, ``--json`` envelopes and exit codes are the real entry
point's: the exit code is the ``SystemExit`` code the process would have ended with.
stdout and stderr are captured as a pipe would be (not a terminal: no progress, no colour),
the environment and the working directory are set for the call and restored after.

Tests keep a real process where the boundary is the point: torch left unimported, a closed
pipe, a terminal, shell completion, the installed console script.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TextIO


@contextlib.contextmanager
def _environ(env: Mapping[str, str | None]) -> Iterator[None]:
    """``os.environ`` with ``env`` applied (``None`` removes a name), restored after."""
    saved = {k: os.environ.get(k) for k in env}
    try:
        for key, value in env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def run(*args: str | Path, cwd: Path | None = None, columns: int | None = None,
        env: Mapping[str, str | None] | None = None,
        stderr: TextIO | None = None) -> subprocess.CompletedProcess[str]:
    """``hpcodegen ARGS...`` here: a ``CompletedProcess`` as ``subprocess.run`` would give.

    ``NO_COLOR=1`` and ``HPCODEGEN_DEBUG`` unset (a traceback would be a bug the tests look
    for, not one they allow); ``columns`` sets ``COLUMNS`` (the suite's 400 otherwise);
    ``stderr``, a stream the CLI writes its stderr to instead of a captured pipe (a
    terminal's: the result's ``stderr`` is then empty).
    """
    from hpcodegen.cli.app import main

    argv = [str(a) for a in args]
    full: dict[str, str | None] = {"NO_COLOR": "1", "HPCODEGEN_DEBUG": None}
    if columns is not None:
        full["COLUMNS"] = str(columns)
    full.update(env or {})
    out, err = io.StringIO(), stderr if stderr is not None else io.StringIO()
    here = os.getcwd()
    code: int | str | None = 0
    try:
        with _environ(full), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            if cwd is not None:
                os.chdir(cwd)
            try:
                main(argv)
            except SystemExit as exc:
                code = exc.code
    finally:
        os.chdir(here)
    if not isinstance(code, int):  # sys.exit("message") / sys.exit(None), as Python does
        if code is not None:
            err.write(f"{code}\n")
        code = 0 if code is None else 1
    return subprocess.CompletedProcess(["hpcodegen", *argv], code, out.getvalue(),
                                       err.getvalue() if stderr is None else "")
