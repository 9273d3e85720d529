"""The mesh a launch builds from the artifact, and the world sizes it refuses (pure)."""

from __future__ import annotations

import pytest

from hpcodegen.errors import EXIT_USAGE, UsageError
from hpcodegen.launch.rank.mesh import resolve_mesh_layout
from hpcodegen.plan.codec import plan_from_meta


def _meta(**dims: int) -> dict:
    names = [a for a in ("cp", "tp") if dims.get(f"{a}_size", 1) > 1]
    return {"parallel_dims": dims, "mesh_dim_names": names}


@pytest.mark.parametrize(("dims", "world", "names", "sizes"), [
    ({"tp_size": 2}, 2, ("dp", "tp"), (1, 2)),
    ({"tp_size": 2}, 8, ("dp", "tp"), (4, 2)),
    ({"tp_size": 2, "cp_size": 2}, 8, ("dp", "cp", "tp"), (2, 2, 2)),
    ({"tp_size": 1}, 3, ("dp",), (3,)),
])
def test_dp_takes_the_rest_of_the_world(dims, world, names, sizes):
    layout = resolve_mesh_layout(plan_from_meta(_meta(**dims)), world)
    assert (layout.names, layout.sizes) == (names, sizes)
    assert layout.world_size == world


def test_plan_axes_follow_the_live_order():
    meta = {"parallel_dims": {"tp_size": 2, "cp_size": 2}, "mesh_dim_names": ["tp", "cp"]}
    assert resolve_mesh_layout(plan_from_meta(meta), 4).plan_axes == ("cp", "tp")


@pytest.mark.parametrize("world", [1, 3, 6])
def test_impossible_world_size_is_a_usage_error(world):
    with pytest.raises(UsageError) as info:
        resolve_mesh_layout(plan_from_meta(_meta(tp_size=4)), world)
    assert info.value.exit_code == EXIT_USAGE
    assert f"world size {world}" in str(info.value)
    assert "multiple of 4" in str(info.value)


def test_pipeline_stages_are_refused():
    with pytest.raises(UsageError, match="pp_size=2"):
        resolve_mesh_layout(plan_from_meta({"parallel_dims": {"tp_size": 2, "pp_size": 2}}),
                            4)
