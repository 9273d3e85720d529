"""``forward_source`` reads a class's forward once (hpcodegen/generate/seeds/module_facts.py):
the cached text is the class's, shared by its instances, and read again once a method it was
read from is replaced on the class (CPU, one process, tiny modules)."""

from __future__ import annotations

import torch
from torch import nn

from hpcodegen.generate.seeds.module_facts import forward_source, fused_blocks


def _block_class() -> type:
    """A fresh class per test: the cache is keyed by the class."""

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(4, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self._half(self.proj(x))

        def _half(self, y: torch.Tensor) -> torch.Tensor:
            a, b = y.chunk(2, dim=-1)
            return a * b

    return Block


def test_the_source_holds_the_forward_and_the_methods_it_calls() -> None:
    block = _block_class()()
    text = forward_source(block)
    assert "def forward" in text and "def _half" in text
    assert fused_blocks(block) == 2


def test_instances_of_one_class_share_the_text_read_once() -> None:
    cls = _block_class()
    assert forward_source(cls()) is forward_source(cls())


def test_a_method_replaced_on_the_class_is_read_again() -> None:
    cls = _block_class()
    block = cls()
    assert fused_blocks(block) == 2

    def _half(self: nn.Module, y: torch.Tensor) -> torch.Tensor:
        a, b, c = y.chunk(3, dim=-1)
        return a * b * c

    cls._half = _half
    assert "chunk(3" in forward_source(block)
    assert fused_blocks(block) == 3
