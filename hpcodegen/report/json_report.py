"""The ``--json`` reporter: verify's result in the one envelope (docs/json.md).

Shape (stable; see docs/verify.md): the envelope keys (``version``, ``tool``, ``verb``,
``status``, ``exit_code``, ``findings``: every finding of the run, each with its
``artifact`` and ``check``), then::

    {"ok": true|false,
     "artifacts": [{"path": "...", "ok": ...,
                    "checks": {"schema": {"status": "pass"|"fail"|"skipped",
                                          "reason": null|"...",
                                          "findings": [{"code", "severity", "path", "file",
                                                        "message", "expected", "hint"}]}}}]}
"""

from __future__ import annotations

from typing import Any, TextIO

from hpcodegen.checks.result import VerifyResult
from hpcodegen.report.envelope import envelope, write_json


def flat_findings(result: VerifyResult) -> list[dict[str, Any]]:
    """Every finding of the run, each naming its artifact and check."""
    return [{**f.to_json(), "artifact": art.path, "check": name}
            for art in result.artifacts for name, check in art.checks.items()
            for f in check.findings]


def to_json(result: VerifyResult) -> dict[str, Any]:
    """The whole ``verify --json`` document."""
    return envelope("verify", result.exit_code, flat_findings(result), **result.to_json())


class JsonReporter:
    """Writes the JSON document followed by a newline."""

    def write(self, result: VerifyResult, stream: TextIO, *, verbose: bool = False,
              quiet: bool = False) -> None:
        write_json(to_json(result), stream)
