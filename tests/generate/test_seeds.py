"""The structural seeds (hpcodegen/generate/seeds/seeds.py): each rule once found, once not.

Tiny torch modules on CPU, one process; the families the seeds replace rule files for are
checked in test_families_rules_a/b, test_families_hybrid and test_families_ssm, their
numerics in tests/runtime/test_family_parity*.py.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from hpcodegen.generate.seeds.seeds import (
    SEED_RULE,
    block_assignments,
    block_styles,
    children,
    is_linear,
    kept_reason,
    mlp_styles,
    plans_layers,
    seeds_note,
    structural_seeds,
)
from hpcodegen.generate.sources.styles import Kind
from hpcodegen.tracer.dataflow import Flow, call_flow


def _flow(module: nn.Module, *args: Any) -> Flow:
    """The traced call ``module(*args)`` (CPU tensors): what orders a block's children."""

    def run(watching: Any) -> None:
        with watching:
            module(*args)

    return call_flow(module, run, is_linear)


def _styles(module: nn.Module, by_shape: bool = True) -> dict[str, Kind] | None:
    root = nn.Module()
    root.block = module
    try:
        order = _flow(module, torch.zeros(2, 8)).child_order("")
    except TypeError:  # a forward taking a second tensor (a cross-attention): no order
        order = []
    return block_styles(module, children(dict(root.named_modules()), "block"), by_shape,
                        order)


class Mlp(nn.Module):
    """``fc_out(act(fc_in(x)))``: names no list knows; mirrored shapes, nested calls."""

    def __init__(self, width: int = 8, inner: int = 16) -> None:
        super().__init__()
        self.fc_in, self.fc_out = nn.Linear(width, inner), nn.Linear(inner, width)

    def forward(self, x: Any) -> Any:
        return self.fc_out(nn.functional.gelu(self.fc_in(x)))


class Gated(nn.Module):
    def __init__(self, norm: bool = False) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(8, 16), nn.Linear(8, 16), nn.Linear(16, 8)
        if norm:  # a norm over the whole intermediate: no split can run it on shards
            self.inner_norm = nn.LayerNorm(16)

    def forward(self, x: Any) -> Any:
        h = self.a(x) * self.b(x)
        return self.c(self.inner_norm(h) if hasattr(self, "inner_norm") else h)


class Attention(nn.Module):
    def __init__(self, cross: bool = False, extra: bool = False) -> None:
        super().__init__()
        self.num_heads, self.head_dim = 2, 4
        self.q_proj, self.k_proj = nn.Linear(8, 8), nn.Linear(8, 8)
        self.v_proj, self.o_proj = nn.Linear(8, 8), nn.Linear(8, 8)
        self.q_norm = nn.LayerNorm(4)  # per head: follows the heads
        if extra:
            self.mixer = nn.Conv1d(8, 8, 1)
        if cross:
            self.forward = self.cross_forward  # type: ignore[method-assign]

    def forward(self, hidden_states: Any) -> Any:
        heads = (*hidden_states.shape[:-1], self.num_heads, self.head_dim)
        q = self.q_norm(self.q_proj(hidden_states).view(heads)).flatten(-2)
        return self.o_proj(q * self.k_proj(hidden_states) * self.v_proj(hidden_states))


class CrossAttention(Attention):
    def forward(self, hidden_states: Any, key_value_states: Any = None) -> Any:
        return self.o_proj(self.q_proj(hidden_states) * self.k_proj(key_value_states))


