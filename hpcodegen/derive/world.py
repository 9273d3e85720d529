"""A fake process group of the plan's mesh sizes and the mesh of its live axes.

torch's ``fake`` backend answers every collective without ranks, so one process can run a
DTensor program as any rank of any world. Only axes of size > 1 are meshed: a placement over
an axis of one rank moves nothing, so it is no part of what is derived.

This module is the one place a fake world is started (derive, the tests' ``fake_world``
fixture, the benches): :func:`start_fake_world` / :func:`end_world` for a caller that keeps the
group across steps, :func:`start_fake_mesh` for its mesh, :func:`fake_mesh` for a scoped one.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any


def live_axes(sizes: Mapping[str, int], order: tuple[str, ...] = ()) -> dict[str, int]:
    """``{axis: size}`` of the axes with more than one rank, in ``order`` first."""
    names = [*order, *(a for a in sizes if a not in order)]
    return {a: int(sizes[a]) for a in names if a in sizes and int(sizes[a]) > 1}


def start_fake_world(world: int, rank: int = 0) -> None:
    """Start the default process group on torch's ``fake`` backend: ``world`` ranks, this
    process ``rank``. Refused (RuntimeError) when one is already initialized: a live run
    must not be replaced by a fake one (a caller that means to replace its own fake group
    calls :func:`end_world` first)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RuntimeError("a process group is already initialized in this process")
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is outside a world of {world} rank(s)")
    dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())


def start_fake_mesh(axes: Mapping[str, int], rank: int = 0, device: str = "cpu") -> Any:
    """:func:`start_fake_world` of the product of ``axes``, and the ``DeviceMesh`` named by
    them on ``device`` (the group stays up: :func:`end_world` ends it)."""
    from torch.distributed.device_mesh import init_device_mesh

    start_fake_world(math.prod(axes.values()), rank)
    try:
        return init_device_mesh(device, tuple(axes.values()), mesh_dim_names=tuple(axes))
    except BaseException:
        end_world()
        raise


def end_world() -> None:
    """Destroy the default process group if one is up (whatever its backend)."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


@contextmanager
def fake_mesh(axes: Mapping[str, int], rank: int = 0, device: str = "cpu") -> Iterator[Any]:
    """:func:`start_fake_mesh` for the ``with`` block; the process group is destroyed on
    exit. Refused like :func:`start_fake_world` when a group is already up."""
    mesh = start_fake_mesh(axes, rank, device)
    try:
        yield mesh
    finally:
        end_world()
