"""torch.compile of a parallelized model: the boundary code adds no graph break.

``torch._dynamo.explain`` traces (no inductor codegen) the plain model built from the
generated classes and the same model after ``parallelize_from_generated`` on the fake
process group; hpcodegen's graph breaks must be at most the plain model's. Numeric parity
of a compiled model runs on gloo in ``tests/launch/test_compile_loss_parallel.py``.

The traced models keep one decoder layer: the artifact parallelizes the example's two (its
plan names every layer's parameters), then both models drop the second. Every decoder layer
runs the same code with the same boundaries, so one carries each kind the plan has, and
dynamo's trace time grows with the depth (five explains of each example: about 15 -> 11 s of
CPU from two layers to one). The binding's checks (three explains) run on the sequence-parallel
example only.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _explain(model, ids):
    import torch

    torch._dynamo.reset()
    return torch._dynamo.explain(model)(input_ids=ids)


@pytest.mark.timeout(400)
@pytest.mark.parametrize(("example", "binding"), [("llama_tp2", False), ("llama_tp2_sp", True)])
def test_no_graph_break_beyond_the_plain_model(example, binding, fake_world) -> None:
    """``binding``: also :func:`bind_traced`'s graphs and guards (three more explains), on
    the sequence-parallel example, whose boundaries are a superset of the plain tp one's."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    from hpcodegen.hf import load_transformers_config, read_hf_config
    from hpcodegen.launch.rank.model import model_class
    from hpcodegen.runtime import parallelize_from_generated
    from hpcodegen.runtime.compile import bind_traced

    artifact = REPO / "examples" / example
    config, _ = read_hf_config(REPO / "examples" / "configs" / "llama")
    hf_config = load_transformers_config(config)
    torch.manual_seed(0)
    plain = model_class(artifact, config)(hf_config)
    model = copy.deepcopy(plain)
    fake_world(2)
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    parallelize_from_generated(model, mesh, artifact, hf_config=hf_config)
    assert model.model.layers[0].mlp._hp_tp is not plain.model.layers[0].mlp._hp_tp
    for traced in (plain, model):  # one decoder layer traced (see the module docstring)
        del traced.model.layers[1:]
    ids = torch.randint(0, hf_config.vocab_size, (2, 16))
    base, ours = _explain(plain, ids), _explain(model, ids)
    reasons = [r.reason.splitlines()[0] for r in ours.break_reasons]
    assert ours.graph_break_count <= base.graph_break_count, reasons
    assert ours.graph_count <= base.graph_count
    # the lowered collectives are in the graph as functional collectives
    ops = {str(n.target) for g in ours.graphs for sub in g.modules() if hasattr(sub, "graph")
           for n in sub.graph.nodes if n.op == "call_function"}
    assert any("all_reduce" in o or "reduce_scatter" in o for o in ops), sorted(ops)
    if not binding:
        return
    # compile_parallelized's binding: the same graphs; in a no-grad forward (where no
    # autograd Function is traced) fewer of hpcodegen's objects guarded on every call
    with torch.no_grad():
        eager_ng = _explain(model, ids)
    boundaries = [m for m in model.modules()
                  if "_hp_tp" in m.__dict__ or "_hp_traced_forward" in m.__dict__]
    assert bind_traced(model) == len(boundaries)
    assert "_hp_traced_forward" not in model.lm_head.__dict__
    lean = _explain(model, ids)
    assert lean.graph_break_count <= base.graph_break_count
    assert lean.graph_count <= base.graph_count
    assert _ops(lean) == _ops(ours)
    with torch.no_grad():
        lean_ng = _explain(model, ids)
    assert _ops(lean_ng) == _ops(eager_ng)
    hp_guards = [len([g for g in e.out_guards if "_hp_tp" in g.name or ".forward." in g.name])
                 for e in (lean_ng, eager_ng)]
    assert 3 * hp_guards[0] < 2 * hp_guards[1], hp_guards  # a third fewer, at least


def _ops(explained) -> list[str]:
    return sorted(str(n.target) for g in explained.graphs for sub in g.modules()
                  if hasattr(sub, "graph") for n in sub.graph.nodes if n.op == "call_function")


def test_compile_scope_is_checked() -> None:
    from torch import nn

    from hpcodegen.runtime.compile import compile_parallelized, decoder_layers

    model = nn.Sequential(nn.Linear(2, 2), nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)]))
    assert len(decoder_layers(model)) == 2
    with pytest.raises(ValueError, match="scope"):
        compile_parallelized(model, "everything")
    with pytest.raises(ValueError, match="ModuleList"):
        compile_parallelized(nn.Linear(2, 2), "layers")


def test_fully_shard_after_compile_parallelized_is_refused_naming_the_module(fake_world) -> None:
    """FSDP2 applied after compiling replaces the parameters the compiled call swaps: the
    next call is refused (a PlanError naming the layer and the parameter), not run on FSDP's
    dp shard."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    import hpcodegen
    from hpcodegen.errors import PlanError
    from hpcodegen.hf import load_transformers_config, read_hf_config
    from hpcodegen.runtime.compile import compile_parallelized

    config, _ = read_hf_config(REPO / "examples" / "configs" / "llama")
    fake_world(4)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    art = hpcodegen.Artifact.load(REPO / "examples" / "llama_tp2",
                                  load_transformers_config(config))
    model = art.parallelize(art.build_model(device="cpu"), mesh)
    compile_parallelized(model, "layers", backend="eager")
    fully_shard(model.model.layers[0], mesh=mesh["dp"])
    with pytest.raises(PlanError, match=r"model\.layers\.0\.[\w.]+weight.*fully_shard") as err:
        model(input_ids=torch.zeros((1, 4), dtype=torch.long))
    assert err.value.findings[0].code == "runtime.sharded_after_compile"
