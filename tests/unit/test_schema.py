"""schemas/codegen_meta.schema.json and the ``schema`` check."""

from __future__ import annotations

import copy
import json
import re
import sys
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
sys.path.append(str(FIXTURES))
import verify_fixtures as vf  # noqa: E402

from hpcodegen.checks.schema import meta_schema, schema_findings, schema_text  # noqa: E402
from hpcodegen.placement import PLACEMENT_PATTERN, parse_placement  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
METAS = {"llama_hp": vf.llama_meta(), "qwen3_moe_g3": vf.qwen3_moe_meta("g3"),
         "qwen3_moe_g2": vf.qwen3_moe_meta("g2")}


def test_schema_is_draft_2020_12_and_shipped_text_is_the_file() -> None:
    from jsonschema import Draft202012Validator

    schema = meta_schema()
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema_text() == (REPO / "schemas" / "codegen_meta.schema.json").read_text()


def test_placement_regex_is_the_grammar() -> None:
    assert meta_schema()["$defs"]["placement"]["pattern"] == PLACEMENT_PATTERN
    samples = ["R", "S(0)", "S(-1)", "SS(0,2)", "P(sum)", "P(bxor)", "", "Shard(0)", "S(x)",
               "SS(0)", "P()", "P", "S( 1)", "SS(0,0)", "P(foo)", "r", "S(1) "]
    for text in samples:
        try:
            parse_placement(text)
            ok = True
        except ValueError:
            ok = False
        assert bool(re.search(PLACEMENT_PATTERN, text)) == ok, text


@pytest.mark.parametrize("name", sorted(METAS))
def test_both_naming_generations_validate(name: str) -> None:
    assert schema_findings(METAS[name]) == []


def test_our_extra_keys_and_unknown_top_level_keys_validate() -> None:
    meta = copy.deepcopy(METAS["llama_hp"])
    assert meta["generator"]["name"] == "hpcodegen"
    assert meta["param_plan"]["model.norm"]["partial_grad_params"] == ["weight"]
    meta["some_future_field"] = {"anything": [1, 2]}
    assert schema_findings(meta) == []
    del meta["generator"]["name"]
    assert [(f.code, f.where) for f in schema_findings(meta)] == [
        ("schema.required", "/generator/name")]


def test_match_string_or_list_and_target_dicts() -> None:
    meta = copy.deepcopy(METAS["qwen3_moe_g3"])
    assert isinstance(meta["injections"][0]["match"], list)
    assert schema_findings(METAS["qwen3_moe_g2"]) == []  # string match
    meta["injections"][1]["local_compute_fn"] = {"use_grouped_gemm": True}
    assert [(f.code, f.where) for f in schema_findings(meta)] == [
        ("schema.required", "/injections/1/local_compute_fn/_target_")]


def test_every_violation_is_reported_at_once_with_its_pointer() -> None:
    meta = copy.deepcopy(METAS["llama_hp"])
    meta["param_plan"]["lm_head"]["in_src"]["input"]["tp"] = "S(1"
    meta["param_plan"]["lm_head"]["is_boundary"] = "yes"
    meta["tied_pairs"] = [["a"]]
    meta["mesh_dim_names"] = ["tp", "tp"]
    del meta["yaml_path"]
    found = {(f.code, f.where) for f in schema_findings(meta)}
    assert found == {
        ("schema.pattern", "/param_plan/lm_head/in_src/input/tp"),
        ("schema.type", "/param_plan/lm_head/is_boundary"),
        ("schema.minItems", "/tied_pairs/0"),
        ("schema.uniqueItems", "/mesh_dim_names"),
        ("schema.required", "/yaml_path"),
    }


def test_uniform_arrays_and_map_keys_report_every_bad_item_at_its_index() -> None:
    # distinct items are validated once each (a resolved $ref, not one lookup per item):
    # a repeated bad item is still reported at every index, the array's own keywords on
    # the whole array
    meta = copy.deepcopy(METAS["llama_hp"])
    meta["frozen_sharded_params"] = ["lm_head.weight", "bad name", 3, "bad name"]
    meta["external_state_classes"] = ["Ok", "1x"]
    meta["boundary_classes"] = {"bad key!": "Llama", "model.norm": "LlamaRMSNorm"}
    found = {(f.code, f.where) for f in schema_findings(meta)}
    assert found == {
        ("schema.pattern", "/frozen_sharded_params/1"),
        ("schema.type", "/frozen_sharded_params/2"),
        ("schema.pattern", "/frozen_sharded_params/3"),
        ("schema.uniqueItems", "/frozen_sharded_params"),
        ("schema.pattern", "/external_state_classes/1"),
        ("schema.pattern", "/boundary_classes"),
    }


def test_placement_message_says_what_is_expected() -> None:
    meta = copy.deepcopy(METAS["llama_hp"])
    meta["param_plan"]["lm_head"]["params"]["weight"]["tp"] = "Shard(0)"
    (f,) = schema_findings(meta)
    assert f.message == '"Shard(0)" is not a placement'
    assert f.expected == "one of R, S(n), SS(d,f), P(op) without spaces"


def test_duplicate_keys_are_schema_errors(tmp_path: Path) -> None:
    art = vf.build_fixture("qwen3_moe_g2", tmp_path / "a")
    text = (art / "codegen_meta.json").read_text()
    (art / "codegen_meta.json").write_text(text.replace('"signature":', '"signature": "x",\n'
                                                        '  "signature":', 1))
    result = vf.run_check("schema", art)
    assert result.status == "fail"
    assert vf.codes(result) == {("schema.duplicate_key", "/signature")}


def test_schema_check_on_a_non_object_value_never_crashes() -> None:
    result = vf.run_check("schema", {"param_plan": [], "outputs": "x", "injections": {}})
    assert result.status == "fail"
    assert ("schema.type", "/param_plan") in vf.codes(result)
    assert json.dumps([f.to_json() for f in result.findings])
