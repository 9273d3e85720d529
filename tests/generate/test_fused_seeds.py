"""The row order of a fused projection read from the traced forward
(hpcodegen/generate/seeds/fused_seeds.py): each verdict once found, once not.

Tiny torch modules on the meta device, one process; the families whose rule files this
replaced (GPT-2, OpenAI-GPT, Persimmon, Falcon, GPT-NeoX Japanese) are checked in
test_families_rules_a/b, their numerics in tests/runtime/test_family_parity*.py.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from hpcodegen.errors import PlanError
from hpcodegen.generate.seeds.fused_seeds import fused_seeds
from hpcodegen.generate.seeds.pair_seeds import seed_flow
from hpcodegen.generate.sources.styles import Kind

WIDTH, HEADS, HD = 8, 2, 4


class Fused(nn.Module):
    """One fused q|k|v projection and an output projection; ``how`` picks what the forward
    does with the fused output."""

    def __init__(self, how: str, rows: int = 3 * WIDTH) -> None:
        super().__init__()
        self.how, self.num_heads = how, HEADS
        self.split_size = WIDTH
        self.qkv, self.out = nn.Linear(WIDTH, rows), nn.Linear(WIDTH, WIDTH)
        if how == "returns_bias":
            self.out_bias = nn.Parameter(torch.zeros(WIDTH))

    def forward(self, hidden_states: Any, per_head: Any = None) -> Any:
        fused = self.qkv(hidden_states)
        b, s, _ = fused.shape
        if self.how in ("blocks", "per_head_input"):  # q|k|v: three equal blocks
            q, k, v = fused.split(self.split_size, dim=-1)
        elif self.how == "unequal":  # one k/v head, q the rest (multi-query)
            q, k, v = fused.split([WIDTH, HD, HD], dim=-1)
            k, v = k.repeat(1, 1, HEADS), v.repeat(1, 1, HEADS)
        elif self.how == "across":  # heads+2 groups, the last two k and v
            g = fused.view(b, s, -1, HD)
            q, k, v = g[..., :HEADS, :], g[..., [-2], :], g[..., [-1], :]
            q, k, v = (x.reshape(b, s, -1) if x.shape[2] == HEADS
                       else x.expand(b, s, HEADS, HD).reshape(b, s, -1) for x in (q, k, v))
        elif self.how == "constant":  # two groups whatever the heads (CodeGen's mp_num)
            g = fused.view(b, s, 2, -1)
            q, k, v = (x.reshape(b, s, -1) for x in g.split(g.shape[-1] // 3, dim=-1))
        else:  # per head [q, k, v]
            g = fused.view(b, s, self.num_heads, 3, HD)
            q, k, v = (g[..., i, :].reshape(b, s, -1) for i in range(3))
        scores = (q * k).sum(-1, keepdim=True)
        if per_head is not None:
            scores = scores + per_head.sum()
        out = self.out(scores * v)
        return (out, self.out_bias) if self.how == "returns_bias" else out


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc, self.proj = nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x: Any) -> Any:
        return self.proj(nn.functional.gelu(self.fc(x)))


class Tiny(nn.Module):
    """Token ids -> embedding -> the block (what the tracer's forward calls)."""

    def __init__(self, block: nn.Module, per_head: bool = False) -> None:
        super().__init__()
        self.embed, self.block, self.per_head = nn.Embedding(16, WIDTH), block, per_head

    def forward(self, input_ids: Any) -> Any:
        h = self.embed(input_ids)
        if self.per_head:  # a bias built by the model for all heads (ALiBi's shape)
            return self.block(h, per_head=torch.zeros(HEADS, 1, h.shape[1]))
        out = self.block(h)
        return out[0] + out[1] if isinstance(out, tuple) else out


def _seeds(block: Any, sp: bool = False, per_head: bool = False) -> Any:
    """fused_seeds of ``block()`` (built on meta, as generate's model) inside :class:`Tiny`."""
    with torch.device("meta"):
        model = Tiny(block(), per_head)
    return fused_seeds(model, (), sp, seed_flow(model))


def test_equal_blocks_on_the_last_dim_are_packed() -> None:
    found = _seeds(lambda: Fused("blocks"))
    qkv, out = found.assignments["block.qkv"], found.assignments["block.out"]
    assert (qkv.kind, qkv.factor, qkv.style) == (Kind.COLWISE, 3, "packed_colwise:3")
    assert out.kind is Kind.ROWWISE
    assert found.divide["block"] == ["num_heads", "split_size"]  # the block's size too


def test_rows_interleaved_per_head_are_a_plain_colwise() -> None:
    found = _seeds(lambda: Fused("per_head"))
    qkv = found.assignments["block.qkv"]
    assert (qkv.kind, qkv.factor, qkv.style) == (Kind.COLWISE, 1, "colwise")
    assert found.divide["block"] == ["num_heads"] and not found.kept


@pytest.mark.parametrize(("how", "why"), [
    ("unequal", "cuts its fused output into blocks [8, 4, 4]"),
    ("across", "cuts the 4 groups of its fused output apart")])
def test_unequal_blocks_or_a_cut_across_the_groups_keep_the_block_whole(how: str,
                                                                       why: str) -> None:
    found = _seeds(lambda: Fused(how, rows=WIDTH + 2 * HD))
    assert not found.assignments and why in found.kept["block"]


def test_a_per_head_input_built_outside_keeps_the_block_whole() -> None:
    found = _seeds(lambda: Fused("per_head_input"), per_head=True)
    assert not found.assignments
    assert "its input per_head [2, 1, 11] holds one entry per head" in found.kept["block"]


def test_a_projection_the_forward_does_not_cut_is_left_to_the_structural_seeds() -> None:
    found = _seeds(Mlp)
    assert not found.assignments and not found.kept and not found.divide


def test_a_returned_parameter_keeps_its_full_gradient_and_refuses_sp() -> None:
    found = _seeds(lambda: Fused("returns_bias"))
    bias = found.assignments["block.out_bias"]
    assert bias.param and bias.kind is Kind.REPLICATE and found.returned == ["block.out_bias"]
    assert _seeds(lambda: Fused("per_head")).returned == []  # no parameter of its own: nothing
    with pytest.raises(PlanError, match=r"block\.out_bias: with sequence parallelism"):
        _seeds(lambda: Fused("returns_bias"), sp=True)


def test_a_rank_reading_its_rows_otherwise_leaves_the_block_to_the_structural_seeds() -> None:
    """Two groups from a constant, not a head count the plan divides: a rank's copy views
    its half of the rows into two groups of half the width, so no split is named."""
    found = _seeds(lambda: Fused("constant"))
    assert not found.assignments and not found.kept
    assert _seeds(lambda: Fused("per_head")).assignments  # the same rows per head: split


class ModelLinear(nn.Linear):
    """A Linear class the modeling file defines (its forward is generated once)."""


ModelLinear.__module__ = "transformers.models.tiny.modeling_tiny"


def test_a_block_kept_whole_is_left_to_the_other_seeds_unless_its_class_is_split_elsewhere(
        ) -> None:
    from hpcodegen.generate.sources.hf_plan import Assignment

    def plan(cls: type) -> tuple[Any, dict, dict]:
        root = nn.Module()
        root.attn, root.mlp = nn.Module(), nn.Module()
        root.attn.qkv, root.attn.out = cls(8, 16), cls(8, 8)
        root.mlp.fc = cls(8, 32)
        region = {"mlp.fc": Assignment("mlp.fc", Kind.COLWISE, 1, "colwise", "x")}
        gathered = {"attn.qkv": Assignment("attn.qkv", Kind.COLWISE_GATHER, 1, "g", "x"),
                    "attn.out": Assignment("attn.out", Kind.ROWWISE_SPLIT, 1, "r", "x")}
        return root, region, gathered

    found = fused_seeds(nn.Module(), (), False, None)
    found.kept["attn"] = "why"
    root, region, gathered = plan(ModelLinear)  # one class in a region and gathered
    assert found.settle(root, region, gathered) == {} and "attn" in found.kept
    root, region, gathered = plan(nn.Linear)  # torch's Linear: wrapped per instance
    assert found.settle(root, region, gathered) == gathered and "attn" not in found.kept
