"""MoE generation, prediction and collective counts in one process (no rank spawning).

* each family with an HF plan generates at --tp 2: packed expert weights sharded as HF says,
  router replicated (parameter-only), shared experts a dense region; verify accepts it;
* --ep writes ``ep: S(0)`` on every expert parameter and the registered dispatch injection;
* inspect-plan's all_to_all counts equal CommDebugMode's on the fake process group;
* full-size Qwen3-30B-A3B / DeepSeek-V3 shapes: generate and inspect-plan on the meta
  device, predicted dispatch bytes equal a hand count.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from moe_configs import FULL_SIZE, write_model_dir

from hpcodegen.errors import PlanError, UsageError
from hpcodegen.generate.api import GenerateArgs, generate_artifact

pytestmark = pytest.mark.slow
FAMILIES = ["qwen3_moe", "qwen2_moe", "mixtral", "deepseek_v3"]


Generated = Callable[..., tuple[Path, Path, dict]]


@pytest.fixture(scope="module")
def generated(moe_artifact: Callable[..., tuple[Path, Path]]) -> Generated:
    """``generated(model_type, tp, ep=1)``: (artifact dir, model dir, a fresh copy of its
    meta), from ``conftest.moe_artifact`` (each built once per run: several tests here and
    in the parity files read the same artifact)."""
    def generate(model_type: str, tp: int, ep: int = 1) -> tuple[Path, Path, dict]:
        out, model = moe_artifact(model_type, tp, ep=ep)
        return out, model, json.loads((out / "codegen_meta.json").read_text())
    return generate


@pytest.mark.timeout(400)
def test_families_generate_at_tp2_and_verify(generated: Generated) -> None:
    from hpcodegen.verify import run_verify

    for family in FAMILIES:
        out, model, meta = generated(family, 2)
        plan = meta["param_plan"]
        experts = {f: e for f, e in plan.items() if f.endswith("mlp.experts")}
        assert experts, family
        for entry in experts.values():
            assert entry["params"]["gate_up_proj"] == {"tp": "SS(1,2)"}  # packed colwise
            assert entry["params"]["down_proj"] == {"tp": "S(2)"}         # rowwise
            assert entry["out_src"] == {"output": {"tp": "P(sum)"}}
            assert len(entry["in_src"]) == 2  # hidden states, routing weights (not indices)
        routers = [f for f in plan if f.endswith("mlp.gate")]
        assert routers and all(plan[f] == {"is_boundary": False, "params": {"weight": {"tp": "R"}}}
                               for f in routers), family
        assert run_verify([str(out)], hf_config=str(model)) == 0, family
    shared = plan["model.layers.1.mlp.shared_experts"]  # deepseek_v3, last in FAMILIES
    assert shared["params"]["gate_proj.weight"] == {"tp": "S(0)"}
    assert shared["out_src"] == {"output": {"tp": "P(sum)"}}


@pytest.mark.timeout(400)
def test_ep_meta_is_written_like_the_existing_system(generated: Generated) -> None:
    _, _, meta = generated("qwen3_moe", 2, ep=2)
    assert meta["parallel_dims"]["ep_size"] == 2
    assert meta["mesh_dim_names"] == ["tp"]  # ep is routed to the expert mesh
    entry = meta["param_plan"]["model.layers.0.mlp.experts"]
    assert entry["params"] == {"down_proj": {"ep": "S(0)", "tp": "S(2)"},
                               "gate_up_proj": {"ep": "S(0)", "tp": "SS(1,2)"}}
    assert meta["injections"] == [
        {"match": f"model.layers.{i}.mlp.experts", "ep_size": 2,
         "local_compute_fn": {"_target_": "hpcodegen.runtime.moe.ep_dispatch"}}
        for i in range(2)]
    from hpcodegen.plan.classify import classify_plan
    from hpcodegen.plan.codec import plan_from_meta

    assert classify_plan(plan_from_meta(meta))["model.layers.0.mlp.experts"].form == "region"


@pytest.mark.timeout(400)
def test_biased_experts_split_over_tp_with_the_output_bias_applied_once(
        generated: Generated) -> None:
    """GPT-OSS's experts carry per-expert biases: over tp, gate_up [E, H, 2I] and its bias
    split on the interleaved (gate, up) columns, down [E, I, H] on I, and down_proj_bias
    whole, applied by tp rank 0 only (its gradient partial); over ep every parameter,
    biases included, goes with its expert."""
    from hpcodegen.verify import run_verify

    tp_split = {"gate_up_proj": "S(2)", "gate_up_proj_bias": "S(1)", "down_proj": "S(1)",
                "down_proj_bias": "R"}
    for tp, ep in ((2, 1), (2, 2), (1, 2)):
        out, model, meta = generated("gpt_oss", tp, ep)
        entry = meta["param_plan"]["model.layers.1.mlp.experts"]
        extra = {"ep": "S(0)"} if ep > 1 else {}
        assert entry["params"] == {n: {"tp": p, **extra} for n, p in tp_split.items()}
        assert entry["out_src"] == {"output": {"tp": "P(sum)"}}, (tp, ep)
        assert entry["tp_rank0_params"] == entry["partial_grad_params"] == ["down_proj_bias"]
        assert len(meta.get("injections", [])) == (2 if ep > 1 else 0)
        assert run_verify([str(out)], hf_config=str(model)) == 0, (tp, ep)


@pytest.mark.timeout(400)
def test_tp_split_experts_refuse_a_whole_expert_parameter(tmp_path: Path) -> None:
    """A rule splitting biased experts over tp (as HF's moe_tp_experts plans do for
    bias-free families) would add each whole ``down_proj_bias`` once per rank: refused."""
    import torch

    from hpcodegen.generate.layouts.lift import lift_plan
    from hpcodegen.generate.sources.hf_plan import expand_rules
    from hpcodegen.hf import load_transformers_config, model_class_for

    config = json.loads((write_model_dir(tmp_path / "m", "gpt_oss") / "config.json").read_text())
    with torch.device("meta"):
        model = model_class_for(config)(load_transformers_config(config))
    rules = [("model.layers.*.mlp.experts.gate_up_proj", "packed_rowwise"),
             ("model.layers.*.mlp.experts.down_proj", "colwise"),
             ("model.layers.*.mlp.experts", "moe_tp_experts")]
    fqns = list(dict(model.named_modules()))
    params = [n for n, _ in model.named_parameters()]
    with pytest.raises(PlanError, match="down_proj_bias, gate_up_proj_bias are left whole"):
        lift_plan(model, expand_rules(rules, fqns, params), sp=False)


@pytest.mark.timeout(400)
def test_ep_refusals(tmp_path: Path, llama_model_dir: Path) -> None:
    with pytest.raises(PlanError, match="no mixture-of-experts layer"):
        generate_artifact(GenerateArgs(llama_model_dir, 2, tmp_path / "a", ep=2))
    model = write_model_dir(tmp_path / "m", "mixtral")
    with pytest.raises(PlanError, match="4 experts do not divide over --ep 3"):
        generate_artifact(GenerateArgs(model, 1, tmp_path / "b", ep=3))
    # Llama-4's experts run every token pre-scaled by the router: nothing to dispatch
    model = write_model_dir(tmp_path / "l4", "llama4_text")
    with pytest.raises(PlanError, match=r"Llama4TextExperts.forward\(hidden_states\) takes no"):
        generate_artifact(GenerateArgs(model, 2, tmp_path / "c", ep=2))
    from hpcodegen.launch.rank.mesh import resolve_mesh_layout
    from hpcodegen.plan.codec import plan_from_meta

    meta = {"parallel_dims": {"tp_size": 2, "ep_size": 2}, "mesh_dim_names": ["tp"]}
    assert resolve_mesh_layout(plan_from_meta(meta), 4).describe() == "dp=2 (ep=2) x tp=2"
    with pytest.raises(UsageError, match="does not divide the data-parallel size dp=1"):
        resolve_mesh_layout(plan_from_meta(meta), 2)


OP_KIND = {"all_gather_into_tensor": "all_gather", "_allgather_base_": "all_gather",
           "all_reduce": "all_reduce", "allreduce_": "all_reduce",
           "reduce_scatter_tensor": "reduce_scatter", "_reduce_scatter_base_": "reduce_scatter",
           "alltoall_base_": "all_to_all", "all_to_all_single": "all_to_all"}


def _counted(mode) -> Counter:
    out: Counter = Counter()
    for op, n in mode.get_comm_counts().items():
        name = str(op).split(".")[-1].split("'")[0]
        out[OP_KIND.get(name, name)] += n
    return out


@pytest.mark.timeout(400)
@pytest.mark.filterwarnings("ignore:.*backward hook:UserWarning")
@pytest.mark.filterwarnings("ignore:For backward hooks:UserWarning")
def test_all_to_all_counts_match_prediction(generated: Generated, fake_world) -> None:
    import torch
    from torch.distributed.tensor.debug import CommDebugMode

    from hpcodegen.hf import load_transformers_config
    from hpcodegen.launch.rank.mesh import build_device_mesh, resolve_mesh_layout
    from hpcodegen.plan.codec import plan_from_meta
    from hpcodegen.plan.predict import predict_plan, summarize
    from hpcodegen.runtime import MeshContext, parallelize_from_generated
    from hpcodegen.runtime.loader import generated_model_class, import_generated_module

    arts = [generated(m, 2, ep=2) for m in ("qwen3_moe", "deepseek_v3", "gpt_oss")]
    fake_world(4)
    for out, model_dir, meta in arts:
        config = json.loads((model_dir / "config.json").read_text())
        mesh = build_device_mesh(resolve_mesh_layout(plan_from_meta(meta), 4), "cpu")
        torch.manual_seed(0)
        cls = generated_model_class(plan_from_meta(meta), import_generated_module(out))
        model = cls(load_transformers_config(config)).float()
        parallelize_from_generated(model, MeshContext(device_mesh=mesh), out,
                                   hf_config=config)
        ids = torch.randint(0, config["vocab_size"], (2, 8))
        with CommDebugMode() as fwd:
            logits = model(input_ids=ids, use_cache=False).logits
        with CommDebugMode() as bwd:
            logits.float().sum().backward()
        summary = summarize(predict_plan(plan_from_meta(meta)))
        want_f, want_b = Counter(), Counter()
        for (kind, _axis, _dim), n in summary.per_forward.items():
            want_f[kind] += n
        for table in (summary.per_backward, summary.grad_sync):
            for (kind, _axis, _dim), n in table.items():
                want_b[kind] += n
        moe_layers = sum(1 for f in meta["param_plan"] if f.endswith("mlp.experts"))
        assert want_f["all_to_all"] == 3 * moe_layers and want_b["all_to_all"] == 2 * moe_layers
        assert _counted(fwd) == +want_f, (out.name, _counted(fwd), want_f)
        assert _counted(bwd) == +want_b, (out.name, _counted(bwd), want_b)


@pytest.mark.timeout(400)
@pytest.mark.parametrize("name", sorted(FULL_SIZE))
def test_full_size_shapes_generate_and_predict_bytes(tmp_path: Path, name: str) -> None:
    """Meta device only; the dispatch bytes per rank are tokens x top-k x hidden x 2 (bf16)
    per payload all_to_all, and E x 8 for the counts, per MoE layer, times (ep-1)/ep: what
    leaves the rank under balanced routing. Every shape is the full model's; the depth is
    cut to 11 layers, the fewest whose indices reach two digits (8 MoE layers after
    DeepSeek-V3's 3 dense ones, 11 for Qwen3), as the bytes are a sum over layers and the
    generate's meta builds and derivation grow with each layer."""
    import io

    from hpcodegen.inspect.options import InspectOptions
    from hpcodegen.inspect.run import run_inspect

    config = {**FULL_SIZE[name], "num_hidden_layers": 11}
    model = tmp_path / name
    model.mkdir()
    (model / "config.json").write_text(json.dumps(config))
    out = tmp_path / "art"
    assert generate_artifact(GenerateArgs(model, 4, out, ep=8)) == 0
    meta = json.loads((out / "codegen_meta.json").read_text())
    moe = sum(1 for f in meta["param_plan"] if f.endswith("mlp.experts"))
    assert moe == config["num_hidden_layers"] - config.get("first_k_dense_replace", 0)
    tokens, k, hidden = 4096, config["num_experts_per_tok"], config["hidden_size"]
    experts = config.get("num_experts") or config["n_routed_experts"]
    buf = io.StringIO()
    assert run_inspect(InspectOptions(path=str(out), as_json=True, hf_config=str(model), batch=1,
                                      seq=tokens), out=buf) == 0
    report = json.loads(buf.getvalue())
    rows = {(c["direction"], c["kind"]): c for c in report["volume"]["by_collective"]}
    leave = 7 / 8
    payload = tokens * k * hidden * 2 * leave
    assert rows[("forward", "all_to_all")]["count"] == 3 * moe
    assert rows[("forward", "all_to_all")]["bytes"] == moe * (2 * payload + experts * 8 * leave)
    assert rows[("backward", "all_to_all")]["count"] == 2 * moe
    assert rows[("backward", "all_to_all")]["bytes"] == moe * 2 * payload


@pytest.mark.timeout(400)
def test_runtime_gate_accepts_the_models_own_config_object(generated: Generated) -> None:
    """``hf_config=model.config``: its to_dict() adds defaults and aliases the config.json
    never wrote (num_local_experts, attention_bias); the gate compares recorded fields."""
    from hpcodegen.hf import load_transformers_config
    from hpcodegen.runtime.api import load_verified_meta

    out, model, _ = generated("qwen3_moe", 2)
    config = json.loads((model / "config.json").read_text())
    load_verified_meta(out, load_transformers_config(config))
    with pytest.raises(PlanError, match="num_experts: artifact 4, config 8"):
        load_verified_meta(out, load_transformers_config({**config, "num_experts": 8}))


def test_inkling_plan_is_exact_by_construction(generated: Generated) -> None:
    """The general rules Inkling needs (its tp 2 parity runs in test_moe_parity)."""
    _, _, meta = generated("inkling_text", 2)
    plan = meta["param_plan"]
    # the embedding normalises inside its forward: kept whole, not vocab-parallel
    assert plan["model.embed_tokens"] == {"is_boundary": False, "params": {"weight": {"tp": "R"}}}
    experts = plan["model.layers.0.mlp.experts"]
    # HF says plain colwise, but the forward chunks gate|up: packed
    assert experts["params"]["gate_up_proj"] == {"tp": "SS(1,2)"}
    # the shared experts' routing gammas: declared, so their partial gradient is reduced
    shared = plan["model.layers.0.mlp.shared_experts"]
    assert shared["in_src"] == {"hidden_states": {"tp": "R"}, "gammas": {"tp": "R"}}


def test_tp_rank0_params_must_name_planned_parameters(generated: Generated) -> None:
    """verify's plan check reads ``tp_rank0_params`` like the other per-parameter lists."""
    from hpcodegen.checks.plan_refs import _entry_param_lists, planned_params
    from hpcodegen.plan.codec import entry_from_json, plan_from_meta
    from hpcodegen.plan.decode import DecodedMeta

    def findings() -> list[Any]:
        refused: list[Any] = []
        decoded = DecodedMeta(plan_from_meta(meta, refused=refused), tuple(refused))
        return list(_entry_param_lists(decoded, planned_params(decoded.plan.param_plan)))

    _, _, meta = generated("gpt_oss", 2)
    entry = meta["param_plan"]["model.layers.0.mlp.experts"]
    assert not findings()
    # another generator may omit the derived partial list: the gradient is still synced
    without = entry_from_json("experts", {**entry, "partial_grad_params": []})
    assert without.effective_partial_grad_params() == ("down_proj_bias",)
    entry["tp_rank0_params"] = ["down_proj_bias", "no_such_bias"]
    codes = [f.code for f in findings()]
    assert codes == ["plan.tp_rank0_params_unplanned"]
