"""generate on the state-space decoder families (package rules split the mixer over tp).

Numerics in tests/runtime/test_family_parity_ssm.py on real gloo ranks.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from artifact_memo import build_bundle

from hpcodegen.errors import PlanError
from hpcodegen.hf import read_hf_config

pytestmark = pytest.mark.slow

FAMILIES = Path(__file__).resolve().parents[1] / "fixtures" / "families"


def plan_of(family: str, tp: int = 2, notes: list[str] | None = None,
            **overrides: object) -> dict:
    config, _ = read_hf_config(FAMILIES / family)
    config.update(overrides)
    files = build_bundle(config, tp, False, None, family, notes=notes)
    return json.loads(files["codegen_meta.json"])["param_plan"]


@pytest.mark.parametrize("family", ["mamba", "falcon_mamba"])
@pytest.mark.parametrize("tp", [2, 4])
def test_mamba_mixer_split_by_channels(family: str, tp: int) -> None:
    notes: list[str] = []
    plan = plan_of(family, tp, notes)
    assert len(notes) == 1 and f"hpcodegen/generate/rules/{family}.yaml" in notes[0]
    mixer = plan["backbone.layers.0.mixer"]
    assert mixer["params"] == {
        "in_proj.weight": {"tp": "SS(0,2)"}, "conv1d.weight": {"tp": "S(0)"},
        "conv1d.bias": {"tp": "S(0)"}, "dt_proj.weight": {"tp": "S(0)"},
        "dt_proj.bias": {"tp": "S(0)"}, "A_log": {"tp": "S(0)"}, "D": {"tp": "S(0)"},
        "out_proj.weight": {"tp": "S(1)"}}
    assert mixer["out_src"] == {"output": {"tp": "P(sum)"}}
    assert "conv1d.groups" in mixer["tp_divide_attrs"]
    x_proj = plan["backbone.layers.0.mixer.x_proj"]
    assert x_proj["params"] == {"weight": {"tp": "S(1)"}}
    assert x_proj["in_dst"] == {"input": {"tp": "S(-1)"}}
    assert x_proj["out_src"] == {"output": {"tp": "P(sum)"}}
    assert x_proj["out_dst"] == {"output": {"tp": "R"}}


def test_mamba_biases_follow_their_projection() -> None:
    """use_bias: in_proj's bias packed like its weight, out_proj's added once (deferred)."""
    mixer = plan_of("mamba", use_bias=True, use_conv_bias=False)["backbone.layers.0.mixer"]
    assert mixer["params"]["in_proj.bias"] == {"tp": "SS(0,2)"}
    assert mixer["params"]["out_proj.bias"] == {"tp": "R"}
    assert mixer["deferred_bias_params"] == ["out_proj.bias"]
    assert "conv1d.bias" not in mixer["params"]


def test_nested_x_proj_all_reduces_its_gradient() -> None:
    """The classifier gives the nested x_proj's all_reduce an all_reduce backward."""
    from hpcodegen.plan.classify import classify_plan
    from hpcodegen.plan.codec import plan_from_meta

    config, _ = read_hf_config(FAMILIES / "mamba")
    meta = json.loads(build_bundle(config, 2, False, None, "mamba")["codegen_meta.json"])
    forms = classify_plan(plan_from_meta(meta))
    out = forms["backbone.layers.0.mixer.x_proj"].outputs[0]
    assert [s.kind for s in out.grad_steps] == ["all_reduce"]
    assert [s.kind for s in forms["backbone.layers.0.mixer"].outputs[0].grad_steps] == []


