"""Head counts below the config's top level (one pure rule for generate, verify, inspect-plan).

A sub-config (BLT's per-stack configs, a composite's text/vision configs) sizes the stack
under a module named for it; when the plan splits that stack over tp its heads must divide
tp, and a ``tp_divide_attrs`` path through a held config (xLSTM's
``mlstm_layer.config.num_heads``) names a config field that must divide tp too.
"""

from __future__ import annotations

import subprocess
import sys

from hpcodegen.plan.codec import entries_from_json
from hpcodegen.plan.tp_divisible import MISSING, divide_attr_findings, tp_divisibility

SPLIT = {"params": {"q_proj.weight": {"tp": "S(0)"}, "o_proj.weight": {"tp": "S(1)"}}}
KEPT = {"params": {"q_proj.weight": {"tp": "R"}}}


def _findings(config: dict, plan: dict, tp: int = 2, unsplit: tuple[str, ...] = ()) -> list:
    return tp_divisibility(config, tp, "model", unsplit=unsplit, plan=entries_from_json(plan))


def test_a_split_stack_of_its_own_config_needs_divisible_heads() -> None:
    config = {"model_type": "blt", "global_config": {"num_attention_heads": 6,
                                                     "num_key_value_heads": 3},
              "encoder_config": {"num_attention_heads": 4, "num_key_value_heads": 2}}
    plan = {"model.global_transformer.layers.0.self_attn": SPLIT,
            "model.local_encoder.layers.0.self_attn": SPLIT}
    (found,) = _findings(config, plan)
    assert (found.code, found.where, found.expected) == (
        "model.heads_not_divisible", "/global_config/num_key_value_heads", "a multiple of 2")
    assert found.message.startswith("global_config.num_key_value_heads = 3 is not divisible "
                                    "by tp_size = 2")
    assert "model.global_transformer.layers.0.self_attn" in found.message
    # a pointer given by the caller (verify: the meta's tp size) is kept
    (at,) = tp_divisibility(config, 2, "model", "/parallel_dims/tp_size",
                            plan=entries_from_json(plan))
    assert at.where == "/parallel_dims/tp_size"


def test_tp_divide_attrs_alone_marks_a_stack_split() -> None:
    config = {"decoder_config": {"num_attention_heads": 3}}
    plan = {"model.local_decoder.layers.0.self_attn": {"tp_divide_attrs": ["num_heads"]}}
    assert [f.where for f in _findings(config, plan)] == ["/decoder_config/num_attention_heads"]


def test_a_replicated_stack_keeps_its_heads_whole() -> None:
    config = {"num_attention_heads": 4, "num_key_value_heads": 2,
              "vision_config": {"num_attention_heads": 3}}
    plan = {"model.vision_tower.layers.0.attn": KEPT,
            "model.language_model.layers.0.self_attn": SPLIT}
    assert _findings(config, plan) == []
    plan["model.vision_tower.layers.0.attn"] = SPLIT
    assert [f.where for f in _findings(config, plan)] == ["/vision_config/num_attention_heads"]


def test_a_composite_text_config_beside_top_level_heads_is_read() -> None:
    config = {"num_attention_heads": 4, "text_config": {"num_attention_heads": 4,
                                                        "num_key_value_heads": 3}}
    plan = {"model.language_model.layers.0.self_attn": SPLIT}
    assert [f.where for f in _findings(config, plan)] == ["/text_config/num_key_value_heads"]
    # a lone text_config is the top-level rule's own: reported once, not twice
    lone = {"text_config": {"num_attention_heads": 4, "num_key_value_heads": 3}}
    assert [f.where for f in _findings(lone, plan)] == ["/text_config/num_key_value_heads"]


def test_nested_sub_configs_and_unsplit_fields() -> None:
    config = {"text_config": {"num_attention_heads": 4, "num_key_value_heads": 2,
                              "depth_decoder_config": {"num_key_value_heads": 1}}}
    plan = {"model.depth_decoder.layers.0.self_attn": SPLIT}
    assert [f.where for f in _findings(config, plan)] == [
        "/text_config/depth_decoder_config/num_key_value_heads"]
    assert _findings(config, plan, unsplit=("num_key_value_heads",)) == []


def test_a_sub_config_under_a_plain_key_is_read_by_its_model_type() -> None:
    config = {"decoder": {"model_type": "musicgen_decoder", "num_attention_heads": 3},
              "rope_parameters": {"num_attention_heads": 3}}
    plan = {"model.decoder.layers.0.self_attn": SPLIT}
    assert [f.where for f in _findings(config, plan)] == ["/decoder/num_attention_heads"]


def test_a_count_divided_through_a_held_config() -> None:
    plan = {f"backbone.blocks.{i}.mlstm_layer": {"tp_divide_attrs": ["config.num_heads"]}
            for i in range(2)}
    (found,) = _findings({"num_heads": 3}, plan)
    assert (found.where, found.expected) == ("/num_heads", "a multiple of 2")
    assert "backbone.blocks.0.mlstm_layer and 1 more" in found.message
    assert _findings({"num_heads": 4}, plan) == []


def test_the_attribute_rule_reports_every_count() -> None:
    plan = {"a": {"tp_divide_attrs": ["num_heads", "gone", "flag", "skip"]}}
    values = {"num_heads": 3, "gone": MISSING, "flag": True, "skip": None}
    found = divide_attr_findings(entries_from_json(plan), 2, lambda fqn, attr: values[attr],
                                 "runtime")
    assert [(f.code, f.where) for f in found] == [
        ("runtime.indivisible_attr", "a.num_heads"), ("runtime.missing_attr", "a.gone"),
        ("runtime.indivisible_attr", "a.flag")]
    assert found[0].expected == "a multiple of 2"


def test_the_rule_is_pure() -> None:
    code = ("import sys, hpcodegen.plan.tp_divisible; "
            "print([m for m in ('torch', 'transformers') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=300).stdout
    assert out.strip() == "[]"
