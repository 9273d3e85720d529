"""The pure MoE rules: HF styles on parameters, packed expert placements, the dispatch
prediction and its bytes (no torch)."""

from __future__ import annotations

import sys

import pytest

from hpcodegen.errors import PlanError
from hpcodegen.generate.sources.hf_plan import expand_rules
from hpcodegen.generate.sources.styles import Kind, param_shard
from hpcodegen.plan.codec import entry_from_json, injection_from_json
from hpcodegen.plan.moe import (
    dispatch_ops,
    dispatch_output_tp,
    dispatch_volume,
    ep_dispatch_size,
    expert_count,
    output_agrees,
)


def test_param_shard_reads_weights_as_out_in() -> None:
    def shown(kind: Kind, ndim: int, factor: int) -> tuple[str, bool]:
        placement, rowwise_bias = param_shard(kind, ndim, factor)
        return str(placement), rowwise_bias

    assert shown(Kind.COLWISE, 3, 2) == ("SS(1,2)", False)   # [E, 2I, H] packed
    assert shown(Kind.ROWWISE, 3, 1) == ("S(2)", False)      # [E, H, I]
    assert shown(Kind.ROWWISE, 3, 2) == ("SS(2,2)", False)   # llama4 [E, H, 2I]
    assert shown(Kind.COLWISE, 1, 1) == ("S(0)", False)      # a per-head vector
    assert shown(Kind.ROWWISE, 1, 1) == ("R", True)          # a rowwise bias


def test_rules_on_parameters_become_parameter_assignments() -> None:
    fqns = ["", "m", "m.experts"]
    params = ["m.experts.gate_up_proj", "m.experts.down_proj"]
    got = expand_rules([("m.experts.gate_up_proj", "packed_colwise"),
                        ("m.experts.down_proj", "rowwise"),
                        ("m.experts", "moe_tp_experts")], fqns, params)
    assert got["m.experts.gate_up_proj"].param and got["m.experts.gate_up_proj"].factor == 2
    assert got["m.experts"].kind is Kind.MOE_EXPERTS and not got["m.experts"].param
    with pytest.raises(PlanError, match="only applies to modules"):
        expand_rules([("m.experts.down_proj", "embedding_rowwise")], fqns, params)


def test_dispatch_prediction_inputs() -> None:
    inj = {"match": "m", "local_compute_fn": {"_target_": "hpcodegen.runtime.moe.ep_dispatch"},
           "ep_size": 4}
    assert ep_dispatch_size(injection_from_json(inj)) == 4
    assert ep_dispatch_size(injection_from_json({**inj, "ep_size": 1})) == 0
    assert ep_dispatch_size(injection_from_json(
        {**inj, "local_compute_fn": {"_target_": "x.ep_compute"}})) == 0
    assert ep_dispatch_size(None) == 0
    assert expert_count({"text_config": {"num_local_experts": 16}}) == 16
    # what leaves a rank: (ep-1)/ep of its rows under balanced routing
    vol = dispatch_volume(tokens=4096, top_k=8, hidden=2048, num_experts=128, elem_bytes=2,
                          ep=4)
    assert vol.dispatch == vol.combine == 4096 * 8 * 2048 * 2 * 3 / 4
    assert vol.counts == 128 * 8 * 3 / 4 and vol.tp_gather == vol.tp_counts == 0
    # sequence parallel at tp 2: the received rows go to the one tp peer and back
    vol = dispatch_volume(tokens=2048, top_k=8, hidden=2048, num_experts=128, elem_bytes=2,
                          ep=4, tp_gather=2)
    assert vol.tp_gather == vol.tp_scatter == 2048 * 8 * 2048 * 2
    assert vol.tp_counts == 128 * 8
    assert dispatch_volume(4096, 8, 2048, 128, 2, ep=1).dispatch == 0  # nothing leaves


def test_dispatch_ops_run_on_the_live_axes() -> None:
    fwd, bwd = dispatch_ops(ep_live=True, tp_gather=False)
    assert [o.name for o in fwd] == ["counts", "dispatch", "combine"]
    assert [o.name for o in bwd] == ["combine", "dispatch"]
    fwd, bwd = dispatch_ops(ep_live=True, tp_gather=True)
    assert [(o.name, o.axis) for o in fwd] == [
        ("counts", "ep"), ("dispatch", "ep"), ("tp_counts", "tp"), ("tp_gather", "tp"),
        ("tp_scatter", "tp"), ("combine", "ep")]
    assert [o.name for o in bwd] == ["combine", "tp_scatter", "tp_gather", "dispatch"]
    fwd, bwd = dispatch_ops(ep_live=False, tp_gather=True)  # no ep group: the tp steps only
    assert {o.axis for o in fwd + bwd} == {"tp"}


def test_the_dispatch_output_over_tp_is_its_contract() -> None:
    """tp-split experts on whole rows: a partial sum; rows gathered over tp (--sp): the
    rows come back sharded; experts whole over tp: no rule (the rows' own layout)."""
    split = {"down_proj": {"ep": "S(0)", "tp": "S(2)"}, "gate_up_proj": {"ep": "S(0)",
                                                                       "tp": "SS(1,2)"}}
    whole = {"hidden_states": {"tp": "R"}}
    rows = {"hidden_states": {"tp": "S(0)"}}
    entry = entry_from_json("e", {"params": split, "in_src": whole, "in_dst": whole})
    assert dispatch_output_tp(entry) == "partial"
    assert output_agrees("partial", {"tp": entry_from_json("x", {"out_src": {
        "o": {"tp": "P(sum)"}}}).out_src["o"]["tp"]})
    assert not output_agrees("partial", {})  # R: the partial sum would never be reduced
    entry = entry_from_json("e", {"params": split, "in_src": rows, "in_dst": rows})
    assert dispatch_output_tp(entry) == "shard"
    assert not output_agrees("shard", {})
    unsplit = {k: {"ep": "S(0)"} for k in split}
    assert dispatch_output_tp(entry_from_json("e", {"params": unsplit, "in_dst": rows})) is None
    assert output_agrees(None, {})


def test_plan_moe_is_pure() -> None:
    import subprocess

    code = ("import sys, hpcodegen.plan.moe, hpcodegen.plan.predict; "
            "assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)
