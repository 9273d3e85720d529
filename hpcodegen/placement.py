"""The placement grammar: parse, format and resolve placement strings (pure, no torch).

Grammar (decisions.md, item 3), whitespace not allowed::

    R            Replicate
    S(n)         Shard on tensor dim n; negative n counts from the end (S(-1) = last dim)
    SS(d,f)      StridedShard on dim d with split factor f >= 1
    P(op)        Partial with op in sum avg min max product band bor bxor

``str(parse_placement(s)) == s`` for every valid ``s``. A *named* placement is a mapping
``{axis: placement}``; it resolves over an ordered tuple of mesh axes, a missing axis
reading as ``R`` and a key for an axis the mesh lacks being dropped.

Note: the reference system reads a negative ``S(n)`` as an *uneven* shard of dim ``-n-1``.
torch shards unevenly by itself, so hpcodegen keeps torch's meaning (a dim from the end).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Union

REDUCE_OPS: tuple[str, ...] = ("sum", "avg", "min", "max", "product", "band", "bor", "bxor")

#: The grammar as one regular expression; the JSON schema uses the same text.
PLACEMENT_PATTERN = (
    r"^(R|S\(-?[0-9]+\)|SS\(-?[0-9]+,[1-9][0-9]*\)|P\((" + "|".join(REDUCE_OPS) + r")\))$"
)
_TOKEN = re.compile(r"^(?P<kind>SS|S|P)\((?P<args>[^()]*)\)$")
_INT = re.compile(r"^-?[0-9]+$")


@dataclass(frozen=True, slots=True)
class Replicate:
    """Every rank holds the whole tensor."""

    def __str__(self) -> str:
        return "R"


@dataclass(frozen=True, slots=True)
class Shard:
    """Each rank holds one chunk along tensor dim ``dim`` (negative: from the end)."""

    dim: int

    def __str__(self) -> str:
        return f"S({self.dim})"


@dataclass(frozen=True, slots=True)
class StridedShard:
    """A shard of dim ``dim`` taken in ``split_factor`` interleaved strides (FSDP2 + TP)."""

    dim: int
    split_factor: int

    def __str__(self) -> str:
        return f"SS({self.dim},{self.split_factor})"


@dataclass(frozen=True, slots=True)
class Partial:
    """Each rank holds a partial value; the full value is the ``reduce_op`` over ranks."""

    reduce_op: str = "sum"

    def __str__(self) -> str:
        return f"P({self.reduce_op})"


Placement = Union[Replicate, Shard, StridedShard, Partial]
REPLICATE = Replicate()


class PlacementSyntaxError(ValueError):
    """A placement string outside the grammar; the message says what was expected."""


def _int_arg(text: str, whole: str) -> int:
    if not _INT.match(text):
        raise PlacementSyntaxError(f"placement {whole!r}: {text!r} is not an integer")
    return int(text)


def parse_placement(text: object) -> Placement:
    """Parse one placement string.

    Args:
        text: e.g. ``"S(0)"``; anything else than a ``str`` is an error.

    Returns:
        The placement object; ``str()`` of it gives ``text`` back.

    Example::

        >>> parse_placement("SS(0,2)")
        StridedShard(dim=0, split_factor=2)
    """
    if not isinstance(text, str):
        raise PlacementSyntaxError(f"placement must be a string, got {type(text).__name__}")
    if text == "R":
        return REPLICATE
    match = _TOKEN.match(text)
    if match is None:
        raise PlacementSyntaxError(
            f"placement {text!r} is not one of R, S(n), SS(d,f), P(op)"
        )
    kind, args = match["kind"], match["args"]
    if kind == "S":
        return Shard(_int_arg(args, text))
    if kind == "SS":
        parts = args.split(",")
        if len(parts) != 2:
            raise PlacementSyntaxError(f"placement {text!r}: SS takes exactly two integers d,f")
        dim, factor = (_int_arg(p, text) for p in parts)
        if factor < 1:
            raise PlacementSyntaxError(f"placement {text!r}: split factor must be >= 1")
        return StridedShard(dim, factor)
    if args not in REDUCE_OPS:
        raise PlacementSyntaxError(
            f"placement {text!r}: reduce op must be one of {', '.join(REDUCE_OPS)}"
        )
    return Partial(args)


def is_shard(p: Placement) -> bool:
    """Shard or StridedShard: the tensor is split along a dim."""
    return isinstance(p, (Shard, StridedShard))


def shard_dim(p: Placement) -> int | None:
    """The tensor dim a (strided) shard splits, else None."""
    return p.dim if isinstance(p, (Shard, StridedShard)) else None


NamedPlacement = Mapping[str, str]


def parse_named(named: Mapping[str, object]) -> dict[str, Placement]:
    """Parse every leaf of ``{axis: placement string}``; raises PlacementSyntaxError."""
    return {axis: parse_placement(text) for axis, text in named.items()}


def resolve_placements(
    named: Mapping[str, object] | None, axes: Sequence[str]
) -> tuple[Placement, ...]:
    """Resolve a named placement over ordered mesh axes (decisions.md, item 4).

    A missing axis is ``R``; keys for axes not in ``axes`` are dropped.

    Example::

        >>> resolve_placements({"tp": "S(0)", "ep": "S(0)"}, ("cp", "tp"))
        (Replicate(), Shard(dim=0))
    """
    named = named or {}
    return tuple(
        parse_placement(named[axis]) if axis in named else REPLICATE for axis in axes
    )


def format_placements(placements: Sequence[Placement]) -> str:
    """``(S(0), R)`` style, for messages."""
    return "(" + ", ".join(str(p) for p in placements) + ")"
