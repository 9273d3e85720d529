"""The CP runtime on torch's fake process group (one process, no numerics): collectives
counted by CommDebugMode equal inspect-plan's prediction forward and backward; K/V reach
the kernel at their kv-head count and the masks are this rank's rows; no graph break of
its own under torch.compile; the source info leaves cp to FSDP2; refusals."""

from __future__ import annotations

import copy
from collections import Counter

import pytest
from cp_paths import CONFIGS, REPO

from hpcodegen.errors import PlanError

EXAMPLE = REPO / "examples" / "llama_cp2_tp2_sp"
LLAMA = REPO / "examples" / "configs" / "llama"
OP_KIND = {"all_gather_into_tensor": "all_gather", "reduce_scatter_tensor": "reduce_scatter",
           "all_reduce": "all_reduce", "allreduce_": "all_reduce",
           "_allgather_base_": "all_gather", "_reduce_scatter_base_": "reduce_scatter",
           "all_to_all_single": "all_to_all", "alltoall_base_": "all_to_all"}
pytestmark = [pytest.mark.filterwarnings("ignore:.*backward hook:UserWarning"),
              pytest.mark.filterwarnings("ignore:For backward hooks:UserWarning")]


def _counted(mode) -> Counter:
    out: Counter = Counter()
    for op, n in mode.get_comm_counts().items():
        name = str(op).split(".")[-1].split("'")[0]
        out[OP_KIND.get(name, name)] += n
    return +out


def _predicted(meta) -> tuple[Counter, Counter, Counter]:
    from hpcodegen.plan.codec import plan_from_meta
    from hpcodegen.plan.predict import predict_plan, summarize

    summary = summarize(predict_plan(plan_from_meta(meta)))
    fwd, bwd, cp = Counter(), Counter(), Counter()
    for (kind, axis, _), n in summary.per_forward.items():
        fwd[kind] += n
        cp[("forward", kind, axis)] += n
    for (kind, axis, _), n in [*summary.per_backward.items(), *summary.grad_sync.items()]:
        bwd[kind] += n
        cp[("backward", kind, axis)] += n
    return +fwd, +bwd, cp


def _model(artifact, config_dir, cp: int, tp: int):
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    from hpcodegen.hf import load_transformers_config, read_hf_config
    from hpcodegen.launch.rank.model import model_class
    from hpcodegen.runtime import parallelize_from_generated

    config, _ = read_hf_config(config_dir)
    hf_config = load_transformers_config(config)
    torch.manual_seed(0)
    plain = model_class(artifact, config)(hf_config)
    model = copy.deepcopy(plain)
    mesh = init_device_mesh("cpu", (cp, tp), mesh_dim_names=("cp", "tp"))
    info = parallelize_from_generated(model, mesh, artifact, hf_config=hf_config)
    return plain, model, info


@pytest.mark.timeout(400)
@pytest.mark.parametrize("case", ["cp2_tp2_sp", "cp2_gqa_tp1"])
def test_counts_match_prediction(case, cp_artifact, fake_world) -> None:
    import torch
    from torch.distributed.tensor.debug import CommDebugMode

    from hpcodegen.artifact.load import load_meta
    from hpcodegen.runtime.cp import shard_batch

    if case == "cp2_tp2_sp":
        artifact, config, cp, tp = EXAMPLE, LLAMA, 2, 2
    else:
        artifact, config, cp, tp = cp_artifact("llama_gqa", tp=1, cp=2), \
            CONFIGS / "llama_gqa", 2, 1
    fake_world(cp * tp)
    _, model, _ = _model(artifact, config, cp, tp)
    batch = shard_batch(model, torch.randint(0, 256, (2, 32)))
    with CommDebugMode() as fwd_mode:
        logits = model(**batch.inputs).logits
    with CommDebugMode() as bwd_mode:
        logits.float().sum().backward()
    want_fwd, want_bwd, by_axis = _predicted(load_meta(artifact).data)
    assert _counted(fwd_mode) == want_fwd
    assert _counted(bwd_mode) == want_bwd
    # per attention layer: K and V gathered forward, their gradients reduce-scattered back
    layers = model.config.num_hidden_layers
    assert by_axis[("forward", "all_gather", "cp")] == 2 * layers + 1  # + the batch's ids
    assert by_axis[("backward", "reduce_scatter", "cp")] == 2 * layers
    if tp == 1:  # every collective of a cp-only plan is on cp
        assert _counted(fwd_mode) == Counter({"all_gather": 2 * layers + 1})


