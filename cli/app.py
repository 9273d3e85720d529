"""The ``hpcodegen`` command: one Typer app, one small module per verb."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import typer

app = typer.Typer(
    name="hpcodegen",
    help=(
        "Freeze, check, inspect and run tensor-parallel codegen artifacts.\n\n"
        "Exit codes: 0 ok (warnings allowed), 1 a check failed, 2 usage error or unreadable input."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def guarded(verb: str, call: Callable[[], int]) -> int:
    """Run a verb's library call and return its exit code; the last guard of every verb.

    Library code reports bad input as findings with their own exit codes; an exception that
    still escapes is a bug, shown as one line (exit 1) instead of a traceback, unless
    ``HPCODEGEN_DEBUG`` is set.
    """
    from hpcodegen.errors import HpcodegenError

    try:
        return call()
    except HpcodegenError as exc:  # refused before the library call (a missing extra)
        for finding in exc.findings:
            sys.stderr.write(f"hpcodegen {verb}: {finding.severity}: {finding.render()}\n")
        return exc.exit_code
    except Exception as exc:
        if os.environ.get("HPCODEGEN_DEBUG"):
            raise
        sys.stderr.write(f"hpcodegen {verb}: internal error: {type(exc).__name__}: {exc} "
                         "(set HPCODEGEN_DEBUG=1 for the traceback)\n")
        return 1


def _version(value: bool) -> None:
    if value:
        from hpcodegen import __version__

        typer.echo(f"hpcodegen {__version__}")
        raise typer.Exit(0)


@app.callback()
def _options(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """Options before the verb (``hpcodegen --version``)."""


def _register() -> None:
    """Import each verb module; each adds its command to ``app``."""
    from . import verbs  # noqa: F401


def main() -> None:
    """Console-script entry point."""
    _register()
    app()
