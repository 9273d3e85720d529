"""The one JSON envelope every verb prints under ``--json`` (docs/json.md).

Every ``--json`` document, success or error, from ``verify`` to a Click usage error, is one
JSON object on stdout with these keys first::

    {"version": 1,                  # the envelope's version; keys are only ever added
     "tool": "hpcodegen", "tool_version": "0.1.0",
     "verb": "verify",              # or inspect-plan, generate, launch, schema, null
     "status": "ok" | "fail" | "error",   # exit 0 | 1 | 2
     "exit_code": 0,
     "findings": [{"code", "severity", "path", "file", "message", "expected", "hint"}],
     ...}                           # the verb's own keys (its docs page)

A consumer checks ``status`` (or ``exit_code``) and reads ``findings`` the same way for
every verb; the verb's own keys never replace these.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, TextIO

from hpcodegen.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE, Finding

ENVELOPE_VERSION = 1
STATUS_BY_EXIT = {EXIT_OK: "ok", EXIT_FAILED: "fail", EXIT_USAGE: "error"}
ENVELOPE_KEYS = ("version", "tool", "tool_version", "verb", "status", "exit_code", "findings")


def status_of(exit_code: int) -> str:
    """``ok`` (0), ``fail`` (1, a check failed), ``error`` (2, usage or unreadable input)."""
    return STATUS_BY_EXIT.get(exit_code, "fail")


def envelope(verb: str | None, exit_code: int,
             findings: Iterable[Finding | Mapping[str, Any]] = (),
             **payload: Any) -> dict[str, Any]:
    """The document: envelope keys first, then the verb's ``payload`` (which cannot override
    them)."""
    from hpcodegen import __version__

    doc: dict[str, Any] = {
        "version": ENVELOPE_VERSION,
        "tool": "hpcodegen",
        "tool_version": __version__,
        "verb": verb,
        "status": status_of(exit_code),
        "exit_code": exit_code,
        "findings": [f.to_json() if isinstance(f, Finding) else dict(f) for f in findings],
    }
    clash = set(payload) & set(ENVELOPE_KEYS)
    if clash:
        raise ValueError(f"payload keys {sorted(clash)} belong to the envelope")
    doc.update(payload)
    return doc


def write_json(doc: Mapping[str, Any], stream: TextIO) -> None:
    """One indented JSON document and a newline (ASCII: safe on any terminal or log)."""
    json.dump(doc, stream, indent=2, ensure_ascii=True)
    stream.write("\n")
    stream.flush()


def emit(verb: str | None, exit_code: int, findings: Iterable[Finding | Mapping[str, Any]],
         stream: TextIO, **payload: Any) -> int:
    """Write :func:`envelope` to ``stream``; returns ``exit_code`` (for ``return emit(...)``)."""
    write_json(envelope(verb, exit_code, findings, **payload), stream)
    return exit_code
