"""``generate --cp-method``: all-gather, Ulysses or the hybrid, chosen by predicted bytes.

Every candidate is priced by :func:`hpcodegen.plan.cp.layer_bytes` (the same formula
``inspect-plan`` reports) on the attention shapes the probe forward saw; the heads rule
(:func:`hpcodegen.plan.cp.heads_problem`) rules a Ulysses degree in or out. ``auto`` takes
the cheapest feasible candidate (all-gather on a tie) and says why in a note; an explicit
method the heads do not allow is refused naming the module, the heads and the counts.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpcodegen.errors import PlanError, UsageError, error
from hpcodegen.generate.layouts.cp_probe import CPProbe
from hpcodegen.plan.cp import ALLGATHER, HYBRID, METHODS, ULYSSES, heads_problem, layer_bytes

AUTO = "auto"
#: every value of ``--cp-method``
CHOICES: tuple[str, ...] = (*METHODS, AUTO)


@dataclass(frozen=True)
class CPMethod:
    """The chosen method, its Ulysses degree (1 all-gather, cp Ulysses) and why."""

    method: str
    ulysses: int
    note: str = ""


def check_method(method: str, ulysses: int | None, cp: int) -> None:
    """Usage errors of ``--cp-method`` / ``--ulysses`` (before any model is built)."""
    if method not in CHOICES:
        raise UsageError([error("generate.cp_method", "--cp-method",
                                f"unknown method {method!r}", expected=", ".join(CHOICES))])
    if cp <= 1 and (method in (ULYSSES, HYBRID) or ulysses is not None):
        raise UsageError([error("generate.cp_method", "--cp-method",
                                f"--cp-method {method} needs --cp N with N > 1 (got {cp})",
                                hint="add --cp N")])
    if ulysses is not None and method != HYBRID:
        raise UsageError([error("generate.cp_method", "--ulysses",
                                "--ulysses is the hybrid's Ulysses degree",
                                hint="add --cp-method hybrid")])
    if method == HYBRID and (ulysses is None or not 1 < ulysses < cp or cp % ulysses):
        raise UsageError([error(
            "generate.cp_method", "--ulysses",
            f"the hybrid needs --ulysses U with 1 < U < cp and cp % U == 0; got "
            f"U={ulysses}, cp={cp}", expected="a proper divisor of --cp above 1")])


def _bytes(probe: CPProbe, method: str, degree: int, cp: int, tp: int) -> float:
    return sum(layer_bytes(method, degree, call.query, call.key, 2, cp, tp, call.value[3])
               for call in probe.attention.values())


def _problem(probe: CPProbe, degree: int, tp: int) -> tuple[str, str] | None:
    for fqn, call in sorted(probe.attention.items()):
        why = heads_problem(call.query[1], call.key[1], tp, degree)
        if why is not None:
            return fqn, why
    if degree > 1 and len({call.query[3] for call in probe.attention.values()}) > 1:
        return min(probe.attention), "its attentions have different head sizes"
    return None


def choose_method(probe: CPProbe, method: str, ulysses: int | None, cp: int,
                  tp: int) -> CPMethod:
    """The method to freeze (see the module docstring)."""
    check_method(method, ulysses, cp)
    if method == ALLGATHER:
        return CPMethod(ALLGATHER, 1)
    if method in (ULYSSES, HYBRID):
        degree = cp if method == ULYSSES else int(ulysses or 0)
        problem = _problem(probe, degree, tp)
        if problem is not None:
            raise PlanError([error(
                "generate.cp_ulysses_heads", problem[0],
                f"--cp-method {method}: {problem[1]}; Ulysses needs query heads dividing "
                f"over tp*U = {tp}*{degree}, kv heads dividing over it or into it (each "
                "rank then takes its copy of the kv head its query heads use)",
                hint="use --cp-method allgather (or auto), or a smaller --ulysses")])
        return CPMethod(method, degree)
    candidates = [(ALLGATHER, 1)] + [(ULYSSES if u == cp else HYBRID, u)
                                     for u in range(2, cp + 1) if cp % u == 0]
    priced: list[tuple[float, str, int]] = []
    refused: list[str] = []
    for name, degree in candidates:
        problem = _problem(probe, degree, tp)
        if problem is None:
            priced.append((_bytes(probe, name, degree, cp, tp), name, degree))
        else:
            refused.append(f"{name} U={degree}: {problem[1]}")
    base = priced[0][0]
    best = min(priced, key=lambda p: (p[0], p[2]))
    label = {ALLGATHER: "all-gather", ULYSSES: "Ulysses", HYBRID: f"hybrid U={best[2]}"}
    shown = ", ".join(f"{n if n != HYBRID else f'hybrid U={u}'} {b / base:.3f}"
                      for b, n, u in priced)
    call = next(iter(probe.attention.values()))
    g = call.query[1] // max(call.key[1], 1)
    note = (f"--cp-method auto: {label[best[1]]} (predicted bytes per rank per layer, "
            f"forward and backward, relative to all-gather: {shown}; cp {cp}, "
            f"{call.query[1]} query / {call.key[1]} kv heads, g={g}: all-gather / Ulysses = "
            f"cp/(g+1) = {cp / (g + 1):.3f})"
            + (f"; not possible: {'; '.join(refused)}" if refused else ""))
    return CPMethod(best[1], best[2], note)


__all__ = ["AUTO", "CHOICES", "CPMethod", "check_method", "choose_method"]
