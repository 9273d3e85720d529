"""Ulysses and the hybrid in the plan: the bytes rule, the heads rule, verify's rules on
the method and the heads (pure), generate's choice (``--cp-method``, ``auto`` with its
reason, refusals naming the heads), inspect-plan's all_to_alls and their bytes."""

from __future__ import annotations

import copy
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from cp_paths import CONFIGS, REPO

sys.path.insert(0, str(REPO / "tests" / "cli"))
import inproc  # the CLI's own main in this process (tests/cli/inproc.py)

from hpcodegen.checks.cp import check_cp
from hpcodegen.errors import PlanError, UsageError
from hpcodegen.plan.codec import injection_from_json, readable_plan
from hpcodegen.plan.cp import (
    heads_problem,
    kv_replicas,
    kv_transitions,
    layer_bytes,
    query_order,
    rank_positions,
    ulysses_degree,
)


def _bundle(config: dict, **kwargs) -> dict:
    from artifact_memo import build_bundle  # one build per distinct arguments and run

    rendered = build_bundle(config, kwargs.pop("tp", 1), kwargs.pop("sp", False), None,
                            "cfg", **kwargs)
    return json.loads(rendered["codegen_meta.json"])


def _config(name: str = "llama_gqa", **edits) -> dict:
    from hpcodegen.hf import read_hf_config

    data, _ = read_hf_config(CONFIGS / name)
    return {**data, **edits}


@pytest.mark.parametrize(("q", "kv", "cp"), [(32, 8, 8), (32, 8, 2), (8, 8, 4), (64, 8, 8),
                                              (16, 4, 4)])
