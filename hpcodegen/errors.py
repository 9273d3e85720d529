"""One finding shape and one exception hierarchy for the whole project.

Every problem hpcodegen reports, from a JSON syntax error to a gradient placement that does
not fit the live mesh, is a :class:`Finding`: what is wrong, where (a JSON pointer, a module
FQN or a file), what was expected, and a hint. Checks *yield* findings; code that must stop
*raises* an :class:`HpcodegenError` carrying one, and the error knows its exit code, so the
CLI never has to guess (0 ok, 1 a check failed, 2 usage error or unreadable input).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


#: Characters that could forge or hide report lines: C0/C1 controls (newline, ESC, ...),
#: Unicode line/paragraph separators, bidi controls, BOM and lone surrogates.
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u2028-\u202e\u2066-\u2069"
                          "\ufeff\ud800-\udfff]")


def printable(text: str) -> str:
    """``text`` with every control character shown as its escape (``\\n``, ``\\x1b``).

    Keys, names and messages that come from an artifact pass through here before any report
    shows them, so a key ``"lm_head\\nPASS fake"`` stays one visible line.
    """
    return _UNPRINTABLE.sub(lambda m: m.group().encode("unicode_escape",
                                                        "backslashreplace").decode("ascii"),
                            text)


class Severity(str, Enum):
    """How much a finding matters: errors fail a check, warnings only with ``--strict``."""

    ERROR = "error"
    WARNING = "warning"
    INFO = "info"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, kw_only=True)
class Finding:
    """One reported problem or note.

    Attributes:
        code: stable machine name, ``<check>.<rule>`` (e.g. ``plan.unknown_axis``).
        severity: error, warning or info.
        where: a JSON pointer (``/param_plan/lm_head/params/weight/tp``), a module FQN or a
            file name inside the artifact; ``""`` for the artifact as a whole.
        message: what is wrong, in one sentence, naming the object.
        expected: what would have been accepted, when that is short to say.
        hint: how to fix it.
        file: the file the finding is about (the meta, the modeling file, a config).
    """

    code: str
    severity: Severity
    where: str
    message: str
    expected: str | None = None
    hint: str | None = None
    file: str | None = None

    def __post_init__(self) -> None:
        """Escape control characters once, here, so every report (text, JSON, JUnit, launch)
        shows artifact-derived text as it is and never as terminal or line control."""
        for name in ("where", "message", "expected", "hint", "file"):
            value = getattr(self, name)
            if isinstance(value, str):
                object.__setattr__(self, name, printable(value))

    def render(self) -> str:
        """One line for logs and exception messages: ``file::where: message (expected ...)``.

        ``file::`` is left out when there is no pointer, or the pointer is the file itself.
        """
        same = not self.where or self.where == self.file
        loc = f"{self.file}::{self.where}" if self.file and not same else self.file or self.where
        text = f"{loc}: {self.message}" if loc else self.message
        if self.expected:
            text += f" (expected {self.expected})"
        if self.hint:
            text += f"; hint: {self.hint}"
        return text

    def to_json(self) -> dict[str, str | None]:
        """The stable JSON shape used by ``--json`` outputs."""
        return {
            "code": self.code,
            "severity": self.severity.value,
            "path": self.where,
            "file": self.file,
            "message": self.message,
            "expected": self.expected,
            "hint": self.hint,
        }


def pointer(*parts: object) -> str:
    """An RFC 6901 JSON pointer, the ``where`` of findings about the meta.

    Every JSON location hpcodegen reports is built here, so ``~`` and ``/`` inside a module
    FQN or a key are escaped alike everywhere.

    Example::

        >>> pointer("param_plan", "a/b", 0)
        '/param_plan/a~1b/0'
    """
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def error(code: str, where: str, message: str, **kw: str | None) -> Finding:
    """Shorthand for an error finding."""
    return Finding(code=code, severity=Severity.ERROR, where=where, message=message, **kw)


def warning(code: str, where: str, message: str, **kw: str | None) -> Finding:
    """Shorthand for a warning finding."""
    return Finding(code=code, severity=Severity.WARNING, where=where, message=message, **kw)


def info(code: str, where: str, message: str, **kw: str | None) -> Finding:
    """Shorthand for an info finding."""
    return Finding(code=code, severity=Severity.INFO, where=where, message=message, **kw)


@dataclass
class HpcodegenError(Exception):
    """Base of every error hpcodegen raises on purpose; carries findings and an exit code."""

    findings: list[Finding] = field(default_factory=list)
    exit_code: int = EXIT_FAILED

    def __post_init__(self) -> None:
        super().__init__(self.__str__())

    def __str__(self) -> str:
        return "; ".join(f.render() for f in self.findings) or type(self).__name__

    @classmethod
    def of(cls, code: str, where: str, message: str, **kw: str | None) -> HpcodegenError:
        """Build the error from a single error finding."""
        return cls([error(code, where, message, **kw)])


class InputError(HpcodegenError):
    """Unreadable or missing input (a path, a file that is not JSON): exit code 2."""

    def __init__(self, findings: list[Finding]) -> None:
        super().__init__(findings, EXIT_USAGE)


class UsageError(HpcodegenError):
    """The command line asks for something impossible: exit code 2."""

    def __init__(self, findings: list[Finding]) -> None:
        super().__init__(findings, EXIT_USAGE)


class PlanError(HpcodegenError):
    """A frozen plan cannot be generated, installed or executed as declared: exit code 1."""

    def __init__(self, findings: list[Finding]) -> None:
        super().__init__(findings, EXIT_FAILED)


class PlacementMismatchError(PlanError):
    """A parameter is already sharded with placements other than the plan declares."""
