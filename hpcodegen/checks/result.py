"""What a verify run found, per artifact and per check; it never prints.

The JSON form (:meth:`VerifyResult.to_json`) is the stable ``--json`` shape::

    {"ok": bool,
     "artifacts": [{"path": str, "ok": bool,
                    "checks": {name: {"status": "pass" | "fail" | "skipped",
                                      "reason": str | null,
                                      "findings": [Finding.to_json(), ...]}}}]}

An artifact whose meta cannot be read has one pseudo-check ``load`` with status ``fail``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from hpcodegen.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE, Finding, Severity, printable

Status = Literal["pass", "fail", "skipped"]


def status_of(findings: Iterable[Finding], strict: bool) -> Status:
    """``fail`` on any error, or on any warning when ``strict``; else ``pass``."""
    failing = {Severity.ERROR, Severity.WARNING} if strict else {Severity.ERROR}
    return "fail" if any(f.severity in failing for f in findings) else "pass"


@dataclass
class CheckResult:
    """One check's outcome on one artifact."""

    name: str
    status: Status
    findings: list[Finding] = field(default_factory=list)
    #: why the check was skipped (or, for ``load``, why the input is unreadable)
    reason: str | None = None

    def __post_init__(self) -> None:
        if self.reason is not None:
            self.reason = printable(self.reason)

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status, "reason": self.reason,
                "findings": [f.to_json() for f in self.findings]}


@dataclass
class ArtifactResult:
    """Every check's outcome on one artifact path (as given on the command line)."""

    path: str
    checks: dict[str, CheckResult] = field(default_factory=dict)
    #: the meta (or an input a check needs, such as ``--hf-config``) could not be read
    unreadable: bool = False

    def __post_init__(self) -> None:
        self.path = printable(self.path)  # a directory name may hold a newline too

    @property
    def ok(self) -> bool:
        return not self.unreadable and all(c.status != "fail" for c in self.checks.values())

    @property
    def findings(self) -> list[Finding]:
        return [f for c in self.checks.values() for f in c.findings]

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "ok": self.ok,
                "checks": {name: c.to_json() for name, c in self.checks.items()}}


@dataclass
class VerifyResult:
    """The whole run: one :class:`ArtifactResult` per path."""

    artifacts: list[ArtifactResult] = field(default_factory=list)
    strict: bool = False

    @property
    def ok(self) -> bool:
        return all(a.ok for a in self.artifacts)

    @property
    def exit_code(self) -> int:
        """2 when any input is unreadable, else 1 when any check failed, else 0."""
        if any(a.unreadable for a in self.artifacts):
            return EXIT_USAGE
        return EXIT_OK if self.ok else EXIT_FAILED

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "artifacts": [a.to_json() for a in self.artifacts]}
