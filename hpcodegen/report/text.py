"""The human reporter: per artifact a table of checks (pass / fail / skipped with why), then
its findings with severity, location, message and hint. rich is imported here only.

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


def _finding_line(f: Finding) -> object:
    from rich.text import Text

    line = Text("  ")
    line.append(f"{f.severity.value:<7}", style=_SEVERITY_STYLE[f.severity])
    line.append(f" {f.code}  ", style="bold")
    line.append(_safe(f.render()))
    return line


def _artifact(console: Console, art: ArtifactResult, verbose: bool) -> None:
    from rich.table import Table
    from rich.text import Text

    head = Text("PASS " if art.ok else "FAIL ", style="bold green" if art.ok else "bold red")
    head.append(_safe(art.path), style="bold")
    console.print(head)
    table = Table(show_header=True, header_style="bold", box=None, padding=(0, 2))
    table.add_column("check")
    table.add_column("status")
    table.add_column("details")
    for name, check in art.checks.items():
        table.add_row(name, Text(check.status, style=_STATUS_STYLE[check.status]),
                      Text(_safe(_counts(check))))
    console.print(table)
    for check in art.checks.values():
        for f in check.findings:
            if verbose or f.severity is not Severity.INFO:
                console.print(_finding_line(f))
    console.print()


class TextReporter:
    """A rich summary; plain text when the stream is not a terminal."""

    def write(self, result: VerifyResult, stream: TextIO, *, verbose: bool = False,
              quiet: bool = False) -> None:
        """``quiet``: only the failing artifacts, and the summary line when one failed."""
        from hpcodegen.report.terminal import console as make_console

        # width: COLUMNS, else the terminal's, else 80; long findings fold to it
        console = make_console(file=stream, no_color=bool(os.environ.get("NO_COLOR")),
                          highlight=False)
        for art in result.artifacts:
            if not (quiet and art.ok):
                _artifact(console, art, verbose)
        if quiet and result.ok:
            return
        passed = sum(a.ok for a in result.artifacts)
        total = len(result.artifacts)
        style = "bold green" if result.ok else "bold red"
        console.print(f"{total} artifact{'s' if total != 1 else ''}: {passed} passed, "
                      f"{total - passed} failed", style=style)
