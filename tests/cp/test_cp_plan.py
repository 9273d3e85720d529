"""The cp axis in the plan (pure): layouts, the K/V transition, verify's cp rules, the schema,
the registry names of the existing system, and no torch import on the way."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest
from cp_paths import REPO

from hpcodegen.checks.cp import check_cp
from hpcodegen.placement import REPLICATE, Shard
from hpcodegen.plan.codec import injection_from_json, plan_from_meta, readable_plan
from hpcodegen.plan.cp import (
    causal_work,
    cp_layout,
    gathered_order,
    kv_backward_steps,
    kv_forward_steps,
    kv_transitions,
    plan_cp_attention,
    rank_positions,
    rank_ranges,
)

EXAMPLE = REPO / "examples" / "llama_cp2_tp2_sp"
REFERENCE = REPO / "tests" / "fixtures" / "artifacts"


def _meta() -> dict:
    return json.loads((EXAMPLE / "codegen_meta.json").read_text())


def _codes(meta: dict) -> set[tuple[str, str, str]]:
    return {(f.code, f.severity.value, f.where) for f in check_cp(readable_plan(meta)[0])}


@pytest.mark.parametrize("layout,cp,want", [
    ("contiguous", 2, [[(0, 8)], [(8, 16)]]),
    ("headtail", 2, [[(0, 4), (12, 16)], [(4, 8), (8, 12)]]),
    ("headtail", 4, [[(0, 2), (14, 16)], [(2, 4), (12, 14)], [(4, 6), (10, 12)],
                     [(6, 8), (8, 10)]]),
])
def test_rank_ranges(layout: str, cp: int, want: list) -> None:
    assert [rank_ranges(16, cp, r, layout) for r in range(cp)] == want
    order = gathered_order(16, cp, layout)
    assert sorted(order) == list(range(16))  # every position once
    assert order[:len(rank_positions(16, cp, 0, layout))] == rank_positions(16, cp, 0, layout)


def test_rank_ranges_refuse_what_does_not_divide() -> None:
    with pytest.raises(ValueError, match="does not divide into 4 chunks"):
        rank_ranges(10, 2, 0, "headtail")
    with pytest.raises(ValueError, match="unknown cp layout"):
        rank_ranges(8, 2, 0, "zigzag")


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_headtail_balances_causal_work_contiguous_does_not(cp: int) -> None:
    for seq in (64 * cp, 4096):
        work = causal_work(seq, cp, "headtail")
        assert max(work) / (sum(work) / cp) <= 1.05
    work = causal_work(4096, cp, "contiguous")
    assert max(work) / (sum(work) / cp) >= 1.3


def test_kv_transition_declared_and_inferred() -> None:
    plan = plan_from_meta(_meta())
    records = plan.injections_by_fqn()
    declared = kv_transitions(records[plan_cp_attention(plan)[0]])
    assert [(t.name, t.src, t.dst, t.declared) for t in declared] == [
        ("key", Shard(2), REPLICATE, True), ("value", Shard(2), REPLICATE, True)]
    assert [str(s) for s in kv_forward_steps(declared[0])] == ["all_gather(dim=2)"]
    assert [str(s) for s in kv_backward_steps(declared[0])] == ["reduce_scatter(dim=2)"]
    # the existing system's metas name its wrapper and declare nothing: the same transition
    foreign = json.loads((REFERENCE / "qwen3_moe_g3" / "codegen_meta.json").read_text())
    foreign_plan = plan_from_meta(foreign)
    records = foreign_plan.injections_by_fqn()
    inferred = [kv_transitions(records[f]) for f in plan_cp_attention(foreign_plan)]
    assert inferred and all([t.name for t in ts] == ["key", "value"] and not ts[0].declared
                            for ts in inferred)
    other = injection_from_json({"match": "m", "inner_wrapper": "someone_elses_wrapper"})
    assert kv_transitions(other) == () and kv_transitions(None) == ()
    assert cp_layout(plan) == "headtail" and cp_layout(foreign_plan) == "contiguous"


def test_cp_rules_pass_on_generated_and_reference_metas() -> None:
    assert not [c for c in _codes(_meta()) if c[1] == "error"]
    for name in ("qwen3_moe_g2", "qwen3_moe_g3", "qwen3_moe_bundle_g2"):
        meta = json.loads((REFERENCE / name / "codegen_meta.json").read_text())
        assert not [c for c in _codes(meta) if c[1] == "error"], name


def test_a_boundary_moving_the_sequence_over_cp_is_an_error() -> None:
    meta = _meta()
    meta["param_plan"]["model.norm"]["out_dst"]["output"]["cp"] = "R"
    assert ("plan.cp_moves_sequence", "error",
            "/param_plan/model.norm/out_dst/output") in _codes(meta)


def test_a_parameter_sharded_over_cp_is_an_error() -> None:
    meta = _meta()
    meta["param_plan"]["model.norm"]["params"]["weight"]["cp"] = "S(0)"
    assert ("plan.cp_param", "error", "/param_plan/model.norm/params/weight/cp") in _codes(meta)


def test_attention_without_the_kv_gather_is_an_error() -> None:
    meta = _meta()
    meta["injections"] = []
    assert "plan.cp_no_attention" in {c for c, _, _ in _codes(meta)}
    meta = _meta()
    meta["injections"][0]["match"] = ["model.layers.0.self_attn"]
    assert ("plan.cp_unwrapped_attention", "error",
            "/param_plan/model.layers.1.self_attn") in _codes(meta)


@pytest.mark.parametrize("edit,needle", [
    (lambda r: r["inner_in_src"]["key"].update(cp="S(1)"), "S(1) -> R"),
    (lambda r: r["inner_in_dst"].pop("value"), "inner_in_dst names"),
    (lambda r: r["inner_in_src"]["key"].update(tp="S(0)"), "names axes ['tp']"),
    (lambda r: r.pop("inner_wrapper"), "without an inner_wrapper"),
])
def test_bad_kv_declarations_are_errors(edit, needle: str) -> None:
    meta = _meta()
    edit(meta["injections"][0])
    found = [f for f in check_cp(readable_plan(meta)[0]) if f.code == "plan.cp_kv"]
    assert found and any(needle in f.message for f in found), [f.message for f in found]


def test_a_layout_without_cp_is_a_warning() -> None:
    meta = _meta()
    meta["parallel_dims"]["cp_size"] = 1
    assert _codes(meta) == {("plan.cp_layout_unused", "warning", "/parallel_dims/cp_layout")}


def test_schema_takes_the_new_fields_and_still_every_reference_meta() -> None:
    from hpcodegen.checks.schema import schema_findings

    assert not schema_findings(_meta())
    for directory in sorted(REFERENCE.iterdir()):
        meta = json.loads((directory / "codegen_meta.json").read_text())
        assert not [f for f in schema_findings(meta) if f.severity.value == "error"], directory
    bad = copy.deepcopy(_meta())
    bad["parallel_dims"]["cp_layout"] = "zigzag"
    assert [f.where for f in schema_findings(bad)] == ["/parallel_dims/cp_layout"]


def test_the_existing_systems_names_resolve_to_ours_without_importing_it() -> None:
    from hpcodegen.targets import resolve_injections, target_spec

    for name in ("sdpa_qkv", "sdpa_hf", "hyper_parallel.codegen.inner.sdpa_qkv",
                 "hyper_parallel.codegen.inner.sdpa_hf"):
        assert target_spec(name).startswith("hpcodegen.runtime.cp.wrappers:"), name
    assert target_spec("hyper_parallel.codegen.inner.flex_qkv") is None  # another algorithm
    foreign = json.loads((REFERENCE / "qwen3_moe_g3" / "codegen_meta.json").read_text())
    foreign["injections"] = [r for r in foreign["injections"] if "inner_wrapper" in r]
    resolved = resolve_injections(plan_from_meta(foreign))
    assert {f.__name__ for t in resolved.values() for f, _ in t.values()} == {"sdpa_qkv"}
    assert "hyper_parallel" not in sys.modules


def test_verify_and_inspect_of_a_cp_artifact_import_no_torch() -> None:
    code = ("import sys; from hpcodegen.verify import run_verify; "
            "from hpcodegen.inspect.run import inspect_meta; "
            "from hpcodegen.plan.predict import predict_plan; import json, pathlib; "
            "from hpcodegen.plan.codec import plan_from_meta; "
            f"m = json.loads(pathlib.Path({str(EXAMPLE / 'codegen_meta.json')!r}).read_text()); "
            "predict_plan(plan_from_meta(m)); from hpcodegen.checks.cp import check_cp; "
            "list(check_cp(plan_from_meta(m))); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, cwd=REPO)
    assert out.stdout.strip() == "False", out.stderr