def test_the_bytes_rule(q: int, kv: int, cp: int) -> None:
    """Per rank, all-gather / Ulysses = cp / (g + 1) (kv heads dividing over cp)."""
    query, key = (1, q, 4096, 128), (1, kv, 4096, 128)
    ratio = layer_bytes("allgather", 1, query, key, 2, cp) / layer_bytes("ulysses", cp, query,
                                                                         key, 2, cp)
    assert ratio == pytest.approx(cp / (q // kv + 1))


def test_llama8b_at_cp8_ulysses_moves_five_eighths() -> None:
    query, key = (1, 32, 8192, 128), (1, 8, 8192, 128)
    assert layer_bytes("ulysses", 8, query, key, 2, 8) / \
        layer_bytes("allgather", 1, query, key, 2, 8) == pytest.approx(0.625)


def test_heads_rule_and_replicas() -> None:
    assert heads_problem(32, 8, 1, 8) is None and kv_replicas(8, 8) == 1
    assert heads_problem(8, 2, 2, 2) is None and kv_replicas(1, 2) == 2  # replicated
    assert "do not divide over 8 ranks" in heads_problem(12, 4, 2, 4)
    assert "3 kv heads per tp rank neither" in heads_problem(12, 3, 1, 4)  # neither way
    assert heads_problem(7, 7, 1, 1) is None                            # no Ulysses


def test_query_rows_are_the_ulysses_groups_tokens() -> None:
    assert query_order(16, 2, 1, "headtail", 2) == \
        rank_positions(16, 2, 0, "headtail") + rank_positions(16, 2, 1, "headtail")
    assert query_order(16, 4, 3, "contiguous", 2) == list(range(8, 16))
    assert query_order(16, 4, 3, "contiguous", 1) == rank_positions(16, 4, 3, "contiguous")


def test_the_existing_systems_ulysses_names_imply_the_exchange() -> None:
    """Its metas name ``sdpa_qkv_ulysses`` / ``sdpa_hf_hybrid`` without declaring
    transitions: the name implies them, so inspect-plan predicts them too."""
    from hpcodegen.targets import target_spec

    record = injection_from_json({"match": ["a"], "inner_wrapper": {
        "_target_": "hyper_parallel.codegen.inner.sdpa_qkv_ulysses"}}, ())
    assert [(t.name, t.axis, str(t.src), str(t.dst)) for t in kv_transitions(record)] == [
        ("query", "cp", "S(2)", "S(1)"), ("key", "cp", "S(2)", "S(1)"),
        ("value", "cp", "S(2)", "S(1)"), ("output", "cp", "S(2)", "S(1)")]
    assert ulysses_degree(record, 8) == 8
    hybrid = injection_from_json({"match": ["a"], "inner_wrapper": {
        "_target_": "sdpa_hf_hybrid", "ulysses_degree": 2}}, ())
    assert ulysses_degree(hybrid, 8) == 2
    for name in ("sdpa_hf_ulysses", "sdpa_qkv_ulysses", "sdpa_hf_hybrid",
                 "hyper_parallel.codegen.inner.sdpa_hf_ulysses"):
        assert target_spec(name).startswith("hpcodegen.runtime.cp.wrappers:"), name


@pytest.fixture(scope="module")
def ulysses_meta() -> dict:
    return _bundle(_config(), tp=2, cp=2, sp=True, cp_method="ulysses")


def test_generate_freezes_the_exchange_in_the_plans_vocabulary(ulysses_meta) -> None:
    records = [r for r in ulysses_meta["injections"] if "inner_in_src" in r]
    assert len(records) == 1
    record = records[0]
    assert record["inner_wrapper"] == {"_target_": "sdpa_hf_ulysses", "causal": True}
    assert record["inner_in_src"] == {n: {"cp": "S(2)"} for n in ("query", "key", "value")}
    assert record["inner_in_dst"] == {n: {"cp": "S(1)"} for n in ("query", "key", "value")}
    assert record["inner_out_src"] == {"output": {"cp": "S(2)"}}
    assert record["inner_out_dst"] == {"output": {"cp": "S(1)"}}
    assert record["cp_heads"] == {"query": 8, "key_value": 2}
    assert not [f for f in check_cp(readable_plan(ulysses_meta)[0])]


def _codes(meta: dict) -> set[str]:
    return {f.code for f in check_cp(readable_plan(meta)[0]) if f.severity.value == "error"}


def test_verify_checks_the_method_against_the_mesh_and_heads(ulysses_meta) -> None:
    meta = copy.deepcopy(ulysses_meta)
    meta["injections"][-1]["cp_heads"] = {"query": 12, "key_value": 3}
    found = [f for f in check_cp(readable_plan(meta)[0]) if f.code == "plan.cp_ulysses_heads"]
    assert found and "12 query heads" in found[0].message
    assert found[0].where.endswith("/cp_heads")

    meta = copy.deepcopy(ulysses_meta)
    meta["injections"][-1]["inner_in_dst"]["key"]["cp"] = "R"
    assert "plan.cp_kv" in _codes(meta)

    meta = copy.deepcopy(ulysses_meta)  # the hybrid's degree must divide cp, 1 < U < cp
    meta["injections"][-1]["inner_wrapper"] = {"_target_": "sdpa_hf_hybrid", "causal": True,
                                               "ulysses_degree": 2}
    assert "plan.cp_method" in _codes(meta)

    meta = copy.deepcopy(ulysses_meta)  # two methods on one mesh
    second = copy.deepcopy(meta["injections"][-1])
    meta["injections"][-1]["match"] = ["model.layers.0.self_attn"]
    second["match"] = ["model.layers.1.self_attn"]
    second["inner_wrapper"] = {"_target_": "sdpa_hf", "causal": True}
    for key in ("inner_out_src", "inner_out_dst", "cp_heads"):
        second.pop(key)
    second["inner_in_src"] = {n: {"cp": "S(2)"} for n in ("key", "value")}
    second["inner_in_dst"] = {n: {"cp": "R"} for n in ("key", "value")}
    meta["injections"].append(second)
    assert _codes(meta) == {"plan.cp_method"}


def test_verify_and_inspect_of_a_ulysses_meta_import_no_torch(ulysses_meta, tmp_path) -> None:
    path = tmp_path / "codegen_meta.json"
    path.write_text(json.dumps(ulysses_meta))
    code = ("import sys, json, pathlib; from hpcodegen.plan.predict import predict_plan; "
            "from hpcodegen.plan.codec import plan_from_meta; "
            "from hpcodegen.checks.cp import check_cp; "
            f"m = json.loads(pathlib.Path({str(path)!r}).read_text()); "
            "p = predict_plan(plan_from_meta(m)); list(check_cp(plan_from_meta(m))); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, cwd=REPO)
    assert out.stdout.strip() == "False", out.stderr


def test_auto_picks_by_predicted_bytes_and_says_why() -> None:
    notes: list[str] = []
    gqa = _bundle(_config(), cp=2, cp_method="auto", notes=notes)  # g=4, cp 2: 2/5
    assert {r["inner_wrapper"]["_target_"] for r in gqa["injections"]
            if "inner_wrapper" in r} == {"sdpa_hf"}
    assert any("--cp-method auto: all-gather" in n and "cp/(g+1) = 0.400" in n for n in notes)
    notes.clear()
    mha = _bundle(_config(num_key_value_heads=8), cp=4, cp_method="auto", notes=notes)
    assert {r["inner_wrapper"]["_target_"] for r in mha["injections"]
            if "inner_wrapper" in r} == {"sdpa_hf_ulysses"}  # g=1, cp 4: all-gather 2x
    assert any("--cp-method auto: Ulysses" in n for n in notes), notes


def test_heads_that_cannot_be_grouped_are_refused_naming_them() -> None:
    config = _config(num_attention_heads=12, num_key_value_heads=3, hidden_size=96)
    with pytest.raises(PlanError) as info:
        _bundle(config, cp=4, cp_method="ulysses")
    finding = info.value.findings[0]
    assert finding.code == "generate.cp_ulysses_heads"
    assert "3 kv heads" in finding.message and "12 query heads" in finding.message
    assert finding.where == "model.layers.0.self_attn"
    with pytest.raises(PlanError, match="over 16 ranks"):
        _bundle(_config(), tp=2, cp=8, cp_method="ulysses")
    notes: list[str] = []  # auto falls back and says why
    meta = _bundle(config, cp=4, cp_method="auto", notes=notes)
    assert "sdpa_hf" in {r["inner_wrapper"]["_target_"] for r in meta["injections"]
                         if "inner_wrapper" in r}
    assert any("not possible:" in n and "ulysses U=4: 12 query heads" in n for n in notes), notes


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"cp_method": "ring"}, "unknown method"),
    ({"cp_method": "hybrid"}, "--ulysses U"),
    ({"cp_method": "hybrid", "ulysses": 4}, "1 < U < cp"),
    ({"cp_method": "ulysses", "ulysses": 2}, "hybrid's Ulysses degree"),
    ({"cp_method": "ulysses", "cp": 1}, "needs --cp N"),
])
def test_usage_errors(kwargs: dict, needle: str) -> None:
    with pytest.raises(UsageError, match=needle.replace("(", r"\(")):
        _bundle(_config(), **{"cp": 4, **kwargs})


