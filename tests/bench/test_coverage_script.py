"""bench/coverage.py's accounting (:mod:`hpcodegen.families`): which table a family lands
in, what the last line counts, and the tiny configs it measures.

The split between dense decoders and encoder / encoder-decoder families comes from
transformers' own auto mappings; a row's status comes from one rule (``classify_row``).
"""

from __future__ import annotations

import pytest

from hpcodegen.families.catalog import family_kind
from hpcodegen.families.cp import cp_cell, cp_reason
from hpcodegen.families.probe import default_build_error
from hpcodegen.families.report import classify_row, render
from hpcodegen.families.tiny import tiny_config


@pytest.mark.parametrize(("family", "kind"), [
    ("llama", "decoder"), ("gpt2", "decoder"), ("bert", "encoder"), ("roberta", "encoder"),
    ("bart", "seq2seq"), ("whisper", "seq2seq"), ("marian", "seq2seq")])
def test_family_kind_follows_transformers_mappings(family: str,
                                                  kind: str) -> None:
    assert family_kind(family) == kind


def _row(family: str, *, moe: bool = False, split: bool = True, parity: bool = True,
         tp2: bool = True) -> dict:
    row: dict = {"family": family, "moe": moe, "hf_plan": True}
    row["tp2"] = {"ok": True, "split": split, "dir": "x"} if tp2 else \
        {"ok": False, "stage": "generate", "reason": "no rule for X"}
    row["parity"] = {"tp2": {"ok": parity, "logits": 1e-7, "grad": 2e-7 if parity else 1.0,
                             "worst": "w", "odd": [], "error": None}}
    return row


def test_last_line_counts_dense_decoders_and_moe_only() -> None:
    rows = [_row("llama"), _row("gpt2", parity=False), _row("tiny_no_rules", split=False),
            _row("qwen2", tp2=False), _row("bert"), _row("mixtral", moe=True),
            _row("qwen3_moe", moe=True, parity=False)]
    text = render(rows, "x", 0.0)
    lines = text.strip().splitlines()
    assert lines[-1] == "coverage: dense_ok=1/4 moe_ok=1/2"
    assert "encoder and encoder-decoder families: ok=1/1 replicated=0" in lines
    assert "| qwen2 | hf | fail (generate) |" in text and "no rule for X" in text
    assert "| tiny_no_rules | hf | replicated |" in text
    assert "tp2 parity: logits diff 1.0e-07, grad diff 1.0e+00 at w" in text


def _total(config: dict) -> int:
    """The largest width anywhere in a config dict, sub-configs included."""
    best = 0
    for key, value in config.items():
        if isinstance(value, dict):
            best = max(best, _total(value))
        elif isinstance(value, int) and not isinstance(value, bool) and (
                "hidden_size" in key or "vocab" in key):
            best = max(best, value)
    return best


@pytest.mark.parametrize(("family", "cls"), [
    ("fuyu", "FuyuForCausalLM"), ("blt", "BltForCausalLM")])
def test_tiny_config_shrinks_every_sub_config(family: str, cls: str) -> None:
    # Fuyu's Persimmon text model and BLT's patcher/encoder/decoder/global sub-configs (and
    # its hashed byte-group vocabulary) left at their defaults built billions of parameters
    assert _total(tiny_config(family, cls)) <= 256


def test_tiny_config_keeps_adapter_widths_equal_to_the_text_width() -> None:
    config = tiny_config("dots3_note", "Dots3NoteForCausalLM")
    text = config["text_config"]["hidden_size"]
    assert config["vision_config"]["adapter_out_dim"] == text == 64
    assert config["vision_config"]["adapter_in_dim"] == config["vision_config"]["hidden_size"]


def test_tiny_config_restores_a_default_the_config_class_insists_on() -> None:
    # ZAYA refuses any num_experts_per_tok but 1: the shrunk 2 goes back to the default
    assert tiny_config("zaya", "ZayaForCausalLM")["num_experts_per_tok"] == 1


def test_a_float32_miss_matched_in_float64_is_rounding_not_failure() -> None:
    rounding = _row("ssmx", parity=False)
    rounding["parity"]["tp2"]["exact64"] = {"ok": True, "logits": 2e-15, "grad": 0.0}
    wrong = _row("gptx", parity=False)
    wrong["parity"]["tp2"]["exact64"] = {"ok": False, "logits": 1.3, "grad": 0.2}
    text = render([rounding, wrong], "x", 0.0)
    assert text.strip().splitlines()[-1] == "coverage: dense_ok=1/2 moe_ok=0/0"
    assert "| ssmx | hf | ok | - | - | ok in fp64 (2e-15) |" in text
    assert "in float64 the sharded model matches" in text
    assert "| gptx | hf | ok | - | - | FAIL |" in text