def test_child_order_is_the_order_the_forward_runs_them() -> None:
    """``down(act(gate(x)) * up(x))`` runs gate, up, down: the traced forward's order, not
    the order the children were declared in (down first here)."""

    class Swapped(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.down, self.gate, self.up = nn.Linear(16, 8), nn.Linear(8, 16), nn.Linear(8, 16)

        def forward(self, x: Any) -> Any:
            return self.down(nn.functional.silu(self.gate(x)) * self.up(x))

    root = nn.Module()
    root.mlp = Swapped()
    flow = _flow(root.mlp, torch.zeros(2, 8))
    assert flow.child_order("") == ["gate", "up", "down"]
    assert _styles(Swapped()) == {"gate": Kind.COLWISE, "up": Kind.COLWISE,
                                  "down": Kind.ROWWISE}
    # no trace, no order: the mirrored shapes alone do not say which Linear reads the input
    assert mlp_styles(dict(Mlp().named_children()), ()) is None


def test_an_mlp_is_found_by_its_shapes() -> None:
    assert _styles(Mlp()) == {"fc_in": Kind.COLWISE, "fc_out": Kind.ROWWISE}
    assert _styles(Gated()) == {"a": Kind.COLWISE, "b": Kind.COLWISE, "c": Kind.ROWWISE}
    # same width in and out: not an MLP by shape (only the gathered fallback takes it)
    square = Mlp(8, 8)
    assert mlp_styles(dict(square.named_children()), ["fc_in", "fc_out"]) is None
    assert _styles(square)["fc_in"] is Kind.COLWISE_GATHER


def test_an_attention_splits_by_heads_unless_it_holds_more() -> None:
    assert _styles(Attention()) == {"q_proj": Kind.COLWISE, "k_proj": Kind.COLWISE,
                                    "v_proj": Kind.COLWISE, "o_proj": Kind.ROWWISE}
    # an unknown module between the projections: not a head split (gathered, see below)
    assert _styles(Attention(extra=True), by_shape=False) is None
    assert "mixer" in kept_reason(Attention(extra=True), dict(Attention(extra=True)
                                                              .named_children()))


def test_an_unnamed_output_projection_is_found_by_dataflow() -> None:
    """ModernBERT's ``Wo``: the one other Linear not applied to the input, mapping back to
    the width q/k/v read. Only for seeds; an HF plan's unnamed blocks match by name."""

    class Wo(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.num_heads, self.head_dim = 2, 4
            self.q_proj, self.k_proj = nn.Linear(8, 8), nn.Linear(8, 8)
            self.v_proj, self.Wo = nn.Linear(8, 8), nn.Linear(8, 8)

        def forward(self, hidden_states: Any) -> Any:
            q, k = self.q_proj(hidden_states), self.k_proj(hidden_states)
            return self.Wo(q * k * self.v_proj(hidden_states))

    assert _styles(Wo())["Wo"] is Kind.ROWWISE
    assert _styles(Wo(), by_shape=False) is None


def test_a_cross_attention_is_never_seeded() -> None:
    """Its keys and values come from a second input, whose gradient would stay partial."""
    assert _styles(CrossAttention()) is None
    module = CrossAttention()
    assert "second input" in kept_reason(module, dict(module.named_children()))


def test_projections_around_unsplittable_compute_are_gathered() -> None:
    assert _styles(Gated(norm=True)) == {"a": Kind.COLWISE_GATHER, "b": Kind.COLWISE_GATHER,
                                         "c": Kind.ROWWISE_SPLIT}
    assert _styles(Gated(norm=True), by_shape=False) is None  # HF-plan mode: names only

    class NormFirst(nn.Module):  # the input is read by a norm, not a projection
        def __init__(self) -> None:
            super().__init__()
            self.norm, self.a, self.c = nn.LayerNorm(8), nn.Linear(8, 16), nn.Linear(16, 8)

        def forward(self, x: Any) -> Any:
            return self.c(self.a(self.norm(x)))

    assert _styles(NormFirst()) is None

    class ThreeReaders(nn.Module):  # BERT's self-attention: no output projection of its own
        def __init__(self) -> None:
            super().__init__()
            self.query, self.key, self.value = (nn.Linear(8, 8) for _ in range(3))

        def forward(self, hidden_states: Any) -> Any:
            q, k = self.query(hidden_states), self.key(hidden_states)
            return q * k * self.value(hidden_states)

    assert _styles(ThreeReaders()) is None


class Lm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Module()])
        self.layers[0].attn, self.layers[0].mlp = Attention(), Mlp()
        self.lm_head = nn.Linear(8, 32)

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    def forward(self, x: Any) -> Any:
        h = x + self.layers[0].attn(x)
        return self.lm_head(h + self.layers[0].mlp(h))


def test_seeds_only_where_transformers_plans_no_layer() -> None:
    model = Lm()
    head_only = [("lm_head", "colwise_gather_output")]
    assert not plans_layers(model, head_only)
    seeds = structural_seeds(model, head_only, replaced=False,
                             flow=_flow(model, torch.zeros(2, 8)))
    assert seeds["layers.0.attn.q_proj"].kind is Kind.COLWISE
    assert seeds["layers.0.mlp.fc_out"].kind is Kind.ROWWISE
    assert all(a.rule == SEED_RULE for a in seeds.values())
    assert "structural seeds" in seeds_note(model, seeds)[0]
    # an HF plan naming a layer, or a rule file replacing the plan: no seeds
    assert plans_layers(model, [("layers.*.mlp.fc_in", "colwise")])
    assert not structural_seeds(model, [("layers.*.mlp.fc_in", "colwise")], replaced=False)
    assert not structural_seeds(model, [], replaced=True)


@pytest.mark.parametrize("taken", ["layers.0.mlp", "layers.0.mlp.fc_in", "layers"])
def test_modules_a_rule_places_are_left_to_it(taken: str) -> None:
    model = Lm()
    found = block_assignments(dict(model.named_modules()), {taken},
                              flow=_flow(model, torch.zeros(2, 8)))
    assert not any(f.startswith("layers.0.mlp") for f in found)
