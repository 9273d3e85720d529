"""verify's pipeline rules: a generated-shape pipeline section passes; each hand edit the
issue names (a module in two stages or in none, a stage order that breaks the forward, an
action list that deadlocks or runs a backward first, a tied pair left out) is refused with
the JSON pointer of what is wrong."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hpcodegen.plan.pipeline_build import Unit, build_pipeline
from hpcodegen.plan.schedule import actions_digest, parse_action

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
sys.path.append(str(FIXTURES))
import verify_fixtures as vf  # noqa: E402

LAYERS = 4


def _units(layers: int = LAYERS) -> list[Unit]:
    return ([Unit("model.embed_tokens", 256 * 64, False)]
            + [Unit(f"model.layers.{i}", 40000, True) for i in range(layers)]
            + [Unit("model.norm", 64, False), Unit("lm_head", 256 * 64, False)])


def pp_meta(schedule: str = "1F1B", pp: int = 2, m: int = 4, v: int = 1) -> dict[str, Any]:
    meta = vf.llama_meta(layers=LAYERS)
    meta["parallel_dims"]["pp_size"] = pp
    meta["pipeline"] = build_pipeline(
        _units(), pp=pp, schedule=schedule, n_microbatches=m, stages_per_rank=v,
        replicated=["model.rotary_emb"], placements={"tp": "S(1)"}, tied=meta["tied_pairs"])
    return meta


def errors(meta: dict[str, Any], check: str = "plan") -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for f in vf.run_check(check, meta).findings:
        if f.severity.value == "error":
            out.setdefault(f.code, []).append(f.where)
    return out


def _redigest(meta: dict[str, Any]) -> None:
    acts = {int(r): [parse_action(a) for a in v] for r, v in meta["pipeline"]["actions"].items()}
    meta["pipeline"]["actions_sha256"] = actions_digest(acts)


@pytest.mark.parametrize(("schedule", "pp", "v"), [
    ("1F1B", 2, 1), ("GPipe", 2, 1), ("Interleaved1F1B", 2, 2), ("ZBVZeroBubble", 2, 2),
    ("DualPipeV", 2, 2)])
def test_a_built_pipeline_passes_schema_and_plan(schedule, pp, v):
    meta = pp_meta(schedule, pp, 4, v)
    assert errors(meta, "schema") == {}
    if schedule in ("ZBVZeroBubble", "DualPipeV"):  # the fixture's SP norms: tp-partial grads
        assert errors(meta) == {"plan.pp_split_backward": ["/pipeline/schedule"]}
        return
    assert errors(meta) == {}
    pipe = meta["pipeline"]
    assert pipe["tied_across_stages"][0]["stages"] == [0, pp * v - 1 if v == 1 or
                                                      schedule != "ZBVZeroBubble" else 3]


def test_the_split_balances_and_keeps_the_embedding_and_head_at_the_ends():
    stages = pp_meta()["pipeline"]["stages"]
    assert stages[0]["modules"] == ["model.embed_tokens", "model.layers.0", "model.layers.1"]
    assert stages[1]["modules"] == ["model.layers.2", "model.layers.3", "model.norm", "lm_head"]


def test_a_module_in_two_stages():
    meta = pp_meta()
    meta["pipeline"]["stages"][1]["modules"].insert(0, "model.layers.1")
    assert errors(meta)["plan.pp_module_twice"] == ["/pipeline/stages/1/modules/0"]


def test_a_module_in_no_stage():
    meta = pp_meta()
    meta["pipeline"]["stages"][1]["modules"].remove("model.layers.2")
    found = errors(meta)
    assert found["plan.pp_module_missing"] == ["/pipeline/module_order/3"]
    assert "/param_plan/model.layers.2.self_attn" in found["plan.pp_entry_stage"]


def test_a_stage_order_that_breaks_the_forward():
    meta = pp_meta()
    stages = meta["pipeline"]["stages"]
    stages[0]["modules"], stages[1]["modules"] = stages[1]["modules"], stages[0]["modules"]
    found = errors(meta)
    assert found["plan.pp_forward_order"] == ["/pipeline/stages/0/modules/0"]
    assert "plan.pp_layer_order" in found


def test_layers_swapped_inside_a_stage_even_when_module_order_is_edited_too():
    meta = pp_meta()
    mods = meta["pipeline"]["stages"][0]["modules"]
    mods[1], mods[2] = mods[2], mods[1]
    meta["pipeline"]["module_order"] = [m for s in meta["pipeline"]["stages"] for m in s["modules"]]
    assert errors(meta)["plan.pp_layer_order"] == ["/pipeline/stages/0/modules/1"]


def test_an_action_list_that_deadlocks():
    meta = pp_meta("GPipe", m=1)
    acts = meta["pipeline"]["actions"]["0"]  # 0F0 0SEND_F0 0RECV_B0 0B0
    acts[1], acts[2], acts[3] = acts[2], acts[3], acts[1]  # send after 0B0
    _redigest(meta)
    found = errors(meta)
    assert set(found) == {"plan.pp_actions_deadlock"}
    # rank 0 waits at 0B0 for a gradient, rank 1 at 1F0 for the activation sent after it
    assert found["plan.pp_actions_deadlock"] == ["/pipeline/actions/0/2", "/pipeline/actions/1/1"]


def test_an_action_list_running_a_backward_before_its_forward():
    meta = pp_meta()
    acts = meta["pipeline"]["actions"]["1"]
    i, j = acts.index("1F0"), acts.index("1B0")
    acts[i], acts[j] = acts[j], acts[i]
    _redigest(meta)
    found = errors(meta)
    assert "/pipeline/actions/1/" + str(i) in found["plan.pp_actions_order"]


def test_an_edited_action_list_without_a_new_digest():
    meta = pp_meta()
    meta["pipeline"]["actions"]["0"].reverse()
    assert errors(meta)["plan.pp_actions_digest"] == ["/pipeline/actions_sha256"]


def test_a_valid_but_foreign_order_is_a_warning():
    meta = pp_meta("GPipe", m=2)
    acts = meta["pipeline"]["actions"]["0"]  # 0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1
    meta["pipeline"]["actions"]["0"] = acts[:4] + acts[6:8] + acts[4:6]
    meta["pipeline"]["actions"]["1"] = [a for a in meta["pipeline"]["actions"]["1"]]
    r1 = meta["pipeline"]["actions"]["1"]  # backward order on rank 1 must match: B1 before B0
    b0, b1 = r1.index("1B0"), r1.index("1B1")
    r1[b0:b0 + 2], r1[b1:b1 + 2] = r1[b1:b1 + 2], r1[b0:b0 + 2]
    _redigest(meta)
    findings = vf.run_check("plan", meta).findings
    assert not [f for f in findings if f.severity.value == "error"], findings
    assert any(f.code == "plan.pp_actions_custom" for f in findings)


def test_an_unparsable_action_names_its_position():
    meta = pp_meta()
    meta["pipeline"]["actions"]["1"][2] = "1X0"
    assert errors(meta)["plan.pp_actions"] == ["/pipeline/actions/1/2"]


def test_a_tied_pair_left_out():
    meta = pp_meta()
    meta["pipeline"]["tied_across_stages"] = []
    assert errors(meta)["plan.pp_tied_missing"] == ["/pipeline/tied_across_stages"]


def test_the_stage_rank_map_and_counts_follow_the_schedule():
    meta = pp_meta("Interleaved1F1B", v=2)
    meta["pipeline"]["stages"][1]["rank"] = 0
    assert errors(meta)["plan.pp_stage_rank"] == ["/pipeline/stages/1/rank"]
    meta = pp_meta()
    meta["pipeline"]["style"] = "v"
    meta["parallel_dims"]["pp_size"] = 4
    found = errors(meta)
    assert found["plan.pp_style"] == ["/pipeline/style"]
    assert found["plan.pp_size"] == ["/pipeline/pp_size"]


def test_the_loss_contract_must_be_exact():
    meta = pp_meta()
    meta["pipeline"]["loss"]["scale_grads"] = True
    assert errors(meta)["plan.pp_loss"] == ["/pipeline/loss"]
    assert errors(meta, "schema")


def test_a_boundary_placement_against_sequence_parallelism():
    meta = pp_meta()
    meta["pipeline"]["boundary"]["placements"] = {"tp": "R"}
    assert errors(meta)["plan.pp_boundary"] == ["/pipeline/boundary/placements/tp"]


def test_a_split_backward_is_exact_without_tp_partial_gradients():
    meta = pp_meta("ZBVZeroBubble", v=2)
    for entry in meta["param_plan"].values():
        entry.pop("partial_grad_params", None)
    meta["parallel_dims"]["sequence_parallel"] = False
    meta["pipeline"]["boundary"]["placements"] = {}
    found = errors(meta)
    assert "plan.pp_split_backward" not in found, found


def test_pp_size_without_a_pipeline_is_a_warning():
    meta = vf.llama_meta()
    meta["parallel_dims"]["pp_size"] = 2
    findings = vf.run_check("plan", meta).findings
    assert any(f.code == "plan.pp_without_pipeline" and f.severity.value == "warning"
               for f in findings)


def test_broken_section_shapes_never_crash():
    for bad in ({"stages": "x"}, {"actions": {"0": [3]}}, {"loss": None},
                {"tied_across_stages": [{}]}):
        meta = pp_meta()
        meta["pipeline"] = {**copy.deepcopy(meta["pipeline"]), **bad}
        result = vf.run_check("plan", meta)
        assert not [f for f in result.findings if f.code.endswith("internal")], result.findings


def test_the_plan_round_trips_with_its_pipeline():
    from hpcodegen.plan.codec import plan_from_meta, plan_to_meta

    meta = pp_meta("ZBVZeroBubble", v=2)
    plan = plan_from_meta(meta)
    assert plan.pipeline is not None and plan.pipeline.n_stages == 4
    assert plan_to_meta(plan) == meta


def test_the_pipeline_rules_import_no_torch():
    code = (f"import sys; sys.path.append({str(FIXTURES)!r}); import verify_fixtures as vf;"
            "from test_check_pipeline import pp_meta;"
            "r = vf.run_check('plan', pp_meta('Interleaved1F1B', v=2)); assert r.status == 'pass';"
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300,
                   cwd=Path(__file__).parent)


@pytest.mark.timeout(400)
def test_declared_sizes_the_list_cannot_hold_are_refused_without_the_work():
    """A hostile section declaring 65536 microbatches over an 8-action list: refused with
    the count it would need, the work bounded by the list's own size (no 65536-long loop
    per stage; the timeout mark is the bound)."""
    meta = pp_meta("GPipe", m=1)
    meta["pipeline"]["n_microbatches"] = 65536
    found = errors(meta)
    assert found["plan.pp_actions_missing"] == ["/pipeline/actions"]


def _split_backward_meta(schedule: str, m: int = 4) -> dict[str, Any]:
    """A pipeline whose tp plan has no tp-partial gradients (a split backward is exact)."""
    meta = pp_meta(schedule, m=m, v=2)
    for entry in meta["param_plan"].values():
        entry.pop("partial_grad_params", None)
    meta["parallel_dims"]["sequence_parallel"] = False
    meta["pipeline"]["boundary"]["placements"] = {}
    return meta


def _swap(acts: list[str], a: str, b: str) -> int:
    i, j = acts.index(a), acts.index(b)
    acts[i], acts[j] = acts[j], acts[i]
    return min(i, j)


def test_a_dualpipev_pipeline_passes_and_its_hand_edits_are_refused_at_their_path():
    found = errors(_split_backward_meta("DualPipeV"))
    assert not [code for code in found if code.startswith("plan.pp")], found

    meta = _split_backward_meta("DualPipeV")  # stage 3 runs B1 before F1 (rank 0)
    where = _swap(meta["pipeline"]["actions"]["0"], "3F1", "3B1")
    _redigest(meta)
    assert f"/pipeline/actions/0/{where}" in errors(meta)["plan.pp_actions_order"]

    meta = _split_backward_meta("DualPipeV")  # a weight gradient before its input gradient
    where = _swap(meta["pipeline"]["actions"]["1"], "2I3", "2W3")
    _redigest(meta)
    found = errors(meta)["plan.pp_actions_order"]
    assert f"/pipeline/actions/1/{where}" in found

    meta = _split_backward_meta("DualPipeV")  # a send whose receive was deleted
    meta["pipeline"]["actions"]["1"].remove("1RECV_F2")
    _redigest(meta)
    assert errors(meta)["plan.pp_actions_comm"] == ["/pipeline/actions/1"]


def test_a_dualpipev_pipeline_with_fewer_microbatches_than_stages():
    meta = _split_backward_meta("DualPipeV")
    meta["pipeline"]["n_microbatches"] = 3
    assert errors(meta)["plan.pp_microbatches"] == ["/pipeline/n_microbatches"]
