"""A fake process group of the plan's mesh sizes and the mesh of its live axes.

torch's ``fake`` backend answers every collective without ranks, so one process can run a
DTensor program as rank 0 of any world. Only axes of size > 1 are meshed: a placement over
an axis of one rank moves nothing, so it is no part of what is derived.
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


@contextmanager
def fake_mesh(axes: Mapping[str, int]) -> Iterator[Any]:
    """A ``DeviceMesh`` named by ``axes`` over a fake world of their product; the process
    group is destroyed on exit. Refused (RuntimeError) when one is already initialized:
    a live run must not be replaced by a fake one."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RuntimeError("a process group is already initialized in this process")
    dist.init_process_group("fake", rank=0, world_size=math.prod(axes.values()),
                            store=FakeStore())
    try:
        yield init_device_mesh("cpu", tuple(axes.values()), mesh_dim_names=tuple(axes))
    finally:
        dist.destroy_process_group()
