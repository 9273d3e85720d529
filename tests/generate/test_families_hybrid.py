"""generate on the hybrid state-space + attention decoder families (package rules).

Bamba, Falcon-H1 and Zamba2 mix Mamba-2 mixers with attention: the mixer's two projections
are split (in_proj gathered colwise: its packed blocks are unequal; out_proj split rowwise)
and its scan replicated, as mamba2.yaml does; attention by heads and the MLP
colwise/rowwise where the family's blocks are its own (Zamba2's shared blocks are tied
across layers: replicated). Numerics in tests/runtime/test_family_parity_ssm.py.
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


def plan_of(family: str, tp: int = 2, sp: bool = False, notes: list[str] | None = None,
            **overrides: object) -> dict:
    config, _ = read_hf_config(FAMILIES / family)
    config.update(overrides)
    warned: list = []  # every family here splits its layers: no generate.no_layer_split
    files = build_bundle(config, tp, sp, None, family, notes=notes, warnings=warned)
    assert not warned, [w.render() for w in warned]
    return json.loads(files["codegen_meta.json"])["param_plan"]


def assert_mixer_split(plan: dict, mixer: str) -> None:
    in_proj = plan[f"{mixer}.in_proj"]
    assert in_proj["params"] == {"weight": {"tp": "S(0)"}}
    assert in_proj["out_src"] == {"output": {"tp": "S(-1)"}}
    assert in_proj["out_dst"] == {"output": {"tp": "R"}}
    out_proj = plan[f"{mixer}.out_proj"]
    assert out_proj["params"]["weight"] == {"tp": "S(1)"}
    assert out_proj["in_dst"] == {"input": {"tp": "S(-1)"}}
    assert out_proj["out_src"] == {"output": {"tp": "P(sum)"}}
    own = plan[mixer]["params"]  # the scan's parameters stay whole
    assert {own[p]["tp"] for p in ("A_log", "D", "dt_bias", "conv1d.weight")} == {"R"}


def assert_attention_and_mlp_split(plan: dict, layer: str, mlp: str) -> None:
    attn = plan[f"{layer}.self_attn"]["params"]
    assert attn["q_proj.weight"] == {"tp": "S(0)"} and attn["k_proj.weight"] == {"tp": "S(0)"}
    assert attn["o_proj.weight"] == {"tp": "S(1)"}
    ff = plan[f"{layer}.{mlp}"]["params"]
    assert ff["gate_proj.weight"] == {"tp": "S(0)"} and ff["down_proj.weight"] == {"tp": "S(1)"}


@pytest.mark.parametrize("tp", [2, 4])
def test_bamba_mixer_attention_and_mlp(tp: int) -> None:
    notes: list[str] = []
    plan = plan_of("bamba", tp, notes=notes, num_key_value_heads=tp)
    assert notes[0].startswith("structural seeds:")  # no rule file: found by structure
    assert_mixer_split(plan, "model.layers.0.mamba")
    assert "model.layers.0.self_attn" not in plan  # layer 0 is a mixer layer
    assert_attention_and_mlp_split(plan, "model.layers.1", "feed_forward")
    assert plan["model.layers.1.self_attn"]["params"]["q_proj.bias"] == {"tp": "S(0)"}
    assert plan["model.layers.0.feed_forward"]["params"]["up_proj.weight"] == {"tp": "S(0)"}


@pytest.mark.parametrize("tp", [2, 4])
def test_falcon_h1_parallel_mixer_and_attention(tp: int) -> None:
    notes: list[str] = []
    plan = plan_of("falcon_h1", tp, notes=notes, num_key_value_heads=tp)
    assert notes[0].startswith("structural seeds:")  # no rule file: found by structure
    for i in (0, 1):  # every layer has both
        assert_mixer_split(plan, f"model.layers.{i}.mamba")
        assert_attention_and_mlp_split(plan, f"model.layers.{i}", "feed_forward")


def test_zamba2_mixers_split_shared_blocks_replicated() -> None:
    notes: list[str] = []
    plan = plan_of("zamba2", notes=notes)
    assert "hpcodegen/generate/rules/zamba2.yaml" in notes[0]
    assert_mixer_split(plan, "model.layers.1.mamba")
    assert_mixer_split(plan, "model.layers.0.mamba_decoder.mamba")  # the hybrid layer's
    for layer in (0, 2):  # tied across the hybrid layers: every alias planned, replicated
        shared = f"model.layers.{layer}.shared_transformer"
        assert plan[f"{shared}.self_attn.q_proj"]["params"] == {"weight": {"tp": "R"}}
        assert plan[f"{shared}.feed_forward.gate_up_proj"]["params"] == {"weight": {"tp": "R"}}


@pytest.mark.parametrize("family", ["bamba", "falcon_h1"])
def test_hybrid_families_generate_with_sp(family: str) -> None:
    plan = plan_of(family, 2, sp=True)
    assert plan["model.layers.0.mamba.in_proj"]["params"] == {"weight": {"tp": "S(0)"}}


def test_zamba2_sp_refused_where_shared_blocks_are_replicated() -> None:
    """The replicated shared attention would see only its rank's slice of the sequence."""
    with pytest.raises(PlanError, match=r"shared_transformer|linear.*--sp"):
        plan_of("zamba2", 2, sp=True)


def test_zamba_mixer_split_by_mamba_heads() -> None:
    plan = plan_of("zamba")
    mixer = plan["model.layers.0.mamba"]
    for name in ("x_proj_weight", "dt_proj_weight", "dt_proj_bias", "A_log", "D",
                 "in_proj.weight", "conv1d.weight"):
        assert mixer["params"][name] == {"tp": "S(0)"}, name
    assert mixer["params"]["out_proj.weight"] == {"tp": "S(1)"}
    assert mixer["out_src"] == {"output": {"tp": "P(sum)"}}
    assert {"n_mamba_heads", "conv1d.groups"} <= set(mixer["tp_divide_attrs"])


def test_zamba_heads_that_do_not_divide_fall_back_to_gathered_projections() -> None:
    notes: list[str] = []
    plan = plan_of("zamba", 4, notes=notes, num_key_value_heads=4)  # n_mamba_heads = 2
    assert "n_mamba_heads does not divide tp" in notes[0]
    assert plan["model.layers.0.mamba"]["params"]["x_proj_weight"] == {"tp": "R"}
    assert plan["model.layers.0.mamba.in_proj"]["out_dst"] == {"output": {"tp": "R"}}
