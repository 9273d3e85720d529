"""The one fake process group helper (:mod:`hpcodegen.derive.world`), on torch's real
``fake`` backend: the world it starts, the mesh it names, what it refuses, what it ends."""

from __future__ import annotations

import pytest

from hpcodegen.derive.world import (
    end_world,
    fake_mesh,
    live_axes,
    start_fake_mesh,
    start_fake_world,
)


@pytest.fixture(autouse=True)
def _no_group_left() -> None:
    """Each case starts and leaves the process without a default group."""
    import torch.distributed as dist

    assert not dist.is_initialized()
    yield
    end_world()


def test_start_fake_world_is_that_rank_of_that_world() -> None:
    import torch.distributed as dist

    start_fake_world(8, rank=5)
    assert (dist.get_backend(), dist.get_world_size(), dist.get_rank()) == ("fake", 8, 5)
    end_world()
    assert not dist.is_initialized()


def test_a_live_group_is_never_replaced() -> None:
    start_fake_world(2)
    with pytest.raises(RuntimeError, match="already initialized"):
        start_fake_world(4)
    with pytest.raises(RuntimeError, match="already initialized"), fake_mesh({"tp": 2}):
        pass
    import torch.distributed as dist

    assert dist.get_world_size() == 2  # the first group is still the one up


def test_a_rank_outside_the_world_is_refused() -> None:
    import torch.distributed as dist

    with pytest.raises(ValueError, match="rank 4 is outside a world of 4"):
        start_fake_world(4, rank=4)
    assert not dist.is_initialized()


def test_start_fake_mesh_names_the_axes_over_their_product() -> None:
    import torch.distributed as dist

    mesh = start_fake_mesh({"dp": 2, "tp": 3}, rank=4)
    assert mesh.mesh_dim_names == ("dp", "tp") and tuple(mesh.shape) == (2, 3)
    assert dist.get_world_size() == 6
    assert list(mesh.get_coordinate()) == [1, 1]  # rank 4 of a 2 x 3 grid
    assert mesh.device_type == "cpu"


def test_collectives_answer_without_other_ranks() -> None:
    import torch
    from torch.distributed.tensor import DTensor, Shard

    mesh = start_fake_mesh({"tp": 4})
    local = torch.ones(2, 3)
    full = DTensor.from_local(local, mesh, [Shard(0)]).full_tensor()
    assert full.shape == (8, 3)  # gathered from 4 ranks, none of them running


def test_fake_mesh_ends_its_group_on_exit_and_on_error() -> None:
    import torch.distributed as dist

    with fake_mesh({"cp": 2}) as mesh:
        assert mesh.mesh_dim_names == ("cp",) and dist.is_initialized()
    assert not dist.is_initialized()
    with pytest.raises(KeyError), fake_mesh({"cp": 2}):
        raise KeyError("inside")
    assert not dist.is_initialized()


def test_end_world_without_a_group_is_a_no_op() -> None:
    import torch.distributed as dist

    end_world()
    assert not dist.is_initialized()


def test_live_axes_keep_the_split_ones_in_order() -> None:
    assert live_axes({"tp": 2, "dp": 1, "cp": 4}, ("cp",)) == {"cp": 4, "tp": 2}
    assert live_axes({"tp": 1}) == {}
