"""Each rank reads only its shards: slices by the plan's placements, sharded files with an
index, tied weights read once, clear errors for broken or mismatched files (in-process;
the tp slices run on torch's fake process group, which needs no communication here)."""

from __future__ import annotations

import json

import pytest

from hpcodegen.errors import PlanError

pytestmark = pytest.mark.timeout(400)


class Tied:
    """embed (8x4) tied to head, plus an untied projection: a miniature LM."""

    def __new__(cls):
        import torch

        class M(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.embed = torch.nn.Embedding(8, 4)
                self.proj = torch.nn.Linear(4, 6, bias=True)
                self.head = torch.nn.Linear(4, 8, bias=False)
                self.head.weight = self.embed.weight

        return M()


def _state():
    import torch

    gen = torch.Generator().manual_seed(3)
    return {"embed.weight": torch.randn(8, 4, generator=gen),
            "proj.weight": torch.randn(6, 4, generator=gen),
            "proj.bias": torch.randn(6, generator=gen)}


def _load(directory, placements=None, mesh=None):
    import torch

    from hpcodegen.checkpoint import ShardLayout, materialize, parameters_on_meta
    from hpcodegen.checkpoint.layout import ParamSpec, global_shapes
    from hpcodegen.checkpoint.safetensors_io import SafetensorsCheckpoint

    with parameters_on_meta():
        model = Tied()
    assert all(p.is_meta for p in model.parameters())
    layout = ShardLayout.from_model(model, global_shapes(model), None)
    if placements:
        layout.mesh = mesh
        layout.params = {f: ParamSpec(s.global_shape, placements.get(f, ()), mesh)
                         for f, s in layout.params.items()}
        for fqn in layout.params:  # what the runtime's Phase A leaves: local meta shards
            owner, name = fqn.rsplit(".", 1)
            param = torch.nn.Parameter(torch.empty(layout.local_shape(fqn), device="meta"))
            setattr(model.get_submodule(owner), name, param)
        model.head.weight = model.embed.weight
    materialize(model, layout, dtype=torch.float32, device="cpu",
                checkpoint=SafetensorsCheckpoint(directory))
    return model, layout


def test_single_file_tied_read_once(tmp_path) -> None:
    import torch
    from safetensors.torch import save_file

    state = _state()
    save_file(state, str(tmp_path / "model.safetensors"))
    model, layout = _load(tmp_path)
    assert layout.aliases == {"head.weight": "embed.weight"}
    assert model.head.weight is model.embed.weight
    for name, value in state.items():
        assert torch.equal(model.get_parameter(name), value)


def test_sharded_files_with_index(tmp_path) -> None:
    import torch
    from safetensors.torch import save_file

    state = _state()
    save_file({"embed.weight": state["embed.weight"]}, str(tmp_path / "a.safetensors"))
    save_file({k: state[k] for k in ("proj.weight", "proj.bias")},
              str(tmp_path / "b.safetensors"))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "embed.weight": "a.safetensors", "proj.weight": "b.safetensors",
        "proj.bias": "b.safetensors"}}))
    model, _ = _load(tmp_path)
    assert torch.equal(model.proj.bias, state["proj.bias"])


@pytest.mark.parametrize("rank", [0, 1, 2, 3])
def test_rank_slices_follow_placements(tmp_path, fake_world, rank) -> None:
    """S(0) rows and S(1) columns of a 4-way mesh, uneven (6 rows over 4 ranks)."""
    import torch
    from safetensors.torch import save_file
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard

    fake_world(4, rank)
    mesh = init_device_mesh("cpu", (4,), mesh_dim_names=("tp",))
    state = _state()
    save_file(state, str(tmp_path / "model.safetensors"))
    model, _ = _load(tmp_path, {"embed.weight": (Shard(1),), "proj.weight": (Shard(0),),
                                "proj.bias": (Replicate(),)}, mesh)
    assert torch.equal(model.embed.weight, state["embed.weight"][:, rank:rank + 1])
    rows = torch.tensor_split(torch.arange(6), [2, 4, 6])[rank]  # torch: ceil(6/4)=2 each
    assert torch.equal(model.proj.weight, state["proj.weight"][rows])
    assert torch.equal(model.proj.bias, state["proj.bias"])


def test_garbage_safetensors_names_the_file(tmp_path) -> None:
    bad = tmp_path / "model.safetensors"
    bad.write_bytes(b"\xff" * 64)
    with pytest.raises(PlanError) as info:
        _load(tmp_path)
    (f,) = info.value.findings
    assert f.code == "launch.weights_unreadable" and f.file == str(bad)
    assert "not a readable safetensors file" in f.message


def test_shape_mismatch_lists_the_tensors(tmp_path) -> None:
    import torch
    from safetensors.torch import save_file

    save_file({**_state(), "proj.weight": torch.zeros(3, 3)}, str(tmp_path / "m.safetensors"))
    with pytest.raises(PlanError) as info:
        _load(tmp_path)
    (f,) = info.value.findings
    assert f.code == "launch.weights_shape"
    assert "proj.weight: file (3, 3), model (6, 4)" in f.message and "bias" not in f.message


def test_missing_and_unexpected_tensors(tmp_path) -> None:
    import torch
    from safetensors.torch import save_file

    state = _state()
    del state["proj.bias"]
    save_file({**state, "extra.weight": torch.zeros(1)}, str(tmp_path / "m.safetensors"))
    with pytest.raises(PlanError) as info:
        _load(tmp_path)
    (f,) = info.value.findings
    assert f.code == "launch.weights"
    assert "missing ['proj.bias']" in f.message and "unexpected ['extra.weight']" in f.message


def test_index_naming_a_missing_file(tmp_path) -> None:
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"embed.weight": "nope.safetensors"}}))
    with pytest.raises(PlanError) as info:
        _load(tmp_path)
    assert info.value.findings[0].code == "launch.weights_index"


def test_reads_in_row_blocks_equal_the_slice(tmp_path, monkeypatch) -> None:
    """Blocks of a few rows (each its own safe_open) assemble the exact slice, any dtype."""
    import torch
    from safetensors.torch import save_file

    from hpcodegen.checkpoint import safetensors_io

    monkeypatch.setattr(safetensors_io, "CHUNK_BYTES", 200)
    t = torch.randn(37, 29, generator=torch.Generator().manual_seed(2))
    save_file({"t": t, "s": torch.tensor(3.0), "e": torch.zeros(0, 4)},
              str(tmp_path / "m.safetensors"))
    ckpt = safetensors_io.SafetensorsCheckpoint(tmp_path)
    assert ckpt.total_bytes() == t.numel() * 4 + 4
    assert torch.equal(ckpt.read("t"), t)
    assert torch.equal(ckpt.read("t", (slice(5, 31), slice(3, 17))), t[5:31, 3:17])
    assert torch.equal(ckpt.read("s"), torch.tensor(3.0))
    assert ckpt.read("e").shape == (0, 4)
    assert torch.equal(ckpt.read("t", dtype=torch.bfloat16), t.to(torch.bfloat16))
