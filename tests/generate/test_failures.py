"""Every way generation refuses a plan: a message naming the culprit and exit code 1 (2 for
unreadable input), through the real CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hpcodegen.cli.app import app, register_verbs
from typer.testing import CliRunner

from hpcodegen.errors import PlanError
from hpcodegen.generate.sources.hf_plan import expand_rules

pytestmark = pytest.mark.slow
register_verbs()


def invoke(*args: str):
    result = CliRunner().invoke(app, ["generate", *args])
    return result.exit_code, result.output + (result.stderr if result.stderr_bytes else "")


def test_indivisible_heads_names_config_fields(tmp_path: Path, make_config) -> None:
    model = make_config(tmp_path / "m", "llama", num_attention_heads=6, num_key_value_heads=3,
                         head_dim=16, hidden_size=96)
    code, out = invoke("--model", str(model), "--tp", "4", "-o", str(tmp_path / "out"))
    assert code == 1
    assert "num_attention_heads = 6 is not divisible by tp_size = 4" in out
    assert "num_key_value_heads = 3 is not divisible by tp_size = 4" in out
    assert not (tmp_path / "out").exists()


def test_divisibility_is_verify_rule_and_refuses_its_warnings_too() -> None:
    """generate refuses what verify's model check reports: heads (errors), and the sharded
    dims verify only warns about (an uneven MLP or vocab is never emitted), text_config too."""
    from hpcodegen.generate.checks.validate import check_divisible
    from hpcodegen.plan.tp_divisible import tp_divisibility

    config = {"vocab_size": 255, "text_config": {"num_attention_heads": 6,
                                                 "intermediate_size": 128}}
    assert {(f.code, f.severity.value) for f in tp_divisibility(config, 4, "model")} == {
        ("model.heads_not_divisible", "error"), ("model.uneven_dim", "warning")}
    with pytest.raises(PlanError) as exc:
        check_divisible(config, 4)
    assert {(f.where, f.severity.value) for f in exc.value.findings} == {
        ("/text_config/num_attention_heads", "error"), ("/vocab_size", "error")}
    check_divisible(config, 1)  # everything divides 1


def test_unsupported_style_names_the_rule(tmp_path: Path) -> None:
    fqns = ["", "model", "model.layers.0.mlp", "model.layers.0.mlp.up_proj"]
    with pytest.raises(PlanError) as info:
        expand_rules([("model.layers.*.mlp", "moe_identity_expert")], fqns)
    assert ("HF plan rule 'model.layers.*.mlp': style 'moe_identity_expert' "
            "is not supported") in str(info.value)


def test_unsupported_style_and_no_match_unit() -> None:
    fqns = ["", "model", "model.layers.0.mlp", "model.layers.0.mlp.up_proj"]
    with pytest.raises(PlanError) as info:
        expand_rules([("model.layers.*.mlp.up_proj", "mystery"),
                      ("model.layers.*.nope.up_proj", "colwise")], fqns)
    codes = [f.code for f in info.value.findings]
    assert codes == ["generate.unsupported_style", "generate.rule_no_match"]
    assert info.value.exit_code == 1
    assert "'model.layers.*.nope.up_proj' (colwise) matches no module" in str(info.value)
    # a rule for another variant of an existing layer (HF's dense-layer rules next to the
    # experts) is skipped, as transformers does
    assert expand_rules([("model.layers.*.mlp.gate_proj", "colwise")], fqns) == {}
    # a recipe covering the module wins over the unsupported HF style
    got = expand_rules([("model.layers.*.mlp.up_proj", "mystery")], fqns,
                       overridden={"model.layers.0.mlp.up_proj"})
    assert got == {}


def test_recipe_rule_matching_nothing(tmp_path: Path, llama_dir: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text("- match: model.layers.*.mlp\n  is_boundary: true\n"
                      "- match: [model.nothing.*, model.other]\n  is_boundary: false\n")
    code, out = invoke("--model", str(llama_dir), "--tp", "2", "--recipe", str(recipe),
                       "-o", str(tmp_path / "out"))
    assert code == 1
    assert ("/1/match: recipe rule 1 (match ['model.nothing.*', 'model.other']) "
            "matches no module") in out


def test_invalid_recipe_reports_json_pointers(tmp_path: Path, llama_dir: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text("- match: lm_head\n  params: {weight: {tp: 'Shard(0)'}}\n  bogus: 1\n")
    code, out = invoke("--model", str(llama_dir), "--tp", "2", "--recipe", str(recipe),
                       "-o", str(tmp_path / "out"))
    assert code == 1
    assert "::/0: Additional properties are not allowed ('bogus' was unexpected)" in out
    assert "::/0/params/weight/tp: 'Shard(0)' does not match" in out


@pytest.mark.parametrize("text", [None, "- match: [unclosed\n"])
def test_unreadable_recipe_exits_2(tmp_path: Path, llama_dir: Path, text: str | None) -> None:
    recipe = tmp_path / "r.yaml"
    if text is not None:
        recipe.write_text(text)
    code, out = invoke("--model", str(llama_dir), "--tp", "2", "--recipe", str(recipe),
                       "-o", str(tmp_path / "out"))
    assert code == 2
    assert "recipe" in out


def test_missing_model_dir_exits_2(tmp_path: Path) -> None:
    code, out = invoke("--model", str(tmp_path / "none"), "--tp", "2", "-o", str(tmp_path / "o"))
    assert code == 2
    assert "no HF config found" in out


def test_different_contracts_for_one_class_refused(tmp_path: Path, llama_dir: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text("- match: model.layers.0.mlp\n  out_dst: {output: {tp: 'S(1)'}}\n")
    code, out = invoke("--model", str(llama_dir), "--tp", "2", "--recipe", str(recipe),
                       "-o", str(tmp_path / "out"))
    assert code == 1
    assert ("class LlamaMLP: model.layers.1.mlp and model.layers.0.mlp "
            "declare different out_dst") in out


def test_uncovered_and_unknown_params_refused(tmp_path: Path, llama_dir: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text("- match: model.norm\n  params: {bias: {tp: R}}\n")
    code, out = invoke("--model", str(llama_dir), "--tp", "2", "--recipe", str(recipe),
                       "-o", str(tmp_path / "out"))
    assert code == 1
    assert "planned parameter 'model.norm.bias' does not exist in the model" in out


def test_config_problems_name_the_config_file(tmp_path: Path, make_config) -> None:
    """No architectures / an unknown model_type: one short line naming config.json."""
    noarch = make_config(tmp_path / "noarch", "llama")
    data = json.loads((noarch / "config.json").read_text())
    del data["architectures"]
    (noarch / "config.json").write_text(json.dumps(data))
    code, out = invoke("--model", str(noarch), "--tp", "2", "-o", str(tmp_path / "o1"))
    assert code == 1
    assert f"{noarch / 'config.json'}::/architectures: the HF config names no model class" in out
    bogus = make_config(tmp_path / "bogus", "llama", model_type="no_such_model")
    code, out = invoke("--model", str(bogus), "--tp", "2", "-o", str(tmp_path / "o2"))
    assert code == 1
    assert f"{bogus / 'config.json'}::/model_type: transformers cannot build" in out
    assert "Should contain one of" not in out  # not transformers' list of ~500 types
