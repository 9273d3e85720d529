"""The ``--junit`` reporter: one ``<testsuite>`` per artifact, one ``<testcase>`` per check.

A failing check carries a ``<failure>`` listing its error (and, with ``--strict``, warning)
findings; a skipped check a ``<skipped>`` with the reason; every finding is also in the
test case's ``<system-out>``. CI servers (GitHub, GitLab, Jenkins) render this directly.
"""

from __future__ import annotations

import re
from typing import TextIO
from xml.etree import ElementTree as ET

from hpcodegen.checks.result import VerifyResult

#: Characters XML 1.0 cannot hold even escaped (meta keys may contain anything).
_NOT_XML = re.compile("[^\x09\x0a\x0d\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _x(text: str) -> str:
    return _NOT_XML.sub("\ufffd", text)


def to_xml(result: VerifyResult) -> ET.Element:
    """The JUnit XML tree of a verify result."""
    suites = ET.Element("testsuites", name="hpcodegen verify")
    total = failures = skipped = 0
    for art in result.artifacts:
        n_fail = sum(c.status == "fail" for c in art.checks.values())
        n_skip = sum(c.status == "skipped" for c in art.checks.values())
        suite = ET.SubElement(suites, "testsuite", name=_x(art.path), tests=str(len(art.checks)),
                              failures=str(n_fail), errors="0", skipped=str(n_skip))
        total, failures, skipped = total + len(art.checks), failures + n_fail, skipped + n_skip
        for name, check in art.checks.items():
            case = ET.SubElement(suite, "testcase", classname=_x(art.path), name=name)
            lines = [_x(f"[{f.severity}] {f.code} {f.render()}") for f in check.findings]
            if check.status == "skipped":
                ET.SubElement(case, "skipped", message=_x(check.reason or ""))
            elif check.status == "fail":
                failing = [ln for ln in lines if not ln.startswith("[info]")]
                first = failing[0] if failing else _x(check.reason or "failed")
                fail = ET.SubElement(case, "failure", message=first[:500], type=name)
                fail.text = "\n".join(failing) or first
            if lines:
                ET.SubElement(case, "system-out").text = "\n".join(lines)
    suites.set("tests", str(total))
    suites.set("failures", str(failures))
    suites.set("skipped", str(skipped))
    return suites


class JunitReporter:
    """Writes the JUnit XML document (UTF-8 declaration included)."""

    def write(self, result: VerifyResult, stream: TextIO, *, verbose: bool = False,
              quiet: bool = False) -> None:
        tree = to_xml(result)
        ET.indent(tree)
        stream.write('<?xml version="1.0" encoding="utf-8"?>\n')
        stream.write(ET.tostring(tree, encoding="unicode"))
        stream.write("\n")
