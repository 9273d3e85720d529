"""Refusals and no-ops of ``parallelize_from_generated`` (fake process group, one process).

Each refusal is a PlanError with a stable code naming the object, raised before the model is
touched (and, for drift and architecture, before the generated module is imported).
"""

from __future__ import annotations

import sys

import pytest
from rt_artifacts import copy_artifact
from rt_workers import EXAMPLES, batch, build_pair, hf_config

from hpcodegen.errors import PlacementMismatchError, PlanError
from hpcodegen.runtime.loader import package_name

pytestmark = pytest.mark.timeout(400)


def _codes(exc: PlanError) -> list[str]:
    return [f.code for f in exc.findings]


@pytest.fixture
def tp2(fake_world):
    from torch.distributed.device_mesh import init_device_mesh

    fake_world(2)
    return init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))


def _params(model) -> dict:
    return {n: p for n, p in model.named_parameters()}


def test_drifted_modeling_file_refused_before_import(tmp_path, tp2) -> None:
    from hpcodegen.runtime import parallelize_from_generated

    art = copy_artifact("llama_tp2", tmp_path / "drift")
    modeling = next(art.glob("modeling_*_gen_npu.py"))
    modeling.write_text(modeling.read_text() + "\nraise RuntimeError('must not run')\n")
    _, model = build_pair("llama_tp2")
    before = _params(model)
    with pytest.raises(PlanError) as info:
        parallelize_from_generated(model, tp2, art)
    assert "outputs.sha256_drift" in _codes(info.value)
    assert modeling.name in str(info.value)
    assert not any(m.startswith(package_name(art)) for m in sys.modules)
    assert _params(model) == before


def test_wrong_architecture_refused(tp2) -> None:
    from hpcodegen.runtime import parallelize_from_generated

    _, model = build_pair("llama_tp2")
    before = _params(model)
    with pytest.raises(PlanError) as info:
        parallelize_from_generated(model, tp2, EXAMPLES / "llama_tp2",
                                   hf_config=hf_config("qwen3_tp2"))
    assert _codes(info.value) == ["runtime.architecture"]
    assert "Qwen3ForCausalLM" in str(info.value) and "LlamaForCausalLM" in str(info.value)
    assert _params(model) == before


def _inject(target: str):
    def edit(meta):
        meta["injections"] = [{"match": "model.layers.0.self_attn",
                               "local_compute_fn": {"_target_": target, "use_grouped_gemm": True}}]
    return edit


def test_foreign_injection_target_refused(tmp_path, tp2) -> None:
    from hpcodegen.runtime import parallelize_from_generated

    target = "hyper_parallel.distributed.ep.make_grouped_experts"
    art = copy_artifact("llama_tp2", tmp_path / "foreign", _inject(target))
    _, model = build_pair("llama_tp2")
    before = _params(model)
    with pytest.raises(PlanError) as info:
        parallelize_from_generated(model, tp2, art)
    assert _codes(info.value) == ["plan.foreign_target"]
    assert target in str(info.value)
    assert "/injections/0/local_compute_fn/_target_" in str(info.value)
    assert _params(model) == before
    assert not any(m.startswith(package_name(art)) for m in sys.modules)


def test_registry_resolution_never_imports_by_path(monkeypatch) -> None:
    import os.path

    from hpcodegen import targets
    from hpcodegen.plan.codec import plan_from_meta
    from hpcodegen.runtime.identity import no_deferred_bias

    meta = {"injections": [{"match": "a", "local_compute_fn": {"_target_": "os.path.join",
                                                                 "k": 1}}]}
    with pytest.raises(PlanError) as info:  # not registered, not trusted
        targets.resolve_injections(plan_from_meta(meta))
    assert _codes(info.value) == ["plan.foreign_target"]
    # hpcodegen's own modules are not trusted by prefix either, only by registration
    own = {"injections": [{"match": "a", "inner_wrapper": {
        "_target_": "hpcodegen.runtime.identity.no_deferred_bias"}}]}
    with pytest.raises(PlanError):
        targets.resolve_injections(plan_from_meta(own))
    assert targets.resolve_injections(plan_from_meta(meta), ("os.path",)) == {
        "a": {"local_compute_fn": (os.path.join, {"k": 1})}}
    monkeypatch.setitem(targets.BUILTIN_TARGETS, "nobias",
                        "hpcodegen.runtime.identity:no_deferred_bias")
    short = {"injections": [{"match": "a", "inner_wrapper": "nobias"}]}
    for record in (short, own):
        resolved = targets.resolve_injections(plan_from_meta(record))
        assert resolved["a"]["inner_wrapper"][0] is no_deferred_bias
    missing = {"injections": [{"match": "a", "inner_wrapper": "os.path.nothing_here"}]}
    with pytest.raises(PlanError) as info:
        targets.resolve_injections(plan_from_meta(missing), ("os",))
    assert _codes(info.value) == ["runtime.missing_target"]


