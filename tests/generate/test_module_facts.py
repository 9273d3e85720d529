"""The module-tree facts generate reads (hpcodegen/generate/module_facts.py): each once
found, once not, on tiny torch modules (CPU, one process)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hpcodegen.generate.module_facts import is_lookup_embedding, is_norm


class FamilyRMSNorm(nn.Module):
    """transformers' RMSNorm pattern: its own class, a weight, no torch base."""

    def __init__(self, affine: bool = True) -> None:
        super().__init__()
        if affine:
            self.weight = nn.Parameter(torch.ones(4))


class LayerNorm1P(nn.LayerNorm):
    """Nemotron's: torch's LayerNorm under another name."""


class NormHead(nn.Module):
    """A weight and "Norm" in the name, but a projection (Baichuan's head)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(8, 4))


@pytest.mark.parametrize("module", [nn.LayerNorm(4), FamilyRMSNorm(), LayerNorm1P(4),
                                    nn.RMSNorm(4)], ids=lambda m: type(m).__name__)
def test_norms_holding_a_weight_are_norms(module: nn.Module) -> None:
    assert is_norm(module)


@pytest.mark.parametrize("module", [FamilyRMSNorm(affine=False),
                                    nn.LayerNorm(4, elementwise_affine=False), NormHead(),
                                    nn.GroupNorm(2, 4), nn.Linear(4, 4)],
                         ids=["rmsnorm_without_weight", "layernorm_without_weight",
                              "norm_head", "groupnorm", "linear"])
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