@pytest.mark.timeout(400)
def test_kv_at_their_head_count_and_mask_rows(cp_artifact, fake_world) -> None:
    """GQA: 8 query heads, 2 kv heads; at tp 2 each rank gathers 1 kv head of the whole
    sequence (never the 4 expanded ones); the mask is [B, 1, S_local, S]."""
    import torch

    from hpcodegen.runtime.cp import shard_batch

    fake_world(4)
    _, model, info = _model(cp_artifact("llama_gqa", tp=2, cp=2), CONFIGS / "llama_gqa", 2, 2)
    seen = []
    for layer in model.model.layers:
        cp_attention = layer.self_attn._hp_cp_attention
        kernel = cp_attention.kernel

        def record(module, query, key, value, mask, kernel=kernel, **kwargs):
            seen.append((tuple(query.shape), tuple(key.shape), tuple(value.shape),
                         tuple(mask.shape), mask.dtype))
            return kernel(module, query, key, value, mask, **kwargs)
        cp_attention.kernel = record
    batch = shard_batch(model, torch.randint(0, 256, (2, 32)))
    model(**batch.inputs)
    assert seen == [((2, 4, 16, 8), (2, 1, 32, 8), (2, 1, 32, 8), (2, 1, 16, 32),
                     torch.float32)] * 2
    # the source info leaves cp to FSDP2: placements over tp, on the tp submesh
    placements, mesh = info["model.layers.0.self_attn.q_proj.weight"]
    assert len(placements) == 1 and mesh.mesh_dim_names == ("tp",)


@pytest.mark.timeout(400)
def test_no_graph_break_of_its_own_under_compile(fake_world) -> None:
    import torch

    from hpcodegen.runtime.cp import shard_batch

    fake_world(4)
    plain, model, _ = _model(EXAMPLE, LLAMA, 2, 2)
    # one decoder layer traced: each runs the same cp attention and boundaries, and dynamo's
    # trace time grows with the depth (the plan names both layers: parallelized first)
    for traced in (plain, model):
        del traced.model.layers[1:]
    ids = torch.randint(0, 256, (2, 32))
    torch._dynamo.reset()
    base = torch._dynamo.explain(plain)(input_ids=ids, use_cache=False)
    batch = shard_batch(model, ids)
    torch._dynamo.reset()
    ours = torch._dynamo.explain(model)(**batch.inputs)
    assert ours.graph_break_count <= base.graph_break_count, \
        [r.reason.splitlines()[0] for r in ours.break_reasons]
    assert ours.graph_count <= base.graph_count
    ops = {str(n.target) for g in ours.graphs for sub in g.modules() if hasattr(sub, "graph")
           for n in sub.graph.nodes if n.op == "call_function"}
    assert any("all_gather" in o for o in ops), sorted(ops)


@pytest.mark.timeout(400)
def test_refusals(fake_world) -> None:
    import torch

    from hpcodegen.runtime.cp import shard_batch

    fake_world(4)
    _, model, _ = _model(EXAMPLE, LLAMA, 2, 2)
    ids = torch.randint(0, 256, (2, 16))
    with pytest.raises(PlanError, match="cannot shift labels"):
        model(input_ids=ids, labels=ids)
    with pytest.raises(PlanError, match="2-D"):
        model(input_ids=ids, attention_mask=torch.ones(2, 1, 16, 16))
    batch = shard_batch(model, torch.randint(0, 256, (2, 32)))
    del model.model.layers[1].self_attn.__dict__["_hp_cp_attention"]
    with pytest.raises(PlanError, match="gives it no cp inner_wrapper"):
        model(**batch.inputs)
