"""Bytes per rank per collective: ring factors, sharding on other axes, multi-step walks."""

from __future__ import annotations

import pytest

from hpcodegen.errors import EXIT_USAGE, UsageError
from hpcodegen.placement import parse_placement
from hpcodegen.plan.classify import Step, classify_boundary
from hpcodegen.plan.codec import entry_from_json
from hpcodegen.plan.volume import (
    dtype_bytes,
    ring_factor,
    seconds,
    step_bytes,
    transition_volume,
    walk_bytes,
)


def p(*texts: str) -> tuple:
    return tuple(parse_placement(t) for t in texts)


@pytest.mark.parametrize(("kind", "n", "expected"), [
    ("all_gather", 2, 0.5), ("all_gather", 4, 0.75), ("reduce_scatter", 8, 0.875),
    ("all_reduce", 2, 1.0), ("all_reduce", 4, 1.5), ("all_to_all", 4, 0.75),
    ("all_gather", 1, 0.0), ("chunk", 4, 0.0),
])
def test_ring_factor(kind: str, n: int, expected: float) -> None:
    assert ring_factor(kind, n) == pytest.approx(expected)


def test_step_bytes_one_axis() -> None:
    axes, sizes = ("tp",), {"tp": 4}
    assert step_bytes(Step("tp", "all_gather", 1), p("S(1)"), axes, sizes, 1024) == 768
    assert step_bytes(Step("tp", "reduce_scatter", 1, "sum"), p("P(sum)"), axes, sizes,
                      1024) == 768
    assert step_bytes(Step("tp", "all_reduce", None, "sum"), p("P(sum)"), axes, sizes,
                      1024) == 1536
    # all_to_all: each rank sends (n-1)/n of its local shard (full/n)
    assert step_bytes(Step("tp", "all_to_all", 0), p("S(1)"), axes, sizes, 1024) == 192
    assert step_bytes(Step("tp", "chunk", 1), p("R"), axes, sizes, 1024) == 0


def test_other_axis_sharding_shrinks_the_group_tensor_partial_does_not() -> None:
    axes, sizes = ("cp", "tp"), {"cp": 2, "tp": 4}
    ag = Step("tp", "all_gather", 1)
    assert step_bytes(ag, p("S(1)", "S(1)"), axes, sizes, 1024) == 384
    assert step_bytes(ag, p("P(sum)", "S(1)"), axes, sizes, 1024) == 768
    assert step_bytes(ag, p("R", "SS(1,2)"), axes, sizes, 1024) == 768


def test_walk_updates_placements_step_by_step() -> None:
    axes, sizes = ("cp", "tp"), {"cp": 2, "tp": 2}
    steps = (Step("cp", "all_gather", 1), Step("tp", "all_gather", 1))
    got = walk_bytes(steps, p("S(1)", "S(1)"), p("R", "R"), axes, sizes, 4096)
    # cp first: its group holds full/2 (tp still shards it); then tp on the full tensor
    assert got == [1024, 2048]


ATTN_SP = entry_from_json("a", {
    "params": {"q_proj.weight": {"tp": "S(0)"}},
    "in_src": {"hidden_states": {"tp": "S(1)"}}, "in_dst": {"hidden_states": {"tp": "R"}},
    "out_src": {"output": {"tp": "P(sum)"}}, "out_dst": {"output": {"tp": "S(1)"}}})


def test_transition_volume_forward_and_backward() -> None:
    bf = classify_boundary("a", ATTN_SP, ("tp",))
    info = ((2, 16, 64), None)  # floating: takes the --dtype size
    full = 2 * 16 * 64 * 2      # bf16
    ops = [o for t in bf.transitions
           for o in transition_volume(t, ATTN_SP, ("tp",), {"tp": 2}, info, 2)]
    assert [(o.direction, o.side, o.kind, o.bytes) for o in ops] == [
        ("forward", "in", "all_gather", full / 2), ("backward", "in", "reduce_scatter", full / 2),
        ("forward", "out", "reduce_scatter", full / 2), ("backward", "out", "all_gather", full / 2),
    ]
    assert ops[0].shape == (2, 16, 64)


def test_integer_tensors_and_no_backward() -> None:
    e = entry_from_json("emb", {"params": {"weight": {"tp": "S(0)"}},
                                "in_src": {"input": {"tp": "R"}},
                                "in_dst": {"input": {"tp": "R"}}})
    t = classify_boundary("emb", e, ("tp",)).inputs[0]
    assert [o.kind for o in transition_volume(t, e, ("tp",), {"tp": 2}, ((2, 16), None), 2)] \
        == ["all_reduce"]
    assert transition_volume(t, e, ("tp",), {"tp": 2}, ((2, 16), 8), 2) == []
    assert transition_volume(t, e, ("tp",), {"tp": 2}, ((2, 16), None), 2, backward=False) == []


def test_unknown_shape_gives_unknown_bytes() -> None:
    t = classify_boundary("a", ATTN_SP, ("tp",)).inputs[0]
    ops = transition_volume(t, ATTN_SP, ("tp",), {"tp": 2}, None, 2)
    assert [o.bytes for o in ops] == [None, None]


def test_dtype_and_seconds() -> None:
    assert dtype_bytes("bf16") == 2 and dtype_bytes("FP32") == 4 and dtype_bytes("fp8") == 1
    with pytest.raises(UsageError) as info:
        dtype_bytes("int3")
    assert info.value.exit_code == EXIT_USAGE
    assert seconds(1e9, 8) == pytest.approx(1.0)
    assert seconds(1e9, None) is None


def test_uneven_reduce_scatter_runs_as_all_reduce() -> None:
    t = classify_boundary("a", ATTN_SP, ("tp",)).outputs[0]
    even = transition_volume(t, ATTN_SP, ("tp",), {"tp": 2}, ((1, 16, 8), None), 2)
    odd = transition_volume(t, ATTN_SP, ("tp",), {"tp": 2}, ((1, 15, 8), None), 2)
    assert [o.kind for o in even] == ["reduce_scatter", "all_gather"]
    assert odd[0].kind == "all_reduce" and "does not divide by 2" in odd[0].detail
    assert odd[0].bytes == pytest.approx(2 * 15 * 8 * 2 / 2)  # 2(n-1)/n of the full tensor
