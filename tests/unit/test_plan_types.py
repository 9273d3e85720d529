"""The typed Plan: JSON -> Plan -> JSON is byte-identical, placements are objects, nothing
unknown is lost, the derived views equal the dict helpers' reading, torch stays unloaded."""

from __future__ import annotations

import copy
import dataclasses
import json
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis_jsonschema import from_schema

from hpcodegen.checks.schema import meta_schema
from hpcodegen.placement import REPLICATE, Partial, Shard, StridedShard
from hpcodegen.plan import entry as dict_rules
from hpcodegen.plan.codec import PlanFormatError, plan_from_meta, plan_to_meta, render_meta
from hpcodegen.plan.frozen import FrozenMap
from hpcodegen.plan.types import Injection, Plan, PlanEntry, Target

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
sys.path.append(str(FIXTURES))
import verify_fixtures as vf  # noqa: E402

#: every meta the repository holds: the examples, the fixtures, the existing system's metas
METAS = sorted([*ROOT.glob("examples/*/codegen_meta.json"),
                *FIXTURES.glob("**/codegen_meta.json")])


def _load(path: Path) -> tuple[bytes, dict[str, Any]]:
    raw = path.read_bytes()
    return raw, json.loads(raw)


def test_the_repository_holds_both_generators_metas() -> None:
    names = {p.parent.name for p in METAS}
    assert {"llama_tp2", "qwen3_moe_g2", "qwen3_moe_bundle_g3", "moe_cp2_tp2"} <= names
    assert len(METAS) >= 17


@pytest.mark.parametrize("path", METAS, ids=lambda p: str(p.relative_to(ROOT)))
def test_round_trip_is_byte_identical(path: Path) -> None:
    raw, meta = _load(path)
    plan = plan_from_meta(meta)
    back = plan_to_meta(plan)
    assert back == meta
    # hpcodegen ends its file with a newline, the existing system does not: the one piece of
    # file layout a meta's JSON value does not carry
    assert render_meta(back, final_newline=raw.endswith(b"\n")) == raw


@pytest.mark.parametrize("name", sorted(vf.FIXTURES))
def test_round_trip_of_the_fixture_builders(name: str) -> None:
    meta = vf.FIXTURES[name][0]()
    assert plan_to_meta(plan_from_meta(meta)) == meta


def _local_schema() -> dict[str, Any]:
    return {k: v for k, v in meta_schema().items() if k != "$id"}


@pytest.mark.timeout(400)
@settings(deadline=None, derandomize=True, max_examples=10,  # regex-made names are slow
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.filter_too_much])
@given(from_schema(_local_schema()))
@pytest.mark.filterwarnings("ignore")
def test_every_schema_valid_meta_round_trips(meta: dict[str, Any]) -> None:
    # hypothesis-jsonschema reads draft 2020-12's prefixItems loosely (tied pairs of None):
    # keep what the schema itself accepts
    assume(jsonschema.Draft202012Validator(_local_schema()).is_valid(meta))
    assert plan_to_meta(plan_from_meta(meta)) == meta


def test_placements_are_objects() -> None:
    plan = plan_from_meta(_load(ROOT / "examples/llama_tp2_sp/codegen_meta.json")[1])
    head = plan.entries["lm_head"]
    assert head.params["weight"]["tp"] == Shard(0)
    attn = plan.entries["model.layers.0.self_attn"]
    (hidden,) = attn.transitions("in")[:1]
    assert (hidden.name, hidden.src["tp"], hidden.dst["tp"]) == ("hidden_states", Shard(1),
                                                                 REPLICATE)
    (out,) = attn.transitions("out")
    assert out.src["tp"] == Partial("sum") and out.dst["tp"] == Shard(1) and out.changes
    assert plan.axes == ("tp",) and plan.dims.size("tp") == 2
    assert plan.dims.sequence_parallel is True


def test_moe_plan_of_the_existing_system() -> None:
    plan = plan_from_meta(_load(FIXTURES / "artifacts/qwen3_moe_g3/codegen_meta.json")[1])
    assert plan.axes == ("cp", "tp")
    experts = [p for p in plan.parameters() if p.is_expert]
    assert experts and all(p.placements["ep"] == Shard(0) for p in experts)
    moe = plan.injections_by_fqn()["model.layers.1.mlp"]
    assert isinstance(moe.local_compute_fn, Target)
    assert moe.local_compute_fn.kwargs["use_grouped_gemm"] is True and moe.ep_size == 2
    attn = plan.injections_by_fqn()["model.layers.0.self_attn"]
    assert attn.inner_target == "self" and attn.fqns == ("model.layers.0.self_attn",
                                                         "model.layers.1.self_attn")
    assert plan.provenance.source.architecture == "Qwen3MoeForCausalLM"
    assert plan.provenance.generator_name is None  # a foreign meta
    assert plan.entrypoints["parallelize"] == "hp_parallelize"


