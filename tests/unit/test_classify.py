"""The classifier: transition table over placement pairs on one and two axes, forms, notes.

Expected values follow decisions.md ("Forms") and the reference classifier (artifact-system.md
section 6): tp_collective ops are S->R all_gather(src dim), P(sum)->R all_reduce,
P(sum)->S reduce_scatter(dst dim) on tp with every other axis unchanged; the rest is generic
with DTensor's redistribute steps.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcodegen.placement import parse_placement, resolve_placements
from hpcodegen.plan.classify import (
    TPOp,
    classify_boundary,
    classify_plan,
    classify_transition,
    grad_steps,
    redistribute_steps,
)
from hpcodegen.plan.codec import (
    PlanFormatError,
    entry_from_json,
    injection_from_json,
    plan_from_meta,
)
from hpcodegen.plan.types import PlanEntry

PLACEMENTS = ["R", "S(0)", "S(1)", "S(-1)", "SS(1,2)", "P(sum)", "P(avg)"]
ID = TPOp("identity")
AG = {d: TPOp("all_gather", dim=d) for d in (0, 1, -1)}
RS = {d: TPOp("reduce_scatter", dim=d, reduce_op="sum") for d in (0, 1, -1)}
AR = TPOp("all_reduce", reduce_op="sum")
N = None  # not one tp collective: generic

# rows: src, columns: dst, both in PLACEMENTS order
TP_TABLE = {
    "R":       [ID, N, N, N, N, N, N],
    "S(0)":    [AG[0], ID, N, N, N, N, N],
    "S(1)":    [AG[1], N, ID, N, N, N, N],
    "S(-1)":   [AG[-1], N, N, ID, N, N, N],
    "SS(1,2)": [AG[1], N, N, N, ID, N, N],
    "P(sum)":  [AR, RS[0], RS[1], RS[-1], RS[1], ID, N],
    "P(avg)":  [N, N, N, N, N, N, ID],
}

# DTensor's per-axis step for src -> dst on one axis: (kind, dim, reduce_op) or None
STEP_TABLE = {
    "R":       [None, ("chunk", 0, None), ("chunk", 1, None), ("chunk", -1, None),
                ("chunk", 1, None), ("invalid", None, None), ("invalid", None, None)],
    "S(0)":    [("all_gather", 0, None), None, ("all_to_all", 1, None), ("all_to_all", -1, None),
                ("all_to_all", 1, None), ("invalid", None, None), ("invalid", None, None)],
    "S(1)":    [("all_gather", 1, None), ("all_to_all", 0, None), None, ("all_to_all", -1, None),
                ("all_to_all", 1, None), ("invalid", None, None), ("invalid", None, None)],
    "S(-1)":   [("all_gather", -1, None), ("all_to_all", 0, None), ("all_to_all", 1, None), None,
                ("all_to_all", 1, None), ("invalid", None, None), ("invalid", None, None)],
    "SS(1,2)": [("all_gather", 1, None), ("all_to_all", 0, None), ("all_to_all", 1, None),
                ("all_to_all", -1, None), None, ("invalid", None, None), ("invalid", None, None)],
    "P(sum)":  [("all_reduce", None, "sum"), ("reduce_scatter", 0, "sum"),
                ("reduce_scatter", 1, "sum"), ("reduce_scatter", -1, "sum"),
                ("reduce_scatter", 1, "sum"), None, ("invalid", None, None)],
    "P(avg)":  [("all_reduce", None, "avg"), ("reduce_scatter", 0, "avg"),
                ("reduce_scatter", 1, "avg"), ("reduce_scatter", -1, "avg"),
                ("reduce_scatter", 1, "avg"), ("invalid", None, None), None],
}

PAIRS = [(s, d) for s in PLACEMENTS for d in PLACEMENTS]


def p(*texts: str) -> tuple[Any, ...]:
    return tuple(parse_placement(t) for t in texts)


@pytest.mark.parametrize(("src", "dst"), PAIRS)
def test_tp_table_one_axis(src: str, dst: str) -> None:
    expected = TP_TABLE[src][PLACEMENTS.index(dst)]
    assert classify_transition(p(src), p(dst), ("tp",)) == expected


@pytest.mark.parametrize(("src", "dst"), PAIRS)
def test_step_table_one_axis(src: str, dst: str) -> None:
    expected = STEP_TABLE[src][PLACEMENTS.index(dst)]
    steps = redistribute_steps(p(src), p(dst), ("tp",))
    if expected is None:
        assert steps == ()
    else:
        assert [(s.axis, s.kind, s.dim, s.reduce_op) for s in steps] == [("tp", *expected)]


@pytest.mark.parametrize(("src", "dst"), PAIRS)
@pytest.mark.parametrize("other", ["R", "S(1)", "P(sum)"])
@pytest.mark.parametrize("axes", [("cp", "tp"), ("tp", "cp"), ("tp", "ep")])
def test_tp_table_two_axes_other_axis_unchanged(src: str, dst: str, other: str,
                                                axes: tuple[str, str]) -> None:
    """A fixed placement on the second axis changes nothing: the tp table still holds."""
    expected = TP_TABLE[src][PLACEMENTS.index(dst)]
    named_src = {"tp": src, axes[1 - axes.index("tp")]: other}
    named_dst = {"tp": dst, axes[1 - axes.index("tp")]: other}
    got = classify_transition(resolve_placements(named_src, axes),
                              resolve_placements(named_dst, axes), axes)
    assert got == expected


@pytest.mark.parametrize(("src", "dst"), [(s, d) for s in PLACEMENTS for d in PLACEMENTS if s != d])
@pytest.mark.parametrize("axis", ["cp", "ep"])
def test_any_change_on_another_axis_is_generic(src: str, dst: str, axis: str) -> None:
    axes = (axis, "tp")
    for tp_src, tp_dst in (("R", "R"), ("S(1)", "R"), ("P(sum)", "S(1)")):
        got = classify_transition(resolve_placements({axis: src, "tp": tp_src}, axes),
                                  resolve_placements({axis: dst, "tp": tp_dst}, axes), axes)
        assert got is None


@pytest.mark.parametrize(("src", "dst"), [(s, d) for s in PLACEMENTS for d in PLACEMENTS])
def test_no_tp_axis(src: str, dst: str) -> None:
    got = classify_transition(p(src), p(dst), ("cp",))
    assert got == (ID if src == dst else None)


def test_empty_axes_are_identity() -> None:
    assert classify_transition((), (), ()) == ID
    assert redistribute_steps((), (), ()) == ()


def test_two_axis_steps_walk_every_changed_axis() -> None:
    axes = ("cp", "tp")
    steps = redistribute_steps(p("S(1)", "S(1)"), p("R", "R"), axes)
    assert [(s.axis, s.kind, s.dim) for s in steps] == [("cp", "all_gather", 1),
                                                        ("tp", "all_gather", 1)]
    steps = redistribute_steps(p("R", "P(sum)"), p("S(1)", "S(1)"), axes)
    assert [(s.axis, s.kind, s.dim) for s in steps] == [("cp", "chunk", 1),
                                                        ("tp", "reduce_scatter", 1)]


# --- grad steps: the backward of each transition -------------------------------------------

@pytest.mark.parametrize(("side", "src", "dst", "split", "expected"), [
    ("in", "S(1)", "R", True, [("reduce_scatter", 1)]),   # Megatron g: AG fwd, RS bwd
    ("in", "S(1)", "R", False, [("chunk", 1)]),           # DTensor: replicated grad, local chunk
    ("in", "R", "R", True, [("all_reduce", None)]),       # Megatron f: identity fwd, AR bwd
    ("in", "R", "R", False, []),
    ("in", "S(1)", "S(1)", True, []),                     # SP norm input: nothing
    ("out", "P(sum)", "S(1)", True, [("all_gather", 1)]),
    ("out", "P(sum)", "R", True, []),
    ("out", "S(-1)", "R", False, [("chunk", -1)]),
    ("out", "S(-1)", "S(-1)", True, []),
])
def test_grad_steps(side: str, src: str, dst: str, split: bool,
                    expected: list[tuple[str, int | None]]) -> None:
    steps = grad_steps(side, p(src), p(dst), ("tp",), split)  # type: ignore[arg-type]
    assert [(s.kind, s.dim) for s in steps] == expected


def test_grad_steps_only_tp_becomes_partial() -> None:
    axes = ("cp", "tp")
    steps = grad_steps("in", p("S(1)", "S(1)"), p("S(1)", "R"), axes, True)
    assert [(s.axis, s.kind, s.dim) for s in steps] == [("tp", "reduce_scatter", 1)]


# --- boundary forms ---------------------------------------------------------------------------

def typed(e: dict[str, Any]) -> PlanEntry:
    return entry_from_json("m", e)


def classify(fqn: str, e: dict[str, Any], axes: Any, injection: Any = None,
             **kw: Any) -> Any:
    """:func:`classify_boundary` on the typed entry and injection of these JSON shapes."""
    record = None if injection is None else injection_from_json({"match": fqn, **injection})
    return classify_boundary(fqn, typed(e), axes, record, **kw)


def entry(in_src: Any = None, in_dst: Any = None, out_src: Any = None, out_dst: Any = None,
          **extra: Any) -> dict[str, Any]:
    e: dict[str, Any] = dict(extra)
    for key, value in (("in_src", in_src), ("in_dst", in_dst), ("out_src", out_src),
                       ("out_dst", out_dst)):
        if value is not None:
            e[key] = value
    return e


ATTN_SP = entry({"hidden_states": {"tp": "S(1)"}}, {"hidden_states": {"tp": "R"}},
                {"output": {"tp": "P(sum)"}}, {"output": {"tp": "S(1)"}},
                params={"q_proj.weight": {"tp": "S(0)"}})


def test_attention_sp_is_tp_collective_with_notes() -> None:
    bf = classify("model.layers.0.self_attn", ATTN_SP, ("tp",))
    assert bf.form == "tp_collective"
    assert bf.in_ops == (("hidden_states", AG[1]),)
    assert bf.out_ops == (("output", RS[1]),)
    assert [t.note for t in bf.transitions] == [
        "hidden_states: tp S(1) -> R ==> all_gather(dim=1)",
        "output: tp P(sum) -> S(1) ==> reduce_scatter(dim=1)",
    ]
    assert [s.kind for t in bf.inputs for s in t.grad_steps] == ["reduce_scatter"]
    assert [s.kind for t in bf.outputs for s in t.grad_steps] == ["all_gather"]


def test_identity_inputs_are_kept_identity_outputs_dropped() -> None:
    e = entry({"x": {"tp": "R"}}, {"x": {"tp": "R"}},
              {"output": {"tp": "P(sum)"}, "extra": {"tp": "R"}},
              {"output": {"tp": "R"}, "extra": {"tp": "R"}})
    bf = classify("m", e, ("tp",))
    assert bf.form == "tp_collective"
    assert bf.in_ops == (("x", ID),)
    assert bf.out_ops == (("output", AR),)


def test_norm_is_identity_and_params_only_entry() -> None:
    seq = {"hidden_states": {"tp": "S(1)"}}
    bf = classify("n", entry(seq, seq, {"output": {"tp": "S(1)"}},
                                      {"output": {"tp": "S(1)"}}), ("tp",))
    assert bf.form == "identity" and bf.reasons == ()
    assert classify("p", {"params": {"w": {"tp": "S(0)"}}}, ("tp",)).form == "params"
    assert classify("p", {"is_boundary": False, **ATTN_SP}, ("tp",)).form == "params"


def test_p_avg_and_cp_change_are_generic_with_reasons() -> None:
    e = entry(out_src={"output": {"tp": "P(avg)"}}, out_dst={"output": {"tp": "R"}})
    bf = classify("m", e, ("tp",))
    assert bf.form == "generic"
    assert bf.reasons == ("output 'output' is not one tp collective",)
    assert bf.outputs[0].note == "output: tp P(avg) -> R ==> dtensor redistribute"
    cp = entry({"x": {"cp": "S(1)", "tp": "S(1)"}}, {"x": {"cp": "R", "tp": "R"}})
    bf = classify("m", cp, ("cp", "tp"))
    assert bf.form == "generic"
    assert bf.inputs[0].note == "x: cp S(1) -> R, tp S(1) -> R ==> dtensor redistribute"
    assert [(s.axis, s.kind) for s in bf.inputs[0].steps] == [("cp", "all_gather"),
                                                              ("tp", "all_gather")]


def test_ep_change() -> None:
    e = entry({"x": {"ep": "S(0)"}}, {"x": {"ep": "R"}})
    assert classify("m", e, ()).form == "generic"
    assert classify("m", e, None).reasons == ("ep placement changes",)
    assert classify("m", e, ("tp", "ep")).form == "generic"
    # a dense mesh drops the ep key: nothing changes on its axes
    assert classify("m", e, ("cp", "tp")).form == "identity"
    same = entry({"x": {"ep": "R"}}, {"x": {"ep": "R"}})
    assert classify("m", same, ()).form == "identity"


def test_empty_axes() -> None:
    assert classify("m", ATTN_SP, ()).form == "identity"
    assert classify("m", ATTN_SP, (), {"inner_wrapper": "sdpa_hf"}).form == "generic"


def test_injections_force_region_and_generic() -> None:
    region = classify("m", ATTN_SP, ("tp",), {"local_compute_fn": {"_target_": "a.b"}})
    assert region.form == "region" and region.reasons == ("local_compute_fn injection",)
    generic = classify("m", ATTN_SP, ("tp",), {"inner_wrapper": {"_target_": "a.b"}})
    assert generic.form == "generic" and generic.reasons == ("inner_wrapper injection",)
    assert generic.in_ops == (("hidden_states", AG[1]),)


def test_size_one_axis_behaves_as_identity() -> None:
    assert classify("m", ATTN_SP, ("tp",), sizes={"tp": 1}).form == "identity"
    bf = classify("m", ATTN_SP, ("tp",), sizes={"tp": 1})
    assert all(t.grad_steps == () for t in bf.transitions)
    cp = entry({"x": {"cp": "S(1)", "tp": "S(1)"}}, {"x": {"cp": "R", "tp": "R"}})
    bf = classify("m", cp, ("cp", "tp"), sizes={"cp": 1, "tp": 4})
    assert bf.form == "tp_collective" and bf.in_ops == (("x", AG[1]),)


def test_splits_compute() -> None:
    assert typed(ATTN_SP).splits_compute()
    assert typed(entry(out_src={"o": {"tp": "P(sum)"}})).splits_compute()
    assert not typed({"params": {"weight": {"tp": "R"}}}).splits_compute()
    with pytest.raises(PlanFormatError):  # no typed plan holds a placement outside the grammar
        typed({"params": {"weight": {"tp": "garbage"}}})


def test_out_names_and_bad_placement() -> None:
    bf = classify("m", {**ATTN_SP, "out_names": ["output", "attn_weights"]}, ("tp",))
    assert bf.out_names == ("output", "attn_weights")
    with pytest.raises(ValueError):
        classify("m", entry({"x": {"tp": "Shard(1)"}}, {"x": {"tp": "R"}}), ("tp",))


def test_classify_plan_uses_frozen_axes_injection_lists_and_keeps_fqns() -> None:
    meta = {
        "mesh_dim_names": ["cp", "tp"],
        "param_plan": {f"model.layers.{i}.self_attn": ATTN_SP for i in range(3)}
        | {"model.layers.0.mlp": {"is_boundary": False}},
        "injections": [{"match": ["model.layers.1.self_attn", "model.layers.2.self_attn"],
                        "inner_wrapper": {"_target_": "x.y"}}],
    }
    forms = classify_plan(plan_from_meta(meta))
    assert {f: bf.form for f, bf in forms.items()} == {
        "model.layers.0.self_attn": "tp_collective",
        "model.layers.1.self_attn": "generic",
        "model.layers.2.self_attn": "generic",
        "model.layers.0.mlp": "params",
    }
    assert all(bf.fqn == fqn for fqn, bf in forms.items())
    assert forms["model.layers.0.self_attn"].inputs[0].src == p("R", "S(1)")
    live = classify_plan(plan_from_meta(meta), axes=("tp",), sizes={"tp": 1})
    assert live["model.layers.0.self_attn"].form == "identity"


# --- properties over random placements on up to three axes --------------------------------

AXES = st.lists(st.sampled_from(["cp", "tp", "ep", "dp"]), unique=True, max_size=3)


@st.composite
def transition(draw: Any) -> tuple[tuple[str, ...], tuple[Any, ...], tuple[Any, ...]]:
    axes = tuple(draw(AXES))
    src = tuple(parse_placement(draw(st.sampled_from(PLACEMENTS))) for _ in axes)
    dst = tuple(parse_placement(draw(st.sampled_from(PLACEMENTS))) for _ in axes)
    return axes, src, dst


@settings(max_examples=200, deadline=None)
@given(transition())
def test_lowered_op_agrees_with_redistribute_steps(case: Any) -> None:
    axes, src, dst = case
    op = classify_transition(src, dst, axes)
    steps = redistribute_steps(src, dst, axes)
    assert (op == ID) == (src == dst) == (steps == ())
    if op is not None and op != ID:
        # one collective on tp, the same DTensor would run
        assert [(s.axis, s.kind, s.dim) for s in steps] == [("tp", op.kind, op.dim)]
    changed = {a for a, s, d in zip(axes, src, dst, strict=True) if s != d}
    assert {s.axis for s in steps} == changed


@settings(max_examples=120, deadline=None)
@given(transition(), st.data())
def test_size_one_axes_never_communicate(case: Any, data: Any) -> None:
    axes, src, dst = case
    sizes = {a: data.draw(st.sampled_from([1, 2, 4])) for a in axes}
    names = ("x",)
    e = {"in_src": {n: {a: str(p) for a, p in zip(axes, src, strict=True)} for n in names},
         "in_dst": {n: {a: str(p) for a, p in zip(axes, dst, strict=True)} for n in names}}
    bf = classify("m", e, axes, sizes=sizes)
    if not axes:
        return
    t = bf.inputs[0]
    assert all(sizes[s.axis] > 1 for s in t.steps + t.grad_steps)
    if all(sizes[a] == 1 for a in axes):
        assert bf.form == "identity"
