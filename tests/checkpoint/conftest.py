"""Shared fixtures: a fake process group (one process, world 2 or 4) for counting tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest


@pytest.fixture
def fake_world() -> Iterator[Callable[[int], None]]:
    """``init(world)`` starts a fake process group of that size as rank 0; torn down after."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    def init(world: int) -> None:
        dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())

    yield init
    if dist.is_initialized():
        dist.destroy_process_group()