def test_a_model_transformers_own_defaults_cannot_build_is_said_plainly() -> None:
    why = default_build_error("cohere_compass_text", "CohereCompassForCausalLM")
    assert why and why.startswith("transformers' default CohereCompassTextConfig cannot build")
    assert default_build_error("llama", "LlamaForCausalLM") is None
    with pytest.raises(ValueError, match="transformers' default Gemma4AssistantConfig is invalid"):
        tiny_config("gemma4_assistant", "Gemma4AssistantForCausalLM")


def test_tiny_config_gives_rope_by_layer_type_only_where_the_model_reads_it() -> None:
    # Cohere Compass reads rope_parameters[layer_type]; its default config carries none
    config = tiny_config("cohere_compass_text", "CohereCompassForCausalLM")
    assert config["rope_parameters"] == {
        "full_attention": {"rope_type": "default", "rope_theta": 10000.0}}
    # Gemma 3 has layer types too, but a RoPE of its own: left as transformers makes it
    gemma3 = tiny_config("gemma3_text", "Gemma3ForCausalLM")
    assert gemma3["rope_parameters"]["full_attention"]["rope_theta"] == 1_000_000.0


def test_tiny_config_expert_groups_divide_the_shrunk_expert_count() -> None:
    config = tiny_config("deepseek_v3", "DeepseekV3ForCausalLM")
    assert config["n_routed_experts"] % config["n_group"] == 0
    assert config["topk_group"] <= config["n_group"]


def test_a_row_without_a_parity_run_says_so() -> None:
    """--no-parity leaves no parity result: the row says it was not run (it used to crash
    formatting the missing diffs)."""
    row = _row("llama", parity=False)
    row["parity"] = {}
    assert classify_row(row) == ("unsupported", "tp2 parity: not run (--no-parity)")


def test_the_cp2_column_says_ok_refused_or_why() -> None:
    ok = {"family": "llama", "kind": "decoder", "cp2": {"ok": True},
          "parity": {"cp2": {"ok": True, "logits": 2e-7, "grad": 3e-8}}}
    refused = {"family": "mamba", "kind": "decoder",
               "cp2": {"ok": False, "stage": "generate", "reason": "x: --cp: mixes tokens"}}
    wrong = {"family": "opt", "kind": "decoder", "cp2": {"ok": True},
             "parity": {"cp2": {"ok": False, "logits": 0.4, "grad": 0.1, "worst": "w"}}}
    assert [cp_cell(r) for r in (ok, refused, wrong)] == ["ok (2e-07)", "refused", "FAIL"]
    assert cp_reason(ok) == "" and "mixes tokens" in cp_reason(refused)
    text = render([ok, refused, wrong], "5", 1.0)
    assert "cp2: dense ok=1/3 refused=1, moe ok=0/0 refused=0" in text
    assert text.rstrip().splitlines()[-1].startswith("coverage: dense_ok=")


def test_reasons_name_paths_from_the_work_dir_not_the_temporary_one(tmp_path) -> None:
    """A refusal naming the family's config reads the same whatever directory the run had:
    the path from the work dir, on one line (no folding at a terminal width)."""
    from hpcodegen.families.probe import _cli, _reason

    config = tmp_path / "some_family_with_a_long_name" / "config"
    config.mkdir(parents=True)
    (config / "config.json").write_text('{"model_type": "llama", "hidden_size": ')
    code, text = _cli(["generate", "--model", str(config), "--tp", "2",
                       "-o", str(tmp_path / "out")])
    assert code == 2
    reason = _reason(text, tmp_path)
    assert str(tmp_path) not in reason
    assert "some_family_with_a_long_name/config/config.json" in reason
    assert str(tmp_path) in _reason(text)  # without a work dir nothing is rewritten


def test_a_partial_run_replaces_only_the_families_it_measured() -> None:
    from hpcodegen.families.report import merged_rows

    kept = [_row("llama"), _row("opt", split=False), _row("gpt2")]
    fresh = [_row("opt"), _row("newfam")]
    rows = merged_rows(kept, fresh)
    assert [r["family"] for r in rows] == ["llama", "opt", "gpt2", "newfam"]
    assert rows[1] is fresh[0] and rows[0] is kept[0]
    assert classify_row(rows[1])[0] == "ok" and classify_row(kept[1])[0] != "ok"


def test_the_rules_column_says_where_the_plan_came_from() -> None:
    from hpcodegen.families.report import rules_cell

    seeded = _row("stablelm")
    seeded.update(hf_plan=False)
    seeded["tp2"]["seeded"] = True
    bare = _row("stablelm")
    bare.update(hf_plan=False)
    packaged = _row("stablelm")
    packaged["tp2"]["package"] = True
    assert [rules_cell(r) for r in (seeded, bare, packaged, _row("llama"))] == \
        ["seeds", "none", "pkg", "hf"]
