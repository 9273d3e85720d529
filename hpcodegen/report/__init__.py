"""Renderers of a verify result: ``text`` (rich, for people), ``json`` (stable, for machines)
and ``junit`` (XML, for CI servers). Reporters never decide anything; they only render a
:class:`~hpcodegen.checks.result.VerifyResult`.
"""

from __future__ import annotations

from typing import Protocol, TextIO

from hpcodegen.checks.result import VerifyResult
from hpcodegen.report.json_report import JsonReporter
from hpcodegen.report.junit import JunitReporter
from hpcodegen.report.text import TextReporter


class Reporter(Protocol):
    """Writes a whole verify result to a text stream."""

    def write(self, result: VerifyResult, stream: TextIO, *, verbose: bool = False,
              quiet: bool = False) -> None: ...


REPORTERS: dict[str, Reporter] = {
    "text": TextReporter(),
    "json": JsonReporter(),
    "junit": JunitReporter(),
}

__all__ = ["REPORTERS", "JsonReporter", "JunitReporter", "Reporter", "TextReporter"]
