"""The ``--junit`` reporter: one ``<testsuite>`` per artifact, one ``<testcase>`` per check.

A failing check carries a ``<failure>`` listing its error (and, with ``--strict``, warning)
findings; a skipped check a ``<skipped>`` with the reason; every finding is also in the
test case's ``<system-out>``. CI servers (GitHub, GitLab, Jenkins) render this directly.
The document is built with junitparser (counts per suite and in total are its
``update_statistics``); characters XML cannot hold become U+FFFD first.
"""

from __future__ import annotations

import re
from functools import cache
from typing import TextIO

from hpcodegen.checks.result import VerifyResult


@cache
def _not_xml() -> re.Pattern[str]:
    """Characters XML 1.0 cannot hold even escaped (meta keys may contain anything);
    compiled on first use (5 ms: every verify imports this module, few write JUnit)."""
    return re.compile("[^\x09\x0a\x0d\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _x(text: str) -> str:
    return _not_xml().sub("\ufffd", text)


def to_xml(result: VerifyResult) -> object:
    """The JUnit document (a ``junitparser.JUnitXml``) of a verify result."""
    from junitparser import Failure, JUnitXml, Skipped, TestCase, TestSuite

    suites = JUnitXml("hpcodegen verify")
    for art in result.artifacts:
        suite = TestSuite(_x(art.path))
        for name, check in art.checks.items():
            case = TestCase(name, classname=_x(art.path))
            lines = [_x(f"[{f.severity}] {f.code} {f.render()}") for f in check.findings]
            if check.status == "skipped":
                case.result = [Skipped(_x(check.reason or ""))]
            elif check.status == "fail":
                failing = [ln for ln in lines if not ln.startswith("[info]")]
                first = failing[0] if failing else _x(check.reason or "failed")
                failure = Failure(first[:500], type_=name)
                failure.text = "\n".join(failing) or first
                case.result = [failure]
            if lines:
                case.system_out = "\n".join(lines)
            suite.add_testcase(case)
        suite.update_statistics()
        suites.add_testsuite(suite)
    suites.update_statistics()
    return suites


class JunitReporter:
    """Writes the JUnit XML document (UTF-8 declaration included)."""

    def write(self, result: VerifyResult, stream: TextIO, *, verbose: bool = False,
              quiet: bool = False) -> None:
        from xml.etree import ElementTree as ET

        tree = ET.fromstring(to_xml(result).tostring())  # type: ignore[attr-defined]
        ET.indent(tree)
        stream.write('<?xml version="1.0" encoding="utf-8"?>\n')
        stream.write(ET.tostring(tree, encoding="unicode"))
        stream.write("\n")
