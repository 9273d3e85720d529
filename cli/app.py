"""The ``hpcodegen`` command: one Typer app, one small module per verb."""

from __future__ import annotations

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


def _register() -> None:
    """Import each verb module; each adds its command to ``app``."""
    from . import verbs  # noqa: F401


def main() -> None:
    """Console-script entry point."""
    _register()
    app()
