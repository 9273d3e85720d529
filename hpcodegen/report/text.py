"""The human reporter. A passing artifact is one line (``PASS <path>: ...`` with its counts),
followed only by its warnings, if any; a failing one (or any with ``--verbose``) gets a
table of checks (pass / fail / skipped with why), then its findings with severity,
location, message and hint. Identical findings (the same problem at several places:
:mod:`hpcodegen.report.findings`) print once with their count and every other location.
rich is imported here only.

Info findings are counted but listed only with ``--verbose``; ``NO_COLOR`` is honoured.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, TextIO

from hpcodegen.checks.result import ArtifactResult, CheckResult, VerifyResult
from hpcodegen.errors import Finding, Severity

if TYPE_CHECKING:
    from rich.console import Console

_STATUS_STYLE = {"pass": "green", "fail": "bold red", "skipped": "yellow"}
_SEVERITY_STYLE = {Severity.ERROR: "red", Severity.WARNING: "yellow", Severity.INFO: "dim"}


def _safe(text: str) -> str:
    """Drop what a terminal cannot print (lone surrogates from JSON escapes)."""
    return text.encode("utf-8", "replace").decode("utf-8")


def _counts(check: CheckResult) -> str:
    if check.status == "skipped":
        return check.reason or "skipped"
    parts = []
    for sev in Severity:
        n = sum(f.severity == sev for f in check.findings)
        if n:
            parts.append(f"{n} {sev.value}{'s' if n > 1 else ''}")
    return ", ".join(parts) or "no findings"


def _finding_line(f: Finding, note: str = "") -> object:
    from rich.text import Text

    line = Text("  ")
    line.append(f"{f.severity.value:<7}", style=_SEVERITY_STYLE[f.severity])
    line.append(f" {f.code}  ", style="bold")
    line.append(note + _safe(f.render()))
    return line


def _print_findings(console: Console, findings: list[Finding]) -> None:
    from rich.text import Text

    from hpcodegen.report.findings import also_at, count_note, fold_identical

    for group in fold_identical(findings):
        console.print(_finding_line(group[0], count_note(group)))
        others = also_at(group)
        if others:
            console.print(Text(_safe(f"    {others}")))


def _summary(art: ArtifactResult) -> str:
    """``5 passed, 2 skipped (signature, model), 8 warnings`` (``-v`` says why skipped)."""
    checks = list(art.checks.values())
    passed = sum(c.status == "pass" for c in checks)
    skipped = [c.name for c in checks if c.status == "skipped"]
    parts = [f"{passed} passed"]
    if skipped:
        parts.append(f"{len(skipped)} skipped ({', '.join(skipped)})")
    warnings = sum(f.severity is Severity.WARNING for f in art.findings)
    if warnings:
        parts.append(f"{warnings} warning{'s' if warnings != 1 else ''}")
    return ", ".join(parts)


def _artifact(console: Console, art: ArtifactResult, verbose: bool) -> None:
    from rich.table import Table
    from rich.text import Text

    head = Text("PASS " if art.ok else "FAIL ", style="bold green" if art.ok else "bold red")
    head.append(_safe(art.path), style="bold")
    if art.ok and not verbose:  # one line; warnings (they fail with --strict) below it
        head.append(f": {_safe(_summary(art))}")
        console.print(head)
        _print_findings(console, [f for f in art.findings if f.severity is Severity.WARNING])
        return
    console.print(head)
    table = Table(show_header=True, header_style="bold", box=None, padding=(0, 2))
    table.add_column("check")
    table.add_column("status")
    table.add_column("details")
    for name, check in art.checks.items():
        table.add_row(name, Text(check.status, style=_STATUS_STYLE[check.status]),
                      Text(_safe(_counts(check))))
    console.print(table)
    _print_findings(console, [f for f in art.findings
                              if verbose or f.severity is not Severity.INFO])
    console.print()


def _total_line(result: VerifyResult) -> str:
    passed = sum(a.ok for a in result.artifacts)
    total = len(result.artifacts)
    return (f"{total} artifact{'s' if total != 1 else ''}: {passed} passed, "
            f"{total - passed} failed")


def _plain_lines(result: VerifyResult, stream: TextIO, verbose: bool,
                 quiet: bool) -> list[str] | None:
    """The report's lines when rich would print them unstyled, else None.

    That is the CI gate's common case: every artifact passed without a warning (one line
    each), not ``-v``, onto a stream that is no terminal (so no style) with no variable that
    forces one, every line printable ASCII, and the width rich folds to certain
    (:func:`_plain_width`); :func:`~hpcodegen.report.terminal.fold_text` folds as rich's
    console does. Printing these skips importing rich (about 30 ms of a whole verify).
    """
    if verbose or not result.ok or any(os.environ.get(v) for v in _FORCE_TERMINAL) \
            or any(f.severity is Severity.WARNING for a in result.artifacts
                   for f in a.findings):
        return None
    isatty = getattr(stream, "isatty", None)
    columns = _plain_width()
    if isatty is None or isatty() or columns is None:
        return None
    lines = [] if quiet else [f"PASS {a.path}: {_summary(a)}" for a in result.artifacts]
    if not quiet:
        lines.append(_total_line(result))
    if not all(line.isascii() and line.isprintable() for line in lines):
        return None
    from hpcodegen.report.terminal import fold_text

    return [fold_text(line, columns=columns) for line in lines]


#: Variables under which rich styles a stream that is no terminal.
_FORCE_TERMINAL = ("FORCE_COLOR", "TTY_COMPATIBLE")


def _plain_width() -> int | None:
    """The width rich's console folds a stream that is no terminal to, where it is certain:
    ``COLUMNS`` when it is digits, else 80 when no terminal is on fd 0-2
    (rich would take its width); None otherwise (rich then prints)."""
    if os.name == "nt":  # rich narrows a legacy Windows console by one
        return None
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit():
        return int(columns) or None  # rich prints nothing at all at COLUMNS=0
    for fd in (0, 1, 2):
        try:
            os.get_terminal_size(fd)
        except (AttributeError, ValueError, OSError):
            continue
        return None
    return 80


class TextReporter:
    """A rich summary; plain text when the stream is not a terminal."""

    def write(self, result: VerifyResult, stream: TextIO, *, verbose: bool = False,
              quiet: bool = False) -> None:
        """``quiet``: only the failing artifacts, and the summary line when one failed."""
        plain = _plain_lines(result, stream, verbose, quiet)
        if plain is not None:
            stream.write("".join(line + "\n" for line in plain))
            return
        from hpcodegen.report.terminal import console as make_console

        # width: COLUMNS, else the terminal's, else 80; long findings fold to it
        console = make_console(file=stream, no_color=bool(os.environ.get("NO_COLOR")),
                          highlight=False)
        for art in result.artifacts:
            if not (quiet and art.ok):
                _artifact(console, art, verbose)
        if quiet and result.ok:
            return
        style = "bold green" if result.ok else "bold red"
        console.print(_total_line(result), style=style)
