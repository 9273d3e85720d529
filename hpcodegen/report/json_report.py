"""The ``--json`` reporter: :meth:`VerifyResult.to_json` on one line-stable, indented document.

Shape (stable; see docs/verify.md)::

    {"ok": true|false,
     "artifacts": [{"path": "...", "ok": ...,
                    "checks": {"schema": {"status": "pass"|"fail"|"skipped",
                                          "reason": null|"...",
                                          "findings": [{"code", "severity", "path", "file",
                                                        "message", "expected", "hint"}]}}}]}
"""

from __future__ import annotations

import json
from typing import TextIO

from hpcodegen.checks.result import VerifyResult


class JsonReporter:
    """Writes the JSON document followed by a newline."""

    def write(self, result: VerifyResult, stream: TextIO, *, verbose: bool = False) -> None:
        json.dump(result.to_json(), stream, indent=2, ensure_ascii=True)
        stream.write("\n")
