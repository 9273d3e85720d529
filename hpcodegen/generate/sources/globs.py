"""FQN globs for HF plans and recipes (pure).

A glob is matched segment by segment on dotted module FQNs: ``*`` (and any ``fnmatch``
pattern) matches within one segment, ``**`` matches any number of whole segments (zero
included). So ``layers.*.self_attn`` matches ``layers.0.self_attn`` but not
``layers.0.x.self_attn``, as HF's plan keys intend; ``**.mlp`` matches every ``mlp``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from fnmatch import fnmatchcase


def _match(pattern: Sequence[str], parts: Sequence[str]) -> bool:
    """Segment-wise match by dynamic programming: ``len(pattern) x len(parts)`` steps
    whatever the pattern (a recursion over ``**`` would be exponential in their count)."""
    # reach[j]: the pattern read so far matches parts[:j]
    reach = [True] + [False] * len(parts)
    for head in pattern:
        if head == "**":  # any number of whole segments, zero included
            for j in range(1, len(parts) + 1):
                reach[j] = reach[j] or reach[j - 1]
        else:
            reach = [False] + [reach[j] and fnmatchcase(parts[j], head)
                               for j in range(len(parts))]
        if not any(reach):
            return False
    return reach[-1]


def fqn_matches(glob: str, fqn: str) -> bool:
    """True when module ``fqn`` matches ``glob`` (``""`` only matches the root)."""
    pattern = glob.split(".") if glob else []
    parts = fqn.split(".") if fqn else []
    if len(pattern) != len(parts) and "**" not in pattern:
        # each segment of a glob without ``**`` matches exactly one segment: an HF plan's
        # rules are checked against every module of the model, most of them other depths
        return False
    return _match(pattern, parts)


def expand_glob(glob: str, fqns: Iterable[str]) -> list[str]:
    """Every FQN of ``fqns`` that ``glob`` matches, in the given order."""
    return [fqn for fqn in fqns if fqn_matches(glob, fqn)]


def relative_to(fqn: str, prefix: str) -> str | None:
    """``fqn`` relative to module ``prefix`` (``""`` for itself), None when outside it."""
    if not prefix:
        return fqn
    if fqn == prefix:
        return ""
    return fqn[len(prefix) + 1:] if fqn.startswith(prefix + ".") else None


def parent_of(fqn: str) -> str:
    """``a.b.c`` -> ``a.b``; a top-level name -> ``""`` (the root)."""
    return fqn.rsplit(".", 1)[0] if "." in fqn else ""