def test_unknown_keys_and_nulls_are_kept() -> None:
    meta = copy.deepcopy(vf.FIXTURES["llama_hp"][0]())
    meta["other_generator"] = {"nested": [1, {"x": None}]}
    meta["model_class"] = None
    meta["parallel_dims"]["zz_flag"] = "on"
    meta["source"]["architecture"] = None
    meta["source"]["weird"] = [1.5]
    meta["outputs"] = {"modeling": {"sha256": "0" * 64, "lines": 3, "note": "kept"}}
    first = next(iter(meta["param_plan"]))
    meta["param_plan"][first]["future_key"] = {"a": 1}
    meta["injections"] = [{"match": first, "inner_wrapper": {"_target_": "x.y", "k": [1]},
                           "since": 3}]
    plan = plan_from_meta(meta)
    assert plan.extra["other_generator"] == FrozenMap({"nested": (1, FrozenMap({"x": None}))})
    assert plan.provenance.model_class is None and "model_class" in plan.extra
    assert plan.provenance.source.architecture is None
    assert plan.entries[first].extra["future_key"] == {"a": 1}
    assert plan.injections[0].extra["since"] == 3
    assert plan.injections[0].inner_wrapper == Target(path="x.y", kwargs=FrozenMap({"k": (1,)}))
    assert plan_to_meta(plan) == meta


def test_absent_and_empty_differ() -> None:
    entry = {"params": {}}
    plan = plan_from_meta({"param_plan": {"a": entry, "b": {}}})
    assert plan.entries["a"].params == {} and plan.entries["b"].params is None
    assert plan_to_meta(plan) == {"param_plan": {"a": {"params": {}}, "b": {}}}


def test_plan_is_frozen_hashable_and_picklable() -> None:
    plan = plan_from_meta(_load(ROOT / "examples/qwen3_tp2_sp/codegen_meta.json")[1])
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.mesh_dim_names = ("dp",)  # type: ignore[misc]
    with pytest.raises(TypeError):
        plan.entries["lm_head"] = None  # type: ignore[index]
    assert hash(plan) == hash(plan_from_meta(plan_to_meta(plan)))
    assert pickle.loads(pickle.dumps(plan)) == plan


@pytest.mark.parametrize("mutate, where", [
    (lambda m: m["param_plan"]["lm_head"]["params"]["weight"].update(tp="S(x)"),
     "/param_plan/lm_head/params/weight/tp"),
    (lambda m: m["param_plan"]["lm_head"].update(out_names="output"),
     "/param_plan/lm_head/out_names"),
    (lambda m: m.update(tied_pairs=[["a", "b", "c"]]), "/tied_pairs/0"),
    (lambda m: m.update(injections=[{"match": "x", "local_compute_fn": {"f": 1}}]),
     "/injections/0/local_compute_fn/_target_"),
    (lambda m: m["param_plan"].update({"a/b": {"is_boundary": 1}}), "/param_plan/a~1b/is_boundary"),
])
def test_a_malformed_known_key_names_its_pointer(mutate: Any, where: str) -> None:
    meta = copy.deepcopy(vf.FIXTURES["llama_hp"][0]())
    mutate(meta)
    with pytest.raises(PlanFormatError) as info:
        plan_from_meta(meta)
    assert info.value.where == where


def test_strided_shards_and_partials_parse() -> None:
    plan = plan_from_meta({"param_plan": {"e": {"params": {"w": {"tp": "SS(0,2)"}},
                                                "out_src": {"o": {"tp": "P(max)"}}}}})
    entry = plan.entries["e"]
    assert entry.params["w"]["tp"] == StridedShard(0, 2)
    assert entry.splits_compute() and entry.boundary


@pytest.mark.parametrize("path", METAS, ids=lambda p: str(p.relative_to(ROOT)))
def test_derived_views_read_like_the_dict_helpers(path: Path) -> None:
    """The typed ``passes_through`` agrees with the contract rule's JSON reader
    (:mod:`hpcodegen.plan.entry`) on every meta the repository holds."""
    meta = _load(path)[1]
    plan = plan_from_meta(meta)
    for fqn, raw in meta.get("param_plan", {}).items():
        entry: PlanEntry = plan.entries[fqn]
        assert entry.passes_through() == dict_rules.passes_through(raw)


def test_injection_fans_out() -> None:
    record = Injection(match=("a", "b"), inner_wrapper="sdpa_hf")
    plan = Plan(injections=(record,))
    assert plan.injections_by_fqn() == {"a": record, "b": record}
    assert record.targets == {"inner_wrapper": "sdpa_hf"}


def test_the_plan_loads_no_torch() -> None:
    code = ("import json, sys; from hpcodegen.plan.codec import plan_from_meta, plan_to_meta;"
            f"m = json.load(open({str(ROOT / 'examples/llama_tp2/codegen_meta.json')!r}));"
            "assert plan_to_meta(plan_from_meta(m)) == m;"
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


def test_the_checked_loader_builds_the_plan() -> None:
    from hpcodegen.verify import check_meta, load_checked_meta

    loaded = load_checked_meta(ROOT / "examples/llama_tp2")
    assert isinstance(loaded.plan, Plan)
    assert plan_to_meta(loaded.plan) == loaded.data
    assert check_meta(loaded, ("schema",)).plan is loaded.plan  # built once, then kept


def test_every_key_the_schema_publishes_has_a_typed_field() -> None:
    """A key added to the schema must be added to the Plan too (else it would only ride
    along in ``extra``): the codec's tables cover the schema's properties exactly."""
    from hpcodegen.plan import codec

    schema = meta_schema()
    defs = schema["$defs"]
    assert set(codec._ENTRY) == set(defs["entry"]["properties"])
    assert set(codec._INJECTION) == set(defs["injection"]["properties"])
    assert set(codec._PLAN) | set(codec._PROVENANCE) == set(schema["properties"])
    assert not set(codec._PLAN) & set(codec._PROVENANCE)
    assert set(codec._OUTPUT) == set(defs["output"]["required"])
