"""With ``--sp``: a boundary inside one that gathers the sequence must not gather it again.

A boundary that gathers the sequence on entry (``S(1) -> R`` on its inputs: the parent of a
``rowwise_split_input`` Linear whose forward reshapes by the length it sees, OPT's decoder
layer holding fc1/fc2) hands its children the whole sequence. A boundary nested in it
that still declares a sequence-sharded transition (a region lifted as if it saw one
rank's slice, ``S(1) -> R`` in, ``P(sum) -> S(1)`` out) would gather a sequence that is
already whole and scatter the result back into the parent's replicated compute: the
shapes can come out right (twice the length in, half out) while every value is wrong,
which no shape run notices. Such a plan is refused, naming both modules (pure).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hpcodegen.errors import PlanError, error
from hpcodegen.plan.entry import is_boundary

#: the sequence-sharded placement of ``(batch, seq, ...)`` activations
SEQ = "S(1)"
_SIDES = ("in_src", "in_dst", "out_src", "out_dst")


def _tp(named: Any) -> Any:
    return named.get("tp") if isinstance(named, Mapping) else None


def gathers_sequence(entry: Mapping[str, Any]) -> bool:
    """Whether a boundary takes some input sequence-sharded and runs it whole."""
    src, dst = entry.get("in_src") or {}, entry.get("in_dst") or {}
    return is_boundary(entry) and any(_tp(src.get(n)) == SEQ and _tp(dst.get(n)) == "R"
                                      for n in src)


def sequence_sharded(entry: Mapping[str, Any]) -> bool:
    """Whether a boundary declares any sequence-sharded placement."""
    return is_boundary(entry) and any(_tp(p) == SEQ for side in _SIDES
                                      for p in (entry.get(side) or {}).values())


def check_nested_gathers(plan: Mapping[str, Mapping[str, Any]]) -> None:
    """Refuse sequence-sharded boundaries inside a sequence-gathering one (module
    docstring): PlanError ``generate.sp_nested_gather``, one finding per gathering parent."""
    problems = []
    for parent, entry in sorted(plan.items()):
        if not parent or not gathers_sequence(entry):
            continue
        inner = sorted(f for f, e in plan.items()
                       if f.startswith(f"{parent}.") and sequence_sharded(e))
        if inner:
            more = f" (and {len(inner) - 1} more)" if len(inner) > 1 else ""
            problems.append(error(
                "generate.sp_nested_gather", inner[0],
                f"with sequence parallelism (--sp) {parent} gathers the whole sequence on "
                f"entry (its forward must see all of it), but {inner[0]}{more} inside it "
                "declares a sequence-sharded transition: it would gather a sequence that is "
                "already whole and hand back a slice to replicated compute",
                hint="generate without --sp"))
    if problems:
        raise PlanError(problems)
