"""The placement grammar: parse, format and resolve placement strings (pure, no torch).

Grammar (decisions.md, item 3), whitespace not allowed::

    R            Replicate
    S(n)         Shard on tensor dim n; negative n counts from the end (S(-1) = last dim)
    SS(d,f)      StridedShard on dim d with split factor f >= 1
    P(op)        Partial with op in sum avg min max product band bor bxor

Integers are canonical (no leading zeros, no ``-0``) and bounded: a dim ``n``/``d`` within
-99..99, a split factor ``f`` within 1..9999. The whole string must match: nothing before
or after, not even a newline (the regex is applied with ``fullmatch``; the schema's
``$`` means end of string, as in ECMA-262). ``str(parse_placement(s)) == s`` for every
valid ``s``. A *named* placement is a mapping
``{axis: placement}``; it resolves over an ordered tuple of mesh axes, a missing axis
reading as ``R`` and a key for an axis the mesh lacks being dropped.

Note: the reference system reads a negative ``S(n)`` as an *uneven* shard of dim ``-n-1``.
torch shards unevenly by itself, so hpcodegen keeps torch's meaning (a dim from the end).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Union

REDUCE_OPS: tuple[str, ...] = ("sum", "avg", "min", "max", "product", "band", "bor", "bxor")

#: A tensor dim in a placement (-99..99, canonical) and a split factor (1..9999).
DIM_PATTERN = r"(0|-?[1-9][0-9]?)"
FACTOR_PATTERN = r"[1-9][0-9]{0,3}"
#: The grammar as one regular expression; the JSON schema uses the same text.
PLACEMENT_PATTERN = (
    rf"^(R|S\({DIM_PATTERN}\)|SS\({DIM_PATTERN},{FACTOR_PATTERN}\)|P\(("
    + "|".join(REDUCE_OPS) + r")\))$"
)
_TOKEN = re.compile(r"(?P<kind>SS|S|P)\((?P<args>[^()]*)\)")
_DIM = re.compile(DIM_PATTERN)
_FACTOR = re.compile(FACTOR_PATTERN)


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


def _show(text: str) -> str:
    """``repr`` of at most 40 characters (a placement string may be anything)."""
    return repr(text) if len(text) <= 40 else repr(text[:37]) + "..."


_DIM_WORDS = "a dim (an integer -99..99 without leading zeros)"


class PlacementSyntaxError(ValueError):
    """A placement string outside the grammar; the message says what was expected."""


def _int_arg(text: str, whole: str, rule: re.Pattern[str], what: str) -> int:
    if not rule.fullmatch(text):
        raise PlacementSyntaxError(f"placement {_show(whole)}: {_show(text)} is not {what}")
    return int(text)


#: Parsed placements by their text: a plan repeats a handful of strings tens of thousands
#: of times, and every reader (the checks, the codec, the classifier) parses them; the
#: values are immutable, so each string is parsed once. Bounded; errors are not kept.
_PARSED: dict[str, Placement] = {}
_PARSED_LIMIT = 4096


def parse_placement(text: object) -> Placement:
    """Parse one placement string (memoized: :data:`_PARSED`).

    Args:
        text: e.g. ``"S(0)"``; anything else than a ``str`` is an error.

    Returns:
        The placement object; ``str()`` of it gives ``text`` back.

    Example::

        >>> parse_placement("SS(0,2)")
        StridedShard(dim=0, split_factor=2)
    """
    if type(text) is str:
        hit = _PARSED.get(text)
        if hit is not None:
            return hit
    if not isinstance(text, str):
        raise PlacementSyntaxError(f"placement must be a string, got {type(text).__name__}")
    value = _parse(text)
    if type(text) is str:
        if len(_PARSED) >= _PARSED_LIMIT:
            _PARSED.clear()
        _PARSED[text] = value
    return value


def _parse(text: str) -> Placement:
    if text == "R":
        return REPLICATE
    match = _TOKEN.fullmatch(text)
    if match is None:
        raise PlacementSyntaxError(
            f"placement {_show(text)} is not one of R, S(n), SS(d,f), P(op)"
        )
    kind, args = match["kind"], match["args"]
    if kind == "S":
        return Shard(_int_arg(args, text, _DIM, _DIM_WORDS))
    if kind == "SS":
        parts = args.split(",")
        if len(parts) != 2:
            raise PlacementSyntaxError(f"placement {_show(text)}: SS takes exactly two "
                                       "integers d,f")
        return StridedShard(_int_arg(parts[0], text, _DIM, _DIM_WORDS),
                            _int_arg(parts[1], text, _FACTOR, "a split factor (1..9999)"))
    if args not in REDUCE_OPS:
        raise PlacementSyntaxError(
            f"placement {_show(text)}: reduce op must be one of {', '.join(REDUCE_OPS)}"
        )
    return Partial(args)


def is_shard(p: Placement) -> bool:
    """Shard or StridedShard: the tensor is split along a dim."""
    return isinstance(p, (Shard, StridedShard))


def shard_dim(p: Placement) -> int | None:
    """The tensor dim a (strided) shard splits, else None."""
    return p.dim if isinstance(p, (Shard, StridedShard)) else None


def with_dims_mod(p: Placement, ndim: int) -> Placement:
    """``p`` with a negative shard dim read from the end of an ``ndim``-dim tensor, so
    ``S(-1)`` and ``S(1)`` of a 2-dim tensor compare equal."""
    if isinstance(p, StridedShard):
        return StridedShard(p.dim % ndim, p.split_factor)
    if isinstance(p, Shard):
        return Shard(p.dim % ndim)
    return p


def from_torch(p: Any) -> Placement:
    """A ``torch.distributed.tensor`` placement as an hpcodegen placement.

    Read by what the object answers (a strided shard carries ``split_factor``;
    ``is_shard``/``is_partial`` otherwise), not by importing torch: the codec stays in the
    pure core while the runtime and the derivation hand it torch's objects. Any ``Partial``
    kind (the embedding's masked one included) is ``P(op)``."""
    if getattr(p, "split_factor", None) is not None:
        return StridedShard(p.dim, p.split_factor)
    if p.is_shard():
        return Shard(p.dim)
    if p.is_partial():
        return Partial(p.reduce_op)
    return REPLICATE


NamedPlacement = Mapping[str, str]


def parse_named(named: Mapping[str, object]) -> dict[str, Placement]:
    """Parse every leaf of ``{axis: placement string}``; raises PlacementSyntaxError."""
    return {axis: parse_placement(text) for axis, text in named.items()}


def resolve_placements(
    named: Mapping[str, object] | None, axes: Sequence[str]
) -> tuple[Placement, ...]:
    """Resolve a named placement over ordered mesh axes (decisions.md, item 4).

    A missing axis is ``R``; keys for axes not in ``axes`` are dropped. The leaves are
    placement strings (a meta's) or placements already parsed (a typed plan's).

    Example::

        >>> resolve_placements({"tp": "S(0)", "ep": "S(0)"}, ("cp", "tp"))
        (Replicate(), Shard(dim=0))
    """
    named = named or {}
    return tuple(_placement_of(named[axis]) if axis in named else REPLICATE for axis in axes)


def _placement_of(value: object) -> Placement:
    if isinstance(value, (Replicate, Shard, StridedShard, Partial)):
        return value
    return parse_placement(value)


def format_placements(placements: Sequence[Placement]) -> str:
    """``(S(0), R)`` style, for messages."""
    return "(" + ", ".join(str(p) for p in placements) + ")"
