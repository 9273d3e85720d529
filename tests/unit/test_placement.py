"""The placement grammar: round trip, rejects, resolution over mesh axes."""

from __future__ import annotations

import pytest

from hpcodegen.placement import (
    PLACEMENT_PATTERN,
    REDUCE_OPS,
    Partial,
    PlacementSyntaxError,
    Replicate,
    Shard,
    StridedShard,
    format_placements,
    is_shard,
    parse_named,
    parse_placement,
    resolve_placements,
    shard_dim,
)

VALID = ["R", "S(0)", "S(1)", "S(-1)", "S(-2)", "S(12)", "SS(0,2)", "SS(1,4)", "SS(-1,3)",
         *[f"P({op})" for op in REDUCE_OPS]]


@pytest.mark.parametrize("text", VALID)
def test_round_trip(text: str) -> None:
    assert str(parse_placement(text)) == text


@pytest.mark.parametrize("text", VALID)
def test_schema_pattern_accepts_what_the_parser_accepts(text: str) -> None:
    import re

    assert re.fullmatch(PLACEMENT_PATTERN[1:-1], text)


@pytest.mark.parametrize("text", [
    "", "r", "Shard(0)", "S(x)", "S()", "S(0", "S(0,1)", "SS(0)", "SS(0,0)", "SS(0,-1)",
    "SS(a,2)", "P()", "P", "P(mean)", "P(SUM)", " R", "S( 1)", "SS(0, 2)", "_S(0,2)", "S(1.5)",
    # the whole string, canonical and bounded integers
    "S(1)\n", "R\n", "P(sum)\n", "S(01)", "S(-0)", "S(100)", "S(-100)", "SS(0,10000)",
    "SS(00,2)", "S(" + "9" * 5000 + ")", "S(\u0661)",
])
def test_rejects(text: str) -> None:
    with pytest.raises(PlacementSyntaxError):
        parse_placement(text)


@pytest.mark.parametrize("value", [None, 0, 1.0, ["R"], {"tp": "R"}])
def test_rejects_non_strings(value: object) -> None:
    with pytest.raises(PlacementSyntaxError, match="must be a string"):
        parse_placement(value)


def test_rejects_say_what_was_expected() -> None:
    with pytest.raises(PlacementSyntaxError, match="reduce op must be one of sum"):
        parse_placement("P(mean)")
    with pytest.raises(PlacementSyntaxError, match=r"not a split factor \(1\.\.9999\)"):
        parse_placement("SS(0,0)")


def test_objects() -> None:
    assert parse_placement("R") == Replicate()
    assert parse_placement("S(-1)") == Shard(-1)
    assert parse_placement("SS(1,2)") == StridedShard(1, 2)
    assert parse_placement("P(avg)") == Partial("avg")
    assert parse_placement("S(0)") != parse_placement("S(-1)")
    assert is_shard(StridedShard(1, 2)) and is_shard(Shard(0))
    assert not is_shard(Replicate()) and not is_shard(Partial())
    assert shard_dim(StridedShard(3, 2)) == 3 and shard_dim(Partial()) is None
    assert hash(parse_placement("S(1)")) == hash(Shard(1))


def test_resolve_missing_axis_is_replicate_and_foreign_keys_drop() -> None:
    named = {"tp": "S(0)", "ep": "S(0)"}
    assert resolve_placements(named, ("cp", "tp")) == (Replicate(), Shard(0))
    assert resolve_placements(named, ("tp", "ep")) == (Shard(0), Shard(0))
    assert resolve_placements(named, ()) == ()
    assert resolve_placements(None, ("tp",)) == (Replicate(),)
    assert resolve_placements({}, ("cp", "tp")) == (Replicate(), Replicate())


def test_resolve_follows_axis_order() -> None:
    named = {"cp": "S(1)", "tp": "P(sum)"}
    assert resolve_placements(named, ("tp", "cp")) == (Partial("sum"), Shard(1))
    assert resolve_placements(named, ("cp", "tp")) == (Shard(1), Partial("sum"))


def test_resolve_rejects_bad_leaf() -> None:
    with pytest.raises(PlacementSyntaxError):
        resolve_placements({"tp": "Shard(0)"}, ("tp",))


def test_parse_named_and_format() -> None:
    parsed = parse_named({"cp": "S(1)", "tp": "R"})
    assert parsed == {"cp": Shard(1), "tp": Replicate()}
    assert format_placements((Shard(1), Replicate(), Partial("sum"))) == "(S(1), R, P(sum))"


def test_from_torch_inverts_to_torch_placements() -> None:
    """torch's placement objects read back through the codec: every kind of the grammar
    round-trips, and torch's masked partial (the vocab-parallel embedding) reads as P(sum)."""
    from torch.distributed.tensor._ops._embedding_ops import _MaskPartial

    from hpcodegen.placement import from_torch
    from hpcodegen.runtime.mesh import to_torch_placements

    ours = (Replicate(), Shard(1), StridedShard(0, 4), Partial("sum"), Partial("avg"))
    assert tuple(from_torch(p) for p in to_torch_placements(ours)) == ours
    assert from_torch(_MaskPartial()) == Partial("sum")


def test_with_dims_mod_reads_negative_dims_from_the_end() -> None:
    from hpcodegen.placement import with_dims_mod

    assert with_dims_mod(Shard(-1), 3) == Shard(2)
    assert with_dims_mod(StridedShard(-2, 2), 3) == StridedShard(1, 2)
    assert with_dims_mod(Partial(), 3) == Partial()
