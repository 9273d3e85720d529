"""With ``--sp``: generate refuses to freeze a sequence-sharded boundary nested in one that
gathers the sequence (the rule and why: :mod:`hpcodegen.plan.sp_nesting`, which verify
applies to hand-edited plans too)."""

from __future__ import annotations

from collections.abc import Mapping

from hpcodegen.errors import PlanError, error
from hpcodegen.plan.sp_nesting import describe, nested_gathers
from hpcodegen.plan.types import PlanEntry


def check_nested_gathers(entries: Mapping[str, PlanEntry]) -> None:
    """PlanError ``generate.sp_nested_gather``, one finding per gathering parent, naming
    its first sequence-sharded boundary inside."""
    problems = [error("generate.sp_nested_gather", inner[0], describe(parent, inner),
                      hint="generate without --sp")
                for parent, inner in nested_gathers(entries)]
    if problems:
        raise PlanError(problems)
