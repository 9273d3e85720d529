"""``Artifact.load(art).from_pretrained(dir, mesh=...)``: what it reads and what it refuses.

Each refusal is an hpcodegen error naming what was expected, raised before anything is
built: a directory without a config or without weights, a config of another model (or of
the same model in another shape), a mesh without the plan's axes or with other sizes, a
Hub id that is not in the local cache. A cached Hub id resolves with no network. Run as
rank 0 of a fake 4-rank world: rank 0 reads its own shards, and only those.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from hpcodegen.errors import InputError, PlanError

REPO = Path(__file__).resolve().parents[2]
ARTIFACT = REPO / "examples" / "llama_tp2"
CONFIGS = REPO / "examples" / "configs"


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> Path:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    out = tmp_path_factory.mktemp("hf") / "tiny-llama"
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(CONFIGS / "llama"))
    model.save_pretrained(out)
    return out


def _mesh(fake_world, shape: tuple[int, ...], names: tuple[str, ...]):
    from torch.distributed.device_mesh import init_device_mesh

    world = 1
    for size in shape:
        world *= size
    fake_world(world)
    return init_device_mesh("cpu", shape, mesh_dim_names=names)


def _local(param):
    from torch.distributed.tensor import DTensor

    return param.to_local() if isinstance(param, DTensor) else param


def _load(directory, mesh):
    import hpcodegen

    return hpcodegen.Artifact.load(ARTIFACT).from_pretrained(directory, mesh=mesh)


def test_rank_zero_holds_its_shards_of_the_saved_weights(fake_world, hf_dir) -> None:
    import torch
    from safetensors.torch import load_file

    model = _load(hf_dir, _mesh(fake_world, (2, 2), ("dp", "tp")))
    saved = load_file(hf_dir / "model.safetensors")
    q = _local(model.get_parameter("model.layers.0.self_attn.q_proj.weight"))  # S(0)
    assert torch.equal(q, saved["model.layers.0.self_attn.q_proj.weight"][:32])
    down = _local(model.get_parameter("model.layers.1.mlp.down_proj.weight"))  # S(1)
    assert torch.equal(down, saved["model.layers.1.mlp.down_proj.weight"][:, :64])
    norm = _local(model.get_parameter("model.norm.weight"))  # replicated
    assert torch.equal(norm, saved["model.norm.weight"])
    assert not model.training and all(p.dtype == torch.float32 for p in model.parameters())


def test_dtype_is_applied_to_the_floating_point_parameters(fake_world, hf_dir) -> None:
    import torch

    import hpcodegen

    mesh = _mesh(fake_world, (1, 2), ("dp", "tp"))
    model = hpcodegen.Artifact.load(ARTIFACT).from_pretrained(hf_dir, mesh=mesh,
                                                              dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


def test_a_mesh_without_the_plans_axis_is_refused(fake_world, hf_dir) -> None:
    with pytest.raises(PlanError) as info:
        _load(hf_dir, _mesh(fake_world, (4,), ("dp",)))
    (finding,) = info.value.findings
    assert finding.code == "pretrained.mesh_axis_missing"
    assert "'tp'" in finding.message and "tp=2" in finding.message
    assert "'tp' of size 2" in finding.expected


def test_a_mesh_with_another_tp_size_is_refused(fake_world, hf_dir) -> None:
    with pytest.raises(PlanError) as info:
        _load(hf_dir, _mesh(fake_world, (1, 4), ("dp", "tp")))
    (finding,) = info.value.findings
    assert finding.code == "pretrained.mesh_axis_size"
    assert "size 4" in finding.message and finding.expected.startswith("tp of size 2")


def test_a_directory_without_a_config_is_refused(fake_world, hf_dir, tmp_path) -> None:
    shutil.copy(hf_dir / "model.safetensors", tmp_path)
    with pytest.raises(InputError) as info:
        _load(tmp_path, _mesh(fake_world, (2, 2), ("dp", "tp")))
    assert info.value.findings[0].code == "config.not_found"
    assert "config.json" in info.value.findings[0].expected


def test_a_directory_without_weights_is_refused(fake_world, tmp_path) -> None:
    shutil.copy(CONFIGS / "llama" / "config.json", tmp_path)
    with pytest.raises(InputError) as info:
        _load(tmp_path, _mesh(fake_world, (2, 2), ("dp", "tp")))
    (finding,) = info.value.findings
    assert finding.code == "pretrained.no_weights" and "safetensors" in finding.expected


def test_a_missing_directory_is_refused(fake_world, tmp_path) -> None:
    with pytest.raises(InputError) as info:
        _load(tmp_path / "nowhere", _mesh(fake_world, (2, 2), ("dp", "tp")))
    assert info.value.findings[0].code == "pretrained.not_a_dir"


def test_a_config_of_another_model_names_the_artifacts(fake_world, hf_dir, tmp_path) -> None:
    shutil.copy(hf_dir / "model.safetensors", tmp_path)
    shutil.copy(CONFIGS / "qwen3" / "config.json", tmp_path)
    with pytest.raises(PlanError) as info:
        _load(tmp_path, _mesh(fake_world, (2, 2), ("dp", "tp")))
    (finding,) = info.value.findings
    assert finding.code == "runtime.architecture"
    assert "LlamaForCausalLM" in finding.message and "Qwen3ForCausalLM" in finding.message


def test_the_same_model_in_another_shape_is_refused(fake_world, hf_dir, tmp_path) -> None:
    shutil.copy(hf_dir / "model.safetensors", tmp_path)
    config = json.loads((hf_dir / "config.json").read_text())
    config["num_hidden_layers"] = 3
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(PlanError) as info:
        _load(tmp_path, _mesh(fake_world, (2, 2), ("dp", "tp")))
    assert {f.code.split(".")[0] for f in info.value.findings} == {"signature"}


def test_a_hub_id_not_in_the_local_cache_is_refused(fake_world, tmp_path,
                                                    monkeypatch) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(InputError) as info:
        _load("nobody-here/tiny-llama", _mesh(fake_world, (2, 2), ("dp", "tp")))
    assert info.value.findings[0].code == "config.hub_not_cached"


def test_a_hub_id_in_the_local_cache_resolves_without_network(fake_world, hf_dir, tmp_path,
                                                              monkeypatch) -> None:
    """The cache layout huggingface_hub writes: ``models--org--name/refs/main`` names a
    snapshot holding the files."""
    import torch
    from huggingface_hub import constants
    from safetensors.torch import load_file

    repo = tmp_path / "models--someone--tiny-llama"
    snapshot = repo / "snapshots" / ("0" * 40)
    shutil.copytree(hf_dir, snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = _load("someone/tiny-llama", _mesh(fake_world, (2, 2), ("dp", "tp")))
    saved = load_file(hf_dir / "model.safetensors")["model.layers.0.self_attn.q_proj.weight"]
    q = _local(model.get_parameter("model.layers.0.self_attn.q_proj.weight"))
    assert torch.equal(q, saved[:32])
