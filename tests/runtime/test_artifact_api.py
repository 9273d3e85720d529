"""``hpcodegen.Artifact``: checked once, builds the generated model, parallelizes it in place;
afterwards its parameters, and so ``state_dict()`` (model and optimizer), are DTensors with
the plan's placements, at no communication, and ``load_state_dict`` takes them back; torch's
``clip_grad_norm_`` takes their DTensor gradients. One process on the fake process group;
the numeric checks against the unsharded model run on gloo in
tests/runtime/test_dtensor_params.py and tests/launch/test_torch_dcp.py."""

from __future__ import annotations

import subprocess
import sys

import pytest
from rt_artifacts import copy_artifact, record_file
from rt_workers import EXAMPLES

from hpcodegen.errors import PlanError
from hpcodegen.placement import REPLICATE

pytestmark = pytest.mark.timeout(400)
CONFIG = EXAMPLES / "configs" / "llama"


@pytest.fixture
def tp2(fake_world):
    from torch.distributed.device_mesh import init_device_mesh

    fake_world(2)
    return init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))


def _parallel(mesh, name: str = "llama_tp2"):
    import torch

    import hpcodegen

    art = hpcodegen.Artifact.load(EXAMPLES / name, CONFIG)
    torch.manual_seed(0)
    full = art.build_model(device="cpu")
    model = art.build_model(device="cpu")
    model.load_state_dict(full.state_dict())
    assert art.parallelize(model, mesh) is model
    return art, full, model


