"""Which head counts must divide tp is read from the plan alone (the gate reads no rule file).

Multi-query plans keep their one k/v head whole without an exemption list: GPTBigCode's
c_attn is gathered by its own boundary, and RecurrentGemma's plan splits only its recurrent
and MLP blocks. A plan that splits an attention's projections still needs divisible heads.
"""

from __future__ import annotations

from hpcodegen.plan.codec import entries_from_json
from hpcodegen.plan.tp_divisible import split_head_kinds, tp_divisibility

GATHERED_QKV = {"params": {"c_attn.weight": {"tp": "S(0)"}},
                "out_src": {"output": {"tp": "S(-1)"}}, "out_dst": {"output": {"tp": "R"}}}
RECURRENT = {"params": {"linear_x.weight": {"tp": "S(0)"}, "linear_out.weight": {"tp": "S(1)"}}}
SPLIT_ATTN = {"params": {"q_proj.weight": {"tp": "S(0)"}, "k_proj.weight": {"tp": "S(0)"}}}
UNKNOWN_ATTN = {"params": {"wq.weight": {"tp": "S(0)"}}}


def _codes(config: dict, plan: dict) -> list[str]:
    return [f.where for f in tp_divisibility(config, 2, "model", plan=entries_from_json(plan))
            if f.code == "model.heads_not_divisible"]


def test_a_gathered_fused_projection_splits_no_head() -> None:
    plan = {"transformer.h.0.attn": GATHERED_QKV}
    assert split_head_kinds(entries_from_json(plan)) == (False, False)
    assert _codes({"n_head": 3, "num_key_value_heads": 1}, plan) == []


def test_recurrent_blocks_alone_keep_the_shared_kv_head_whole() -> None:
    plan = {"model.layers.0.temporal_block": RECURRENT}
    assert split_head_kinds(entries_from_json(plan)) == (True, False)
    assert _codes({"num_attention_heads": 4, "num_key_value_heads": 1}, plan) == []
    # the query heads (which the RG-LRU divides too) are still checked
    assert _codes({"num_attention_heads": 3, "num_key_value_heads": 1}, plan) == [
        "/num_attention_heads"]


def test_a_split_attention_needs_divisible_heads() -> None:
    plan = {"model.layers.0.self_attn": SPLIT_ATTN}
    assert split_head_kinds(entries_from_json(plan)) == (True, True)
    assert _codes({"num_attention_heads": 4, "num_key_value_heads": 1}, plan) == [
        "/num_key_value_heads"]
    # unknown projection names under an attention module: both counts still checked
    unknown = {"model.layers.0.self_attn": UNKNOWN_ATTN}
    assert split_head_kinds(entries_from_json(unknown)) == (True, True)
    assert _codes({"num_attention_heads": 4, "num_key_value_heads": 1}, unknown) == [
        "/num_key_value_heads"]
