"""MoE with sequence parallelism: each tp rank routes its own slice of the tokens.

* the plan: experts take token rows sharded on tp (``S(0)``), the router and gates are
  replicated with partial gradients, the indices gathered without a backward; with --ep the
  dispatch stays on the slice (identity transitions) and gathers over tp itself;
* inspect-plan's collectives equal CommDebugMode's (fake process group, tp 2 and tp 2 x ep 2);
* the expert all_to_all under --sp moves 1/tp of the bytes it moves without;
* logits, every gradient and AdamW losses equal the unsharded model's on real gloo ranks.
"""

from __future__ import annotations

import io
import json
import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))

from moe_configs import write_model_dir

from hpcodegen.errors import PlanError
from hpcodegen.generate.api import GenerateArgs, generate_artifact

pytestmark = pytest.mark.slow
TOL = 1e-5


def _generate(moe_artifact, model_type: str, tp: int, ep: int = 1,
              sp: bool = True) -> tuple[Path, Path, dict]:
    """The session's artifact (tests/moe/conftest.py: generated once, shared by the plan,
    count and parity checks) and its meta."""
    out, model = moe_artifact(model_type, tp, ep=ep, sp=sp)
    return out, model, json.loads((out / "codegen_meta.json").read_text())


@pytest.mark.timeout(400)
def test_sp_plans_route_the_rank_slice(moe_artifact) -> None:
    from hpcodegen.verify import run_verify

    rows = {"tp": "S(0)"}
    for family in ("qwen3_moe", "qwen2_moe", "gpt_oss"):
        out, model, meta = _generate(moe_artifact, family, 2)
        plan = meta["param_plan"]
        experts = plan["model.layers.0.mlp.experts"]
        assert all(v == rows for v in experts["in_src"].values()), family
        assert all(v == {"tp": "R"} for v in experts["in_dst"].values())
        assert experts["out_src"] == {"output": {"tp": "P(sum)"}}
        assert experts["out_dst"] == {"output": rows}
        assert len(experts["no_grad_inputs"]) == 1  # the expert indices
        router = next(e for f, e in plan.items() if f.startswith("model.layers.0.mlp.")
                      and f.rsplit(".", 1)[1] in ("gate", "router"))
        assert router["partial_grad_params"] == sorted(router["params"]), family
        assert meta["parallel_dims"]["sequence_parallel"] is True
        assert run_verify([str(out)], hf_config=str(model)) == 0, family
    out, model, meta = _generate(moe_artifact, "qwen3_moe", 2, ep=2)
    experts = meta["param_plan"]["model.layers.0.mlp.experts"]
    assert experts["in_src"] == experts["in_dst"] and experts["out_src"] == experts["out_dst"]
    assert experts["out_dst"] == {"output": rows}
    assert run_verify([str(out)], hf_config=str(model)) == 0


@pytest.mark.timeout(400)
def test_sp_refuses_experts_without_routing(tmp_path: Path) -> None:
    """Llama-4's experts take every token stacked once per expert: rows are not tokens."""
    model = write_model_dir(tmp_path / "l4", "llama4_text")
    with pytest.raises(PlanError, match="its rows are not one per token"):
        generate_artifact(GenerateArgs(model, 2, tmp_path / "o", sp=True))


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


def _predicted(meta: dict) -> tuple[Counter, Counter]:
    from hpcodegen.plan.codec import plan_from_meta
    from hpcodegen.plan.predict import predict_plan, summarize

    summary = summarize(predict_plan(plan_from_meta(meta)))
    fwd, bwd = Counter(), Counter()
    for (kind, _axis, _dim), n in summary.per_forward.items():
        fwd[kind] += n
    for table in (summary.per_backward, summary.grad_sync):
        for (kind, _axis, _dim), n in table.items():
            bwd[kind] += n
    return fwd, bwd