def test_load_checks_once_and_imports_no_torch() -> None:
    code = ("import sys, hpcodegen, hpcodegen.verify as v, hpcodegen.runtime.checked as api\n"
            "calls = []\n"
            "run, load = v.run_checks, api.load_meta\n"
            "def counted(ctx, names, *a):\n"
            "    calls.append(tuple(names))\n"
            "    return run(ctx, names, *a)\n"
            "v.run_checks = counted\n"
            "api.load_meta = lambda p: calls.append('load') or load(p)\n"
            f"art = hpcodegen.Artifact.load({str(EXAMPLES / 'llama_tp2')!r}, {str(CONFIG)!r})\n"
            "assert calls == ['load', ('schema', 'plan', 'targets', 'outputs'), ('signature',)],"
            " calls\n"
            "assert art.plan.axes == ('tp',) and art.loaded.plan is art.plan\n"
            "assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


def test_state_dict_is_dtensors_with_the_plans_placements(tp2) -> None:
    import torch
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.debug import CommDebugMode

    from hpcodegen.runtime.mesh import to_torch_placements

    art, full, model = _parallel(tp2)
    with CommDebugMode() as comm:
        state = model.state_dict()
    assert comm.get_total_counts() == 0
    assert set(state) == set(full.state_dict())
    planned = {p.fqn: p for p in art.plan.parameters()}
    for fqn, value in state.items():
        if fqn not in planned:
            assert not isinstance(value, DTensor), fqn  # buffers stay plain
            continue
        assert isinstance(value, DTensor), fqn
        want = (planned[fqn].placements.get("tp", REPLICATE),)
        assert tuple(value.placements) == to_torch_placements(want, value.dim()), fqn
        assert value.shape == full.get_parameter(fqn).shape, fqn
        param = model.get_parameter(fqn)
        assert isinstance(param, DTensor) and param.placements == value.placements, fqn
        assert value.to_local().data_ptr() == param.to_local().data_ptr(), fqn  # same storage
    assert torch.equal(state["lm_head.weight"].to_local(), model.lm_head.weight.to_local())


def test_load_state_dict_takes_dtensors_global_and_local_tensors(tp2) -> None:
    import torch

    _, full, model = _parallel(tp2)
    q = model.model.layers[0].self_attn.q_proj.weight  # S(0): rows 0..31 on rank 0
    reference = full.state_dict()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    model.load_state_dict(reference)  # whole tensors: each rank keeps its slice
    assert torch.equal(q.to_local(), reference["model.layers.0.self_attn.q_proj.weight"][:32])
    saved = {k: v.detach().clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        q.zero_()
    model.load_state_dict(saved)  # DTensors
    assert torch.equal(q.to_local(), reference["model.layers.0.self_attn.q_proj.weight"][:32])
    local = {k: v.to_local() if hasattr(v, "to_local") else v for k, v in saved.items()}
    with torch.no_grad():
        q.zero_()
    model.load_state_dict(local)  # this rank's local shards
    assert torch.equal(q.to_local(), reference["model.layers.0.self_attn.q_proj.weight"][:32])


def test_optimizer_state_dict_is_dtensors_and_loads_back(tp2) -> None:
    import torch
    from torch.distributed.checkpoint.state_dict import (
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )
    from torch.distributed.tensor import DTensor

    _, _, model = _parallel(tp2)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(input_ids=torch.arange(16).reshape(2, 8)).logits.pow(2).mean().backward()
    optim.step()
    state = get_optimizer_state_dict(model, optim)
    q = "model.layers.0.self_attn.q_proj.weight"
    assert isinstance(state["state"][q]["exp_avg"], DTensor)
    assert state["state"][q]["exp_avg"].shape == (64, 64)  # global
    fresh = torch.optim.AdamW(model.parameters(), lr=1e-3)
    set_optimizer_state_dict(model, fresh, state)  # never stepped: its hooks come at step 1
    optim.step()
    fresh.step()  # the same state and gradients: the same update, as DTensors
    param = model.get_parameter(q)
    got = fresh.state[param]["exp_avg"]
    assert isinstance(got, DTensor) and got.placements == param.placements
    assert torch.equal(got.to_local(), optim.state[param]["exp_avg"].to_local())


def test_gradients_are_dtensors_torch_clips_them(tp2) -> None:
    import torch
    from torch.distributed.tensor import DTensor

    _, _, model = _parallel(tp2)
    model(input_ids=torch.arange(16).reshape(2, 8)).logits.pow(2).mean().backward()
    for fqn, param in model.named_parameters():
        assert isinstance(param.grad, DTensor), fqn
        assert param.grad.placements == param.placements, fqn
        assert param.grad.shape == param.shape, fqn
    for foreach in (False, True):  # runs on DTensors (values: tests/runtime/test_dtensor_params)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=foreach)
        assert norm.shape == ()
    grad = model.lm_head.weight.grad  # every other use of the gradient is as before
    torch.nn.utils.clip_grad_value_(model.parameters(), 1e-3)
    assert float(grad.to_local().abs().max()) == pytest.approx(1e-3)  # clamped in place
    model.lm_head.weight.grad = None
    assert model.lm_head.weight.grad is None


def test_a_generated_entrypoint_is_never_called(tmp_path, tp2) -> None:
    """A G1-style artifact whose module defines the meta's ``entrypoints.parallelize``:
    the plan runs, the function does not (it would skip every phase)."""
    import hpcodegen

    art_dir = copy_artifact("llama_tp2", tmp_path / "entry")
    modeling = next(art_dir.glob("modeling_*_gen_npu.py"))
    record_file(art_dir, "modeling", modeling.name, modeling.read_text()
                + "\n\ndef hp_parallelize(model, mesh_context):\n"
                  "    raise AssertionError('a generated entry function ran')\n")
    art = hpcodegen.Artifact.load(art_dir, CONFIG)
    assert art.plan.entrypoints["parallelize"] == "hp_parallelize"
    assert callable(art.module().hp_parallelize)
    model = art.parallelize(art.build_model(device="cpu"), tp2)
    q = model.model.layers[0].self_attn.q_proj.weight
    assert q.shape == (64, 64) and q.to_local().shape == (32, 64)


def test_parallelize_takes_one_kind_of_mesh_and_runs_once(tp2) -> None:
    import hpcodegen

    art = hpcodegen.Artifact.load(EXAMPLES / "llama_tp2", CONFIG)
    model = art.build_model(device="cpu")
    with pytest.raises(PlanError, match="DeviceMesh"):
        art.parallelize(model, "tp")
    art.parallelize(model, tp2)
    with pytest.raises(PlanError) as info:
        art.parallelize(model, tp2)
    assert info.value.findings[0].code == "runtime.second_call"


def test_build_model_needs_a_config() -> None:
    import hpcodegen

    with pytest.raises(PlanError) as info:
        hpcodegen.Artifact.load(EXAMPLES / "llama_tp2").build_model()
    assert info.value.findings[0].code == "runtime.no_config"


def test_parallelize_from_generated_is_the_thin_wrapper(tp2) -> None:
    import torch

    import hpcodegen
    from hpcodegen.runtime import parallel_state, parallelize_from_generated

    art = hpcodegen.Artifact.load(EXAMPLES / "llama_tp2", CONFIG)
    model = art.build_model(device="cpu")
    info = parallelize_from_generated(model, tp2, EXAMPLES / "llama_tp2", hf_config=CONFIG)
    state = parallel_state(model)
    assert state is not None and state.source_info == info
    assert info["lm_head.weight"][0] == (torch.distributed.tensor.Shard(0),)
    assert state.plan == art.plan


def test_state_dict_of_a_model_wrapped_by_fully_shard_is_global(fake_world) -> None:
    """FSDP2 over dp makes each tp DTensor parameter a DTensor over dp and tp: its entry
    in ``state_dict()`` is that DTensor, of the unsharded parameter's shape."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor, Shard

    import hpcodegen

    fake_world(4)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    art = hpcodegen.Artifact.load(EXAMPLES / "llama_tp2", CONFIG)
    full = art.build_model(device="cpu")
    model = art.parallelize(art.build_model(device="cpu"), mesh)
    fully_shard(model, mesh=mesh["dp"])
    state = model.state_dict()
    q = state["model.layers.0.self_attn.q_proj.weight"]
    assert isinstance(q, DTensor) and q.device_mesh.mesh_dim_names == ("dp", "tp")
    assert q.placements[1] == Shard(0)
    for fqn, param in full.named_parameters():
        assert state[fqn].shape == param.shape, fqn
