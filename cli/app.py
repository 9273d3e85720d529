"""The ``hpcodegen`` command: one Typer app, one small module per verb.

Conventions every verb follows (docs/cli.md): ``-h``/``--help``; ``-q``/``--quiet`` and
``-v``/``--verbose``; ``--json`` prints the one envelope of docs/json.md, for results, for
refusals and for Click usage errors alike; text folds to ``COLUMNS`` (80 when piped); a
reader that closes the pipe (``| head``) ends the verb silently; progress shows only on a
terminal. Exit codes: 0 ok, 1 a check failed, 2 usage error or unreadable input.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import typer

from hpcodegen.gc_pause import own_process

app = typer.Typer(
    name="hpcodegen",
    help=(
        "Freeze, check, inspect and run tensor-parallel codegen artifacts.\n\n"
        "Exit codes: 0 ok (warnings allowed), 1 a check failed, 2 usage error or unreadable input."
    ),
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

#: the verbosity options every verb takes
QUIET = typer.Option(False, "--quiet", "-q",
                     help="Print only errors and the result: no tables, no progress.")
VERBOSE = typer.Option(False, "--verbose", "-v", help="Print more: info findings, details.")


def verbosity(quiet: bool, verbose: bool) -> int:
    """-1 quiet, 0 normal, 1 verbose (``-q -v`` together: quiet wins)."""
    return -1 if quiet else (1 if verbose else 0)


def start_progress(quiet: bool, as_json: bool) -> None:
    """Progress on stderr when it is a terminal, unless ``--quiet`` or ``--json``."""
    from hpcodegen import progress

    if quiet or as_json:
        progress.disable()
    else:
        progress.enable(sys.stderr)


def guarded(verb: str, call: Callable[[], int], as_json: bool = False) -> int:
    """Run a verb's library call and return its exit code; the last guard of every verb.

    Library code reports bad input as findings with their own exit codes; a refusal before
    the library call (a missing extra) is reported here, as the envelope under ``--json``.
    An OSError or RecursionError that escapes is about the input or the environment (exit
    2, naming the file); any other exception is a bug, shown as one line (exit 1) instead
    of a traceback, unless ``HPCODEGEN_DEBUG`` is set. A closed stdout pipe ends it quietly.
    """
    from hpcodegen.errors import HpcodegenError, error
    from hpcodegen.report.envelope import emit
    from hpcodegen.report.findings import plain_lines
    from hpcodegen.report.terminal import fold_text, reader_gone

    try:
        return call()
    except BrokenPipeError:  # `hpcodegen ... | head`: the reader has what it wanted
        reader_gone()
        return 0
    except HpcodegenError as exc:
        for line in plain_lines(exc.findings, lambda f: f"hpcodegen {verb}: {f.severity}: "):
            sys.stderr.write(fold_text(line) + "\n")
        if as_json:
            emit(verb, exc.exit_code, exc.findings, sys.stdout)
        return exc.exit_code
    except (OSError, RecursionError) as exc:
        if os.environ.get("HPCODEGEN_DEBUG"):
            raise
        return _input_problem(verb, exc, as_json)
    except (KeyboardInterrupt, SystemExit, GeneratorExit):
        raise
    except BaseException as exc:  # a library's BaseException (DCP's CheckpointException) too
        if os.environ.get("HPCODEGEN_DEBUG"):
            raise
        message = f"internal error: {type(exc).__name__}: {exc}"
        sys.stderr.write(fold_text(f"hpcodegen {verb}: {message} (set HPCODEGEN_DEBUG=1 "
                                   "for the traceback)") + "\n")
        if as_json:
            emit(verb, 1, [error("internal.error", "", message,
                                 hint="set HPCODEGEN_DEBUG=1 for the traceback")], sys.stdout)
        return 1


def _input_problem(verb: str, exc: BaseException, as_json: bool) -> int:
    """An OSError (a path too long, a file that vanished, a read-only disk) or input nested
    beyond Python's recursion limit that no library check turned into a finding: it is
    about the input or the environment, so it is reported as such (exit 2), not as an
    internal error."""
    from hpcodegen.errors import EXIT_USAGE, error
    from hpcodegen.report.envelope import emit
    from hpcodegen.report.terminal import fold_text

    if isinstance(exc, OSError):
        name = exc.filename if isinstance(exc.filename, str) else None
        shown = name if name is None or len(name) <= 200 else name[:200] + "..."
        finding = error("input.os_error", "", f"{exc.strerror or type(exc).__name__}"
                        + (f": {shown}" if shown else ""), file=shown)
    else:
        finding = error("input.too_deep", "", "the input is nested too deeply to read",
                        hint="simplify the input")
    sys.stderr.write(fold_text(f"hpcodegen {verb}: error: {finding.render()}") + "\n")
    if as_json:
        emit(verb, EXIT_USAGE, [finding], sys.stdout)
    return EXIT_USAGE


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


def register_verbs() -> None:
    """Import each verb module; each adds its command to ``app``."""
    from . import verbs  # noqa: F401


def _before_dashdash(argv: Sequence[str]) -> list[str]:
    return list(argv[:argv.index("--")]) if "--" in argv else list(argv)


def verb_of(argv: Sequence[str]) -> str | None:
    """The verb named on the command line, if any (for the envelope of a usage error)."""
    import typer.main

    names = set(typer.main.get_command(app).commands)  # type: ignore[attr-defined]
    return next((a for a in _before_dashdash(argv) if a in names), None)


def _usage_error(exc: Any, argv: Sequence[str]) -> int:
    """A Click usage error: the envelope on stdout under ``--json``, else Click's message."""
    if "--json" in _before_dashdash(argv):
        from hpcodegen.errors import error
        from hpcodegen.report.envelope import emit

        verb = verb_of(argv)
        where = (exc.param.opts[0] if getattr(exc, "param", None) is not None
                 and getattr(exc.param, "opts", None) else "")
        hint = f"hpcodegen {verb} --help" if verb else "hpcodegen --help"
        sys.stderr.write(f"hpcodegen: error: {exc.format_message()}\n")
        return emit(verb, exc.exit_code, [error("cli.usage", where, exc.format_message(),
                                                hint=hint)], sys.stdout)
    try:
        from typer import rich_utils

        rich_utils.rich_format_error(exc)
    except Exception:  # typer without rich support
        exc.show()
    return exc.exit_code


def usage_error_type() -> type[Exception]:
    """The root of the usage errors typer raises, found through typer's own API.

    typer re-exports click's ``BadParameter`` (typer < 0.26, which depends on click) or its
    vendored copy of click's (0.26 on, which does not): either way it derives from a
    ``ClickException``, the class every usage error derives from. Importing ``click`` itself
    would break on a current typer, where click is not installed at all.
    """
    return next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point; exits with the verb's code."""
    if argv is None:  # the console script or ``python -m hpcodegen``: the process is ours;
        own_process()  # a caller's own process (argv given) keeps its heap: hpcodegen.gc_pause
    register_verbs()
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        code = app(args=args, prog_name="hpcodegen", standalone_mode=False)
    except usage_error_type() as exc:
        code = _usage_error(exc, args)
    except typer.Abort:
        sys.stderr.write("Aborted!\n")
        code = 130
    except BrokenPipeError:
        from hpcodegen.report.terminal import reader_gone

        reader_gone()
        code = 0
    sys.exit(code if isinstance(code, int) else 0)