def test_cli_generates_verifies_and_inspects_the_all_to_alls(tmp_path: Path) -> None:
    from hpcodegen.inspect.options import InspectOptions
    from hpcodegen.inspect.run import run_inspect
    from hpcodegen.verify import run_verify

    out = tmp_path / "art"
    run = inproc.run("generate", "--model",
                     str(CONFIGS / "mistral_swa"), "--tp", "1", "--cp", "4",
                     "--cp-method", "hybrid", "--ulysses", "2", "-o", out)
    assert run.returncode == 0, run.stderr
    assert run_verify([out], hf_config=CONFIGS / "mistral_swa", stdout=io.StringIO()) == 0
    text = io.StringIO()
    code = run_inspect(InspectOptions(path=str(out), hf_config=str(CONFIGS / "mistral_swa"),
                                      batch=2, seq=64, dtype="fp32", as_json=True),
                       out=text, err=io.StringIO())
    assert code == 0
    doc = json.loads(text.getvalue())
    attention = [b for b in doc["boundaries"] if b["fqn"].endswith("self_attn")]
    assert attention and all(
        {(o["kind"], o["axis"]) for o in b["in_ops"] + b["out_ops"] if o["axis"]} ==
        {("all_to_all", "cp"), ("all_gather", "cp")} for b in attention)
    rows = {(c["direction"], c["kind"]): c for c in doc["volume"]["by_collective"]
            if c["axis"] == "cp" and (c["kind"], c["dim"]) != ("all_gather", 1)}
    # (all_gather dim 1: the batch's position ids, once per forward)
    # mistral_swa: 4 query / 2 kv heads of 16, 2 layers; batch 2, seq 64, fp32, cp 4, U 2:
    # each all_to_all sends half its local quarter; K/V go 2 kv heads -> 1 per Ulysses rank
    q = 2 * 4 * 64 * 16 * 4
    kv = 2 * 2 * 64 * 16 * 4
    a2a = 2 * 0.5 * (q + kv + kv + q) / 4
    assert rows[("forward", "all_to_all")]["count"] == 8
    assert rows[("forward", "all_to_all")]["bytes"] == pytest.approx(a2a)
    assert rows[("backward", "all_to_all")]["bytes"] == pytest.approx(a2a)
    # then K and V gathered over the 2 Ulysses groups: 1 kv head of 2 over tp*U / replicas
    gather = 2 * 2 * 0.5 * kv / 2
    assert rows[("forward", "all_gather")]["bytes"] == pytest.approx(gather)
    assert rows[("backward", "reduce_scatter")]["bytes"] == pytest.approx(gather)


def test_verify_with_the_config_checks_its_heads(ulysses_meta) -> None:
    """``verify --hf-config``: the frozen ``cp_heads`` are the config's, and a foreign
    Ulysses meta (no ``cp_heads``) gets the heads rule on the config's heads."""
    from hpcodegen.checks.cp import config_heads_findings

    config = _config()
    plan = readable_plan(ulysses_meta)[0]
    assert not list(config_heads_findings(plan, config))
    lied = {**config, "num_attention_heads": 16}
    assert {f.code for f in config_heads_findings(plan, lied)} == {"model.cp_heads"}
    foreign = copy.deepcopy(ulysses_meta)
    for record in foreign["injections"]:
        record.pop("cp_heads", None)
    bad = {**config, "num_attention_heads": 6, "num_key_value_heads": 6}  # 6 over tp2*cp2
    found = list(config_heads_findings(readable_plan(foreign)[0], bad))
    assert [f.code for f in found] == ["model.cp_ulysses_heads"]
    assert "6 query heads" in found[0].message