def test_unknown_special_handler_refused(tmp_path, tp2) -> None:
    from hpcodegen.runtime import parallelize_from_generated

    def edit(meta):
        meta["special_handlers"] = {"model.norm.weight": "no_such_handler"}
    art = copy_artifact("llama_tp2", tmp_path / "handler", edit)
    _, model = build_pair("llama_tp2")
    with pytest.raises(PlanError) as info:
        parallelize_from_generated(model, tp2, art)
    assert _codes(info.value) == ["runtime.unknown_handler"]
    assert "no_such_handler" in str(info.value)


def test_placement_mismatch_with_sharded_parameter(tp2) -> None:
    from torch import nn
    from torch.distributed.tensor import Shard, distribute_tensor

    from hpcodegen.runtime import parallelize_from_generated

    _, model = build_pair("llama_tp2")
    weight = model.lm_head.weight
    model.lm_head.weight = nn.Parameter(distribute_tensor(weight.detach(), tp2, [Shard(1)]))
    with pytest.raises(PlacementMismatchError) as info:
        parallelize_from_generated(model, tp2, EXAMPLES / "llama_tp2")
    assert info.value.findings[0].where == "lm_head.weight"
    assert "S(1)" in str(info.value) or "Shard(dim=1)" in str(info.value)


def test_already_sharded_with_planned_placement_is_accepted(tp2) -> None:
    from torch import nn
    from torch.distributed.tensor import Shard, distribute_tensor

    from hpcodegen.runtime import parallelize_from_generated

    _, model = build_pair("llama_tp2")
    weight = model.lm_head.weight.detach()
    model.lm_head.weight = nn.Parameter(distribute_tensor(weight, tp2, [Shard(0)]))
    parallelize_from_generated(model, tp2, EXAMPLES / "llama_tp2")
    assert model.lm_head.weight.to_local().shape == (weight.shape[0] // 2, weight.shape[1])
    assert tuple(model.lm_head.weight.placements) == (Shard(0),)  # the plan's, kept


def test_tp1_is_an_exact_noop_and_second_call_refused(fake_world) -> None:
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    from hpcodegen.runtime import MeshContext, parallelize_from_generated

    fake_world(2)
    mesh = init_device_mesh("cpu", (2, 1), mesh_dim_names=("dp", "tp"))
    ref, model = build_pair("llama_tp2")
    before = _params(model)
    info = parallelize_from_generated(model, MeshContext(mesh), EXAMPLES / "llama_tp2",
                                      hf_config=ref.config)  # a PretrainedConfig works too
    assert info == {}
    assert _params(model) == before
    assert not any("forward" in vars(m) for m in model.modules())
    assert all(type(m)._hp_tp.__class__.__name__ == "IdentityTP"
               for m in model.modules() if hasattr(type(m), "_hp_tp"))
    ids, _ = batch(ref.config.vocab_size)
    assert torch.equal(ref(input_ids=ids).logits, model(input_ids=ids).logits)
    with pytest.raises(PlanError) as second:
        parallelize_from_generated(model, mesh, EXAMPLES / "llama_tp2")
    assert _codes(second.value) == ["runtime.second_call"]


def test_same_architecture_other_shape_refused(tp2) -> None:
    from hpcodegen.runtime import parallelize_from_generated

    _, model = build_pair("llama_tp2")
    config = {**hf_config("llama_tp2"), "num_hidden_layers": 3}
    with pytest.raises(PlanError) as info:
        parallelize_from_generated(model, tp2, EXAMPLES / "llama_tp2", hf_config=config)
    assert "num_hidden_layers" in str(info.value)


def test_api_misuse_is_a_clear_error_not_a_type_error(tp2) -> None:
    """Wrong argument types give InputError/PlanError naming the argument, model untouched."""
    from hpcodegen.errors import InputError
    from hpcodegen.runtime import MeshContext, parallelize_from_generated

    _, model = build_pair("llama_tp2")
    art = EXAMPLES / "llama_tp2"
    before = _params(model)
    cases = [((None, tp2, art), {}, PlanError, "runtime.bad_model"),
             ((model, None, art), {}, PlanError, "runtime.bad_mesh"),
             ((model, MeshContext(None), art), {}, PlanError, "runtime.bad_mesh"),
             ((model, MeshContext(tp2, fsdp_mesh="dp"), art), {}, PlanError,
              "runtime.bad_mesh"),
             ((model, tp2, None), {}, InputError, "load.bad_path"),
             ((model, tp2, art), {"hf_config": 5}, PlanError, "runtime.bad_hf_config")]
    for args, kwargs, kind, code in cases:
        with pytest.raises(kind) as info:
            parallelize_from_generated(*args, **kwargs)
        assert _codes(info.value) == [code], info.value
    assert _params(model) == before


def test_mesh_without_plan_axes_warns_and_installs_nothing(fake_world) -> None:
    """A ("dp",) mesh for a tp artifact: the documented no-op, but never a silent one."""
    import warnings

    from torch.distributed.device_mesh import init_device_mesh

    from hpcodegen.runtime import parallelize_from_generated

    fake_world(2)
    _, model = build_pair("llama_tp2")
    before = _params(model)
    dp = init_device_mesh("cpu", (2,), mesh_dim_names=("dp",))
    with pytest.warns(UserWarning, match=r"has none of the artifact's axes \('tp',\)"):
        assert parallelize_from_generated(model, dp, EXAMPLES / "llama_tp2") == {}
    assert _params(model) == before
    _, other = build_pair("llama_tp2")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*none of the artifact's axes")  # tp=1: silent
        tp1 = init_device_mesh("cpu", (2, 1), mesh_dim_names=("dp", "tp"))
        assert parallelize_from_generated(other, tp1, EXAMPLES / "llama_tp2") == {}


def test_without_a_config_another_model_class_is_refused(tp2) -> None:
    """``Artifact.load(dir)`` with no config, then ``.parallelize``: a Llama plan on a
    Qwen3 model is refused by the model in hand, untouched."""
    from hpcodegen.runtime.artifact import Artifact

    _, model = build_pair("qwen3_tp2")
    before = _params(model)
    with pytest.raises(PlanError) as info:
        Artifact.load(EXAMPLES / "llama_tp2").parallelize(model, tp2)
    assert _codes(info.value) == ["runtime.model_class"]
    assert "LlamaForCausalLM" in str(info.value) and "Qwen3ForCausalLM" in str(info.value)
    assert _params(model) == before


def test_without_a_config_an_uncovered_parameter_is_refused(tp2) -> None:
    """The same class, but a trainable parameter the plan does not cover (a parameter
    left out of the plan): refused, naming it, before anything is mutated."""
    import torch

    from hpcodegen.runtime.artifact import Artifact

    _, model = build_pair("llama_tp2")
    model.model.layers[0].self_attn.register_parameter(
        "extra_scale", torch.nn.Parameter(torch.ones(4)))
    before = _params(model)
    with pytest.raises(PlanError) as info:
        Artifact.load(EXAMPLES / "llama_tp2").parallelize(model, tp2)
    assert _codes(info.value) == ["runtime.uncovered_param"]
    assert "model.layers.0.self_attn.extra_scale" in str(info.value)
    assert _params(model) == before