@pytest.mark.timeout(400)
@pytest.mark.filterwarnings("ignore:.*backward hook:UserWarning")
@pytest.mark.filterwarnings("ignore:For backward hooks:UserWarning")
@pytest.mark.parametrize("world, ep, family", [(2, 1, "qwen3_moe"), (4, 2, "gpt_oss")])
def test_sp_counts_match_prediction(moe_artifact, fake_world, world: int, ep: int,
                                    family: str) -> None:
    import torch
    from torch.distributed.tensor.debug import CommDebugMode

    from hpcodegen.hf import load_transformers_config
    from hpcodegen.launch.rank.mesh import build_device_mesh, resolve_mesh_layout
    from hpcodegen.plan.codec import plan_from_meta
    from hpcodegen.runtime import MeshContext, parallelize_from_generated
    from hpcodegen.runtime.loader import generated_model_class, import_generated_module

    arts = [_generate(moe_artifact, family, 2, ep=ep)]
    fake_world(world)
    for out, model_dir, meta in arts:
        config = json.loads((model_dir / "config.json").read_text())
        mesh = build_device_mesh(resolve_mesh_layout(plan_from_meta(meta), world), "cpu")
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
        want_f, want_b = _predicted(meta)
        # per MoE layer: counts, dispatch, tp gather, tp scatter, combine (2 layers)
        assert want_f["all_to_all"] == (5 if ep > 1 else 0) * 2
        assert _counted(fwd) == +want_f, (out.name, _counted(fwd), want_f)
        assert _counted(bwd) == +want_b, (out.name, _counted(bwd), want_b)


@pytest.mark.timeout(400)
def test_sp_expert_all_to_all_moves_a_tp_th(moe_artifact) -> None:
    """inspect-plan: with --sp each tp rank dispatches its slice (1/tp of the tokens)."""
    from hpcodegen.inspect.options import InspectOptions
    from hpcodegen.inspect.run import run_inspect

    def ep_bytes(out: Path, model: Path) -> float:
        buf = io.StringIO()
        assert run_inspect(InspectOptions(path=str(out), as_json=True, hf_config=str(model),
                                          batch=2, seq=64), out=buf) == 0
        rows = json.loads(buf.getvalue())["volume"]["by_collective"]
        return sum(r["bytes"] for r in rows if r["axis"] == "ep")

    plain, model, _ = _generate(moe_artifact, "qwen3_moe", 2, ep=2, sp=False)
    sliced, _, _ = _generate(moe_artifact, "qwen3_moe", 2, ep=2)
    payload = 2 * 64 * 2 * 64 * 2 / 2  # tokens x top-k x hidden x bf16, half leaves (ep 2)
    counts = 4 * 8 / 2
    moe = 2
    assert ep_bytes(plain, model) == moe * (counts + 4 * payload)
    assert ep_bytes(sliced, model) == moe * (counts + 4 * payload / 2)


def _parity(moe_artifact, families: list[str], tp: int, ep: int, world: int, gloo) -> None:
    from moe_workers import parity_cases

    cases = []
    for family in families:
        out, model, _ = _generate(moe_artifact, family, tp, ep=ep)
        cases.append((f"{family} tp{tp} ep{ep}", str(out), str(model), 2))
    for rank in gloo(world, parity_cases, cases):
        for name, r in rank.items():
            assert not r["odd"], (name, r["odd"])
            assert r["logits"] <= TOL and r["grad"] <= TOL, (name, r)
            assert r["loss_diff"] <= TOL, (name, r)
            assert r["with_grad"] == r["params"], (name, r)


@pytest.mark.timeout(400)
def test_sp_tp2_x_ep2_matches_unsharded_on_4_ranks(moe_artifact, gloo) -> None:
    _parity(moe_artifact, ["qwen3_moe", "gpt_oss"], 2, 2, 4, gloo)


@pytest.mark.timeout(400)
def test_sp_tp2_matches_unsharded(moe_artifact, gloo) -> None:
    _parity(moe_artifact, ["qwen3_moe", "qwen2_moe", "gpt_oss"], 2, 1, 2, gloo)
