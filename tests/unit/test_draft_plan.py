"""The draft plan generate fills: every value checked as it is set, frozen once, and a
``param_plan`` read into a draft and frozen writes back the same JSON; torch stays unloaded."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hpcodegen.placement import REPLICATE, Partial, Shard
from hpcodegen.plan.codec import PlanFormatError, entries_from_json
from hpcodegen.plan.draft import (
    DraftError,
    DraftPlan,
    FrozenDraftError,
    entries_to_json,
)

ROOT = Path(__file__).resolve().parents[2]
METAS = sorted(ROOT.glob("examples/*/codegen_meta.json"))


@pytest.mark.parametrize("path", METAS, ids=lambda p: p.parent.name)
def test_a_param_plan_through_the_draft_is_unchanged(path: Path) -> None:
    plan = json.loads(path.read_text())["param_plan"]
    frozen = DraftPlan.from_json(plan).freeze()
    assert frozen == entries_from_json(plan)
    assert entries_to_json(frozen) == plan


def test_an_entry_filled_by_passes_freezes_to_the_codecs_entry() -> None:
    draft = DraftPlan()
    attn = draft.entry("model.layers.0.self_attn")
    attn.place("params", "q_proj.weight", {"tp": Shard(0)})
    attn.place("params", "o_proj.weight", {"tp": Shard(1)})
    attn.place("out_src", "output", {"tp": Partial()})
    attn.place("out_dst", "output", {"tp": REPLICATE})
    attn.set("tp_divide_attrs", ["num_heads"])
    attn.set("is_boundary", True)
    assert draft.entry("model.layers.0.self_attn") is attn  # one entry per FQN
    written = entries_to_json(draft.freeze())
    assert written == {"model.layers.0.self_attn": {
        "params": {"q_proj.weight": {"tp": "S(0)"}, "o_proj.weight": {"tp": "S(1)"}},
        "out_src": {"output": {"tp": "P(sum)"}}, "out_dst": {"output": {"tp": "R"}},
        "tp_divide_attrs": ["num_heads"], "is_boundary": True}}


@pytest.mark.parametrize(("field", "value", "named"), [
    ("params", "S(0)", "a placement object"),      # a string bypasses the codec
    ("params", 0, "a placement object"),
    ("out_names", {"tp": Shard(0)}, "not a placement field"),
])
def test_a_bad_placement_is_refused_where_it_is_set(field: str, value: object,
                                                    named: str) -> None:
    entry = DraftPlan().entry("lm_head")
    with pytest.raises(DraftError, match=named) as caught:
        entry.place(field, "weight", {"tp": value})  # type: ignore[dict-item]
    assert "lm_head" in str(caught.value)


def test_other_fields_are_checked_as_set() -> None:
    entry = DraftPlan().entry("m")
    with pytest.raises(DraftError, match="sequence of names"):
        entry.set("out_names", "output")
    with pytest.raises(DraftError, match="true or false"):
        entry.set("is_boundary", 1)  # type: ignore[arg-type]
    with pytest.raises(DraftError, match="not a name or flag"):
        entry.set("params", ("weight",))
    entry.set("out_names", ("output",))
    entry.set("out_names", None)
    assert entry.get("out_names") is None


def test_json_enters_through_the_codec_with_its_path() -> None:
    with pytest.raises(PlanFormatError) as caught:
        DraftPlan.from_json({"lm_head": {"params": {"weight": {"tp": "S(x)"}}}})
    assert caught.value.where == "/param_plan/lm_head/params/weight/tp"


def test_the_draft_freezes_once_and_then_refuses_changes() -> None:
    draft = DraftPlan()
    entry = draft.entry("lm_head")
    entry.place("params", "weight", {"tp": Shard(0)})
    frozen = draft.freeze()
    assert frozen["lm_head"].params["weight"]["tp"] == Shard(0)
    for change in (lambda: entry.place("params", "bias", {"tp": Shard(0)}),
                   lambda: entry.set("is_boundary", True),
                   lambda: draft.entry("model.norm"),
                   lambda: draft.drop("lm_head"),
                   draft.freeze):
        with pytest.raises(FrozenDraftError):
            change()
    assert draft.entry("lm_head") is entry  # reading stays allowed


def test_a_pass_edits_the_draft_in_place_and_reads_its_typed_view() -> None:
    """What generate's passes do: a fresh entry per module (at its old position), a whole
    field set (an empty one declared), names added sorted once and removed (an emptied list
    goes), a parameter-only entry on demand, the plan sorted by FQN; the typed view is a
    snapshot that leaves the draft open."""
    draft = DraftPlan.from_json({"b": {"params": {"w": {"tp": "R"}}, "is_boundary": False},
                                 "a": {"params": {"w": {"tp": "S(0)"}}}})
    fresh = draft.reset("b")
    fresh.set_placements("params", {})
    fresh.set_placements("in_src", {"x": {"tp": Shard(1)}})
    fresh.add_names("partial_grad_params", ["w", "v", "w"])
    fresh.remove_name("partial_grad_params", "v")
    assert fresh.get("partial_grad_params") == ("w",)
    fresh.remove_name("partial_grad_params", "w")
    assert fresh.get("partial_grad_params") is None
    assert list(draft) == ["b", "a"] and fresh.boundary
    assert draft.param_entry("c").placements("params") == {}
    assert draft.param_entry("a") is draft["a"]  # an existing entry is kept as it is
    draft["a"].unplace("params", "w")
    view = draft.view()
    assert view["b"].in_src["x"]["tp"] == Shard(1) and not view["c"].boundary
    draft.sort()
    assert list(draft) == ["a", "b", "c"] and not draft.frozen
    assert entries_to_json(draft.freeze()) == {
        "a": {"params": {}}, "b": {"params": {}, "in_src": {"x": {"tp": "S(1)"}}},
        "c": {"params": {}, "is_boundary": False}}
    with pytest.raises(FrozenDraftError):
        draft.reset("a")
    with pytest.raises(DraftError, match=r"param_plan\['a'\]\.params: not a"):
        DraftPlan().entry("a").set("params", ("w",))


def test_the_draft_loads_no_torch() -> None:
    code = ("import json, sys; from hpcodegen.plan.draft import DraftPlan, entries_to_json;"
            f"m = json.load(open({str(ROOT / 'examples/llama_tp2/codegen_meta.json')!r}));"
            "d = DraftPlan.from_json(m['param_plan']);"
            "assert entries_to_json(d.freeze()) == m['param_plan'];"
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)
