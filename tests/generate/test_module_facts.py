"""The module-tree facts generate reads (hpcodegen/generate/seeds/module_facts.py): each once
found, once not, on tiny torch modules (CPU, one process)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hpcodegen.generate.seeds.module_facts import is_lookup_embedding
from hpcodegen.tracer.norms import is_norm


class FamilyRMSNorm(nn.Module):
    """transformers' RMSNorm pattern: its own class, a weight, no torch base."""

    def __init__(self, affine: bool = True) -> None:
        super().__init__()
        if affine:
            self.weight = nn.Parameter(torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.weight * x if hasattr(self, "weight") else x


class Scale(nn.Module):
    """Named nothing like a norm, but one (decided by its forward, not its name)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (1 + self.weight) * (x - x.mean(-1, keepdim=True))


class ScaleRMSNorm(nn.Module):
    """Named a norm, but it only scales (no reduction over the last dim): not one."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * x


class LayerNorm1P(nn.LayerNorm):
    """Nemotron's: torch's LayerNorm under another name."""


class NormHead(nn.Module):
    """A weight and "Norm" in the name, but a projection (Baichuan's head)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(8, 4))


@pytest.mark.parametrize("module", [nn.LayerNorm(4), FamilyRMSNorm(), LayerNorm1P(4),
                                    nn.RMSNorm(4), Scale()], ids=lambda m: type(m).__name__)
def test_norms_holding_a_weight_are_norms(module: nn.Module) -> None:
    assert is_norm(module)


@pytest.mark.parametrize("module", [FamilyRMSNorm(affine=False),
                                    nn.LayerNorm(4, elementwise_affine=False), NormHead(),
                                    nn.GroupNorm(2, 4), nn.Linear(4, 4), ScaleRMSNorm()],
                         ids=["rmsnorm_without_weight", "layernorm_without_weight",
                              "norm_head", "groupnorm", "linear", "scale_named_norm"])
def test_other_modules_are_not(module: nn.Module) -> None:
    assert not is_norm(module)


def test_a_lookup_embedding_is_an_nn_embedding_or_subclass() -> None:
    class ScaledEmbedding(nn.Embedding):
        pass

    class Embedding(nn.Module):  # the name alone is not enough
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(8, 4))

    assert is_lookup_embedding(nn.Embedding(8, 4)) and is_lookup_embedding(ScaledEmbedding(8, 4))
    assert not is_lookup_embedding(Embedding()) and not is_lookup_embedding(nn.Linear(4, 8))


class GatedChunk(nn.Module):
    """``gate, up = proj(x).chunk(2, dim=-1)`` in a helper the forward calls."""

    def __init__(self) -> None:
        super().__init__()
        self.gate_up = nn.Linear(4, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._act(self.gate_up(x))

    def _act(self, h: torch.Tensor) -> torch.Tensor:
        gate, up = h.chunk(2, dim=-1)
        return gate * up


class ChunkOnBatch(nn.Module):
    """A chunk along dim 0 (the batch): not a fused projection's blocks."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = x.chunk(2, dim=0)
        return a + b


class TwoCounts(nn.Module):
    """Two different counts on the last dim: ambiguous."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, _ = torch.chunk(x, 2, -1)
        c, _, _ = torch.chunk(x, 3, -1)
        return b + c


def test_fused_blocks_reads_the_last_dim_chunk_count_of_the_forward() -> None:
    from hpcodegen.generate.seeds.module_facts import fused_blocks

    assert fused_blocks(GatedChunk()) == 2  # found through a method the forward calls
    assert fused_blocks(ChunkOnBatch()) == 1  # the batch dim is not a projection's blocks
    assert fused_blocks(TwoCounts()) == 1  # ambiguous counts: nothing assumed
    assert fused_blocks(nn.Linear(4, 4)) == 1  # no chunk at all
