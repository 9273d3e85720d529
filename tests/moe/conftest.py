"""Fixtures of the MoE tests: a fake process group and the example llama config dir."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

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


@pytest.fixture(scope="session")
def llama_model_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "examples" / "configs" / "llama"
