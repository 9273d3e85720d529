"""The ``targets`` check: every injection ``_target_`` resolves through the registry.

A check of its own (not part of ``plan``) so that ``--skip plan`` never turns the gate's
security rule off by the way: only ``--skip targets`` does. The rule and its codes
(``plan.foreign_target``, ``plan.foreign_system_target``: stable, the runtime raises the
same) are :func:`hpcodegen.targets.target_findings`; nothing is imported.
"""

from __future__ import annotations

from collections.abc import Iterator

from hpcodegen.checks.context import CheckContext
from hpcodegen.errors import Finding
from hpcodegen.targets import target_findings


def check_targets(ctx: CheckContext) -> Iterator[Finding]:
    """A finding per injection target outside the registry and the trusted prefixes."""
    yield from target_findings(ctx.loaded, ctx.allowed_targets)