@pytest.mark.parametrize("tp", [2, 4])
def test_mamba2_projections_split_scan_replicated(tp: int) -> None:
    """Mamba-2's in_proj packs unequal blocks: gathered colwise, out_proj split rowwise,
    the mixer's own parameters replicated with whole gradients."""
    notes: list[str] = []
    plan = plan_of("mamba2", tp, notes)
    assert notes[0].startswith("structural seeds:")  # no rule file: found by structure
    assert plan["backbone.layers.0.mixer.in_proj"]["params"] == {"weight": {"tp": "S(0)"}}
    assert plan["backbone.layers.0.mixer.in_proj"]["out_src"] == {"output": {"tp": "S(-1)"}}
    out = plan["backbone.layers.0.mixer.out_proj"]
    assert out["params"] == {"weight": {"tp": "S(1)"}}
    assert out["in_dst"] == {"input": {"tp": "S(-1)"}}
    mixer = plan["backbone.layers.0.mixer"]
    assert mixer["is_boundary"] is False and "partial_grad_params" not in mixer
    assert all(p == {"tp": "R"} for p in mixer["params"].values())


def test_uneven_packed_projection_is_refused() -> None:
    """9 heads of 16 on hidden 72, one group: in_proj has 2*144 + 2*1*16 + 9 = 329 rows,
    which no config field names; torch would shard it unevenly and the gather could not
    run. (The config runs unsharded: 9 heads over 2 groups would not.)"""
    with pytest.raises(PlanError, match=r"in_proj.weight.*size 329 over tp_size = 2"):
        plan_of("mamba2", 2, hidden_size=72, num_heads=9, n_groups=1)


def test_rwkv_time_and_channel_mixing_split_by_channels() -> None:
    plan = plan_of("rwkv", 4)
    att = plan["rwkv.blocks.0.attention"]
    for name in ("key.weight", "value.weight", "receptance.weight", "time_decay", "time_first"):
        assert att["params"][name] == {"tp": "S(0)"}, name
    assert att["params"]["output.weight"] == {"tp": "S(1)"}
    assert set(att["partial_grad_params"]) == {"time_mix_key", "time_mix_value",
                                               "time_mix_receptance"}
    ffn = plan["rwkv.blocks.0.feed_forward"]
    assert ffn["params"]["key.weight"] == {"tp": "S(0)"}
    assert ffn["params"]["value.weight"] == {"tp": "S(1)"}
    # the hidden-sized gate multiplies the partial output: replicated, partial gradient
    assert ffn["params"]["receptance.weight"] == {"tp": "R"}
    assert "receptance.weight" in ffn["partial_grad_params"]


def test_recurrent_gemma_rg_lru_by_heads_and_mqa_attention_whole() -> None:
    plan = plan_of("recurrent_gemma")  # one shared k/v head
    block = plan["model.layers.0.temporal_block"]
    assert block["params"]["conv_1d.weight"] == {"tp": "S(0)"}
    assert block["params"]["linear_out.weight"] == {"tp": "S(1)"}
    lru = plan["model.layers.0.temporal_block.rg_lru"]
    assert lru["params"]["input_gate_weight"] == {"tp": "S(0)"}  # [heads, w, w]
    assert lru["tp_divide_attrs"] == ["num_attention_heads"]
    assert plan["model.layers.0.temporal_block.conv_1d"]["tp_divide_attrs"] == [
        "groups", "in_channels", "out_channels"]
    assert plan["model.layers.2.temporal_block.q_proj"]["params"]["weight"] == {"tp": "R"}
    gqa = plan_of("recurrent_gemma_gqa")["model.layers.2.temporal_block"]
    assert gqa["params"]["k_proj.weight"] == {"tp": "S(0)"}
    assert gqa["params"]["o_proj.weight"] == {"tp": "S(1)"}


def test_a_config_whose_forward_does_not_run_says_why_nothing_is_seeded() -> None:
    """9 heads over 2 groups: transformers' own forward fails (repeat_interleave), so the
    seeds read from the traced forward are missing; generate says so instead of a silently
    replicated plan."""
    notes: list[str] = []
    plan = plan_of("mamba2", 2, notes, hidden_size=72, num_heads=9)
    assert plan["backbone.layers.0.mixer"]["params"]["in_proj.weight"] == {"tp": "R"}
    assert any("does not run on meta tensors" in n for n in notes), notes
