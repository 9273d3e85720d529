"""Under sequence parallelism, a boundary inside one that gathers the sequence must not
gather it again (pure; one rule for generate and verify).

A boundary that gathers the sequence on entry (an input ``S(1) -> R`` on tp: OPT's decoder
layer holding fc1/fc2, whose forward reshapes by the length it sees) hands its children
the whole sequence. A boundary nested in it whose transitions still move the sequence (a
region lifted as if it saw one rank's slice: ``S(1) -> R`` in, ``P(sum) -> S(1)`` out)
would gather a sequence that is already whole and scatter the result back into
the parent's replicated compute: the shapes can come out right (twice the length in, half
out) while every value is wrong, which no shape run notices. generate refuses to freeze
such a plan; verify refuses a hand-edited one.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from hpcodegen.placement import Replicate, Shard
from hpcodegen.plan.types import TP, NamedPlacements, PlanEntry

#: the sequence dim of ``(batch, seq, ...)`` activations
SEQ = Shard(1)


def _tp(placements: NamedPlacements | None, name: str) -> object:
    named = (placements or {}).get(name)
    return named.get(TP) if named is not None else None


def gathers_sequence(entry: PlanEntry) -> bool:
    """A boundary that takes some input sequence-sharded and runs it whole."""
    return entry.boundary and any(
        _tp(entry.in_src, name) == SEQ and isinstance(_tp(entry.in_dst, name), Replicate)
        for name in entry.in_src or {})


def moves_sequence(entry: PlanEntry) -> bool:
    """A boundary whose transitions gather or scatter the sequence on tp (an input or an
    output whose source and destination differ, one of them ``S(1)``). One that declares
    ``S(1) -> S(1)`` moves nothing (the existing system's per-head norms nested in the
    attention) and is harmless inside a gathering parent."""
    pairs = [(entry.in_src, entry.in_dst), (entry.out_src, entry.out_dst)]
    return entry.boundary and any(
        _tp(src, name) != _tp(dst, name) and SEQ in (_tp(src, name), _tp(dst, name))
        for src, dst in pairs for name in {*(src or {}), *(dst or {})})


def nested_gathers(entries: Mapping[str, PlanEntry]) -> Iterator[tuple[str, list[str]]]:
    """``(gathering parent, the boundaries inside it that move the sequence)`` per parent,
    in FQN order."""
    gathering = {f for f, e in entries.items() if f and gathers_sequence(e)}
    if not gathering:
        return
    inside: dict[str, list[str]] = {}
    above: dict[str, tuple[str, ...]] = {"": ()}
    for fqn, entry in entries.items():  # each entry's ancestors: linear in the plan
        parents = _gathering_above(fqn.rpartition(".")[0], gathering, above)
        if parents and moves_sequence(entry):  # the cheap test first: most have no such parent
            for parent in parents:
                inside.setdefault(parent, []).append(fqn)
    for parent in sorted(inside):
        yield parent, sorted(inside[parent])


def _gathering_above(prefix: str, gathering: set[str],
                     above: dict[str, tuple[str, ...]]) -> tuple[str, ...]:
    """The modules of ``gathering`` at or above module ``prefix`` (the root aside),
    outermost first; ``above`` memoizes them per module, so each call walks up only to
    the first module seen."""
    walked = []
    while prefix not in above:
        walked.append(prefix)
        prefix = prefix.rpartition(".")[0]
    found = above[prefix]
    for module in reversed(walked):  # outermost first
        found = (*found, module) if module in gathering else found
        above[module] = found
    return found


def describe(parent: str, inner: list[str]) -> str:
    """The finding's message for one parent."""
    more = f" (and {len(inner) - 1} more)" if len(inner) > 1 else ""
    return (f"with sequence parallelism (--sp) {parent} gathers the whole sequence on entry "
            f"(its forward must see all of it), but {inner[0]}{more} inside it gathers or "
            "scatters the sequence again: it would gather a sequence that is already whole "
            "and hand back a slice to replicated compute")


__all__ = ["describe", "gathers_sequence", "moves_sequence", "nested_gathers"]
