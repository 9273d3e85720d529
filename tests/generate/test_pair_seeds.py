"""The dataflow seeds (pair_seeds.py, attention_seeds.py, head_check.py, tracer/dataflow.py):
each rule once found, once not.

Tiny torch models on CPU, one process, one traced forward each (the tracer moves them to
the meta device for it and back); the families whose rule files these replaced are checked
in test_families_rules_a/b, their numerics in tests/runtime/test_family_parity_rules_*.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from hpcodegen.errors import PlanError
from hpcodegen.generate.seeds.attention_seeds import attention_by_use, may_be_attention
from hpcodegen.generate.seeds.pair_seeds import dataflow_seeds
from hpcodegen.generate.seeds.seeds import SEED_RULE, is_linear
from hpcodegen.generate.sources.hf_plan import Assignment
from hpcodegen.generate.sources.styles import Kind
from hpcodegen.tracer.dataflow import linear_flow

W, INNER = 8, 16


class Model(nn.Module):
    """``input_ids`` -> embedding -> ``body`` -> a head: what the tracer runs."""

    def __init__(self, body: nn.Module) -> None:
        super().__init__()
        self.emb, self.body, self.head = nn.Embedding(10, W), body, nn.Linear(W, 10)

    def forward(self, input_ids: Any) -> Any:
        return self.head(self.body(self.emb(input_ids)))


class Layer(nn.Module):
    """fc1/fc2 children of a layer that also adds the residual (OPT's decoder layer);
    ``between`` runs on fc1's output; ``direct``: fc2's weight read, the module not called."""

    def __init__(self, between: Any = nn.functional.gelu, direct: bool = False) -> None:
        super().__init__()
        self.norm, self.fc1, self.fc2 = nn.LayerNorm(W), nn.Linear(W, INNER), nn.Linear(INNER, W)
        self.between, self.direct = between, direct

    def forward(self, x: Any) -> Any:
        h = self.between(self.fc1(self.norm(x)))
        out = nn.functional.linear(h, self.fc2.weight) if self.direct else self.fc2(h)
        return x + out


class ResidualMlp(nn.Module):
    """An MLP adding its residual itself (BLOOM's, MPT's); ``residual=False``: a clean one
    scaled after its output projection (Falcon-H1's multiplier)."""

    def __init__(self, residual: bool = True) -> None:
        super().__init__()
        self.up, self.down, self.residual = nn.Linear(W, INNER), nn.Linear(INNER, W), residual

    def forward(self, x: Any) -> Any:
        out = self.down(torch.relu(self.up(x)))
        return out + x if self.residual else out * 0.5


def _flow(body: nn.Module) -> tuple[nn.Module, Any]:
    model = Model(body)
    flow = linear_flow(model, is_linear, lambda _f, m: may_be_attention(m))
    assert flow is not None
    return model, flow


def _seed(fqns: dict[str, Kind]) -> dict[str, Assignment]:
    return {f: Assignment(f, k, 1, k.value, SEED_RULE) for f, k in fqns.items()}


def test_a_pair_through_pointwise_ops_keeps_its_shard_flowing() -> None:
    model, flow = _flow(Layer())
    changes = dataflow_seeds(model, {}, [], flow)
    assert {f: a.kind for f, a in changes.add.items()} == {
        "body.fc1": Kind.COLWISE_GATHER, "body.fc2": Kind.ROWWISE_SPLIT}
    assert changes.flows == [("body.fc1", "body.fc2")]


def test_no_pair_where_the_first_output_is_used_whole() -> None:
    """A softmax over the intermediate (not pointwise) needs every entry: no pair."""
    model, flow = _flow(Layer(between=lambda h: torch.softmax(h, dim=-1)))
    assert "body.fc1" in flow.escapes
    assert dataflow_seeds(model, {}, [], flow).add == {}


def test_a_pair_whose_parent_holds_only_it_is_a_region() -> None:
    """CTRL's nn.Sequential feed-forward: the parent returns fc2's output unchanged."""
    model, flow = _flow(nn.Sequential(nn.Linear(W, INNER), nn.ReLU(), nn.Linear(INNER, W)))
    changes = dataflow_seeds(model, {}, [], flow)
    assert {f: a.kind for f, a in changes.add.items()} == {
        "body.0": Kind.COLWISE, "body.2": Kind.ROWWISE}
    assert changes.flows == []


def test_a_seeded_region_adding_its_residual_inside_is_dropped() -> None:
    seeds = _seed({"body.up": Kind.COLWISE, "body.down": Kind.ROWWISE})
    model, flow = _flow(ResidualMlp())
    changes = dataflow_seeds(model, seeds, [], flow)
    assert "a residual added inside" in changes.dropped["body"]
    assert changes.flows == [("body.up", "body.down")]  # split one by one instead
    model, flow = _flow(ResidualMlp(residual=False))  # scaled, not added to: kept
    assert dataflow_seeds(model, seeds, [], flow).dropped == {}


def test_a_linear_the_forward_never_calls_is_not_split() -> None:
    """BLOOM's slow_but_exact reads dense.weight itself: no boundary of it would run."""
    model, flow = _flow(Layer(direct=True))
    assert "body.fc2" not in flow.called
    assert dataflow_seeds(model, {}, [], flow).add == {}
    seeds = _seed({"body.fc1": Kind.COLWISE, "body.fc2": Kind.ROWWISE})
    assert "never calls body.fc2" in dataflow_seeds(model, seeds, [], flow).dropped["body"]


class SelfOrCross(nn.Module):
    """A BART-style attention class; ``width``: how it merges its heads (``"-1"``, the
    attribute ``embed_dim``, or its input's width, which no divided attribute can fix)."""

    def __init__(self, width: str = "-1") -> None:
        super().__init__()
        self.num_heads, self.head_dim, self.embed_dim, self.width = 2, 4, W, width
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (
            nn.Linear(W, W) for _ in range(4))

    def forward(self, hidden_states: Any, key_value_states: Any = None) -> Any:
        b, t, full = hidden_states.shape
        kv = hidden_states if key_value_states is None else key_value_states
        q, k, v = (p(x).view(b, -1, self.num_heads, self.head_dim).transpose(1, 2)
                   for p, x in ((self.q_proj, hidden_states), (self.k_proj, kv),
                                (self.v_proj, kv)))
        out = torch.softmax(q @ k.transpose(-1, -2), -1) @ v
        merged = {"-1": -1, "embed_dim": self.embed_dim, "input": full}[self.width]
        return self.out_proj(out.transpose(1, 2).reshape(b, t, merged))


class Cross(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = SelfOrCross()

    def forward(self, x: Any) -> Any:
        return self.attn(x, key_value_states=x * 2)


def _by_use(body: nn.Module) -> tuple[dict[str, Kind], dict[str, list[str]]]:
    model, flow = _flow(body)
    found, divide, _ = attention_by_use(dict(model.named_modules()), flow, [])
    return {f: a.kind for f, a in found.items()}, divide


def test_a_self_attention_by_use_is_split_by_heads() -> None:
    kinds, divide = _by_use(SelfOrCross())
    assert kinds == {"body.q_proj": Kind.COLWISE, "body.k_proj": Kind.COLWISE,
                     "body.v_proj": Kind.COLWISE, "body.out_proj": Kind.ROWWISE}
    assert divide == {"body": []}
    assert _by_use(Cross()) == ({}, {})  # handed keys and values: a cross-attention


def test_width_attributes_are_divided_and_an_input_width_gathers() -> None:
    """XGLM reshapes with self.embed_dim (divided with the heads); TrOCR with its input's
    width: no rank can run its heads alone, each projection is its own boundary."""
    kinds, divide = _by_use(SelfOrCross("embed_dim"))
    assert kinds["body.q_proj"] is Kind.COLWISE and divide == {"body": ["embed_dim"]}
    kinds, divide = _by_use(SelfOrCross("input"))
    assert kinds == {"body.q_proj": Kind.COLWISE_GATHER, "body.k_proj": Kind.COLWISE_GATHER,
                     "body.v_proj": Kind.COLWISE_GATHER, "body.out_proj": Kind.ROWWISE_SPLIT}


class ThreeInputs(nn.Module):
    """CTRL's attention: projections under other names, each on its own forward input."""

    def __init__(self, extra: bool = False) -> None:
        super().__init__()
        self.num_heads, self.head_dim = 2, 4
        self.Wq, self.Wk, self.Wv, self.dense = (nn.Linear(W, W) for _ in range(4))
        if extra:  # a fifth projection the forward also applies to an input: not this rule
            self.gate = nn.Linear(W, W)

    def forward(self, v: Any, k: Any, q: Any) -> Any:
        shape = (*q.shape[:-1], -1, self.head_dim)
        qh = self.Wq(q).view(shape).transpose(1, 2)
        kh = self.Wk(k).view(shape).transpose(1, 2)
        vh = self.Wv(v).view(shape).transpose(1, 2)
        out = (torch.softmax(qh @ kh.transpose(-1, -2), -1) @ vh).transpose(1, 2)
        out = self.dense(out.reshape(*q.shape[:-1], -1))
        return out * torch.sigmoid(self.gate(q)) if hasattr(self, "gate") else out


class Caller(nn.Module):
    def __init__(self, extra: bool = False) -> None:
        super().__init__()
        self.attn = ThreeInputs(extra)

    def forward(self, x: Any) -> Any:
        return self.attn(x, x, x)


def test_an_attention_found_by_the_inputs_its_projections_read() -> None:
    model, flow = _flow(Caller())
    found, _, inputs = attention_by_use(dict(model.named_modules()), flow, [])
    assert {f: a.kind for f, a in found.items()} == {
        "body.attn.Wq": Kind.COLWISE, "body.attn.Wk": Kind.COLWISE,
        "body.attn.Wv": Kind.COLWISE, "body.attn.dense": Kind.ROWWISE}
    assert inputs == {"body.attn": ["k", "q"]}  # v, the first, is the lifter's
    model, flow = _flow(Caller(extra=True))
    assert attention_by_use(dict(model.named_modules()), flow, [])[0] == {}


class BertSelf(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.heads = 2
        self.query, self.key, self.value = (nn.Linear(W, W) for _ in range(3))

    def forward(self, hidden_states: Any) -> Any:
        shape = (*hidden_states.shape[:-1], self.heads, -1)
        q, k, v = (p(hidden_states).view(shape).transpose(1, 2)
                   for p in (self.query, self.key, self.value))
        out = torch.softmax(q @ k.transpose(-1, -2), -1) @ v
        return out.transpose(1, 2).reshape(hidden_states.shape)


class BertOutput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.dense, self.norm = nn.Linear(W, W), nn.LayerNorm(W)

    def forward(self, states: Any, residual: Any) -> Any:
        return self.norm(self.dense(states) + residual)


class BertAttention(nn.Module):
    """q/k/v in one child, the output dense with the residual and norm in another (GIT's,
    BERT's); ``first_norm``: the input normed before the projections read it (then they
    read another tensor than the module's own input: not this rule)."""

    def __init__(self, first_norm: bool = False) -> None:
        super().__init__()
        self.self, self.output = BertSelf(), BertOutput()
        self.first_norm = nn.LayerNorm(W) if first_norm else None

    def forward(self, x: Any) -> Any:
        h = self.first_norm(x) if self.first_norm is not None else x
        return self.output(self.self(h), x)


def test_an_attention_over_two_sibling_modules_gets_a_boundary_per_projection() -> None:
    from hpcodegen.generate.seeds.attention_seeds import split_attentions

    model, flow = _flow(BertAttention())
    found = split_attentions(dict(model.named_modules()), flow, [])
    assert {f: a.kind for f, a in found.items()} == {
        "body.self.query": Kind.COLWISE_GATHER, "body.self.key": Kind.COLWISE_GATHER,
        "body.self.value": Kind.COLWISE_GATHER, "body.output.dense": Kind.ROWWISE_SPLIT}
    model, flow = _flow(BertAttention(first_norm=True))
    assert split_attentions(dict(model.named_modules()), flow, []) == {}


def test_the_linears_a_forward_never_calls_are_kept_from_the_layouts() -> None:
    """A vision tower a text forward never runs: the dataflow names its Linears, and
    plan_sources hands them to the Megatron layouts as taken (not split by name)."""
    from hpcodegen.generate.layouts.layouts import unplanned_blocks

    class Tower(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.text, self.vision = Layer(), nn.Module()
            self.vision.mlp = nn.Module()
            self.vision.mlp.fc1, self.vision.mlp.fc2 = nn.Linear(W, INNER), nn.Linear(INNER, W)

        def forward(self, x: Any) -> Any:
            return self.text(x)

    model, flow = _flow(Tower())
    changes = dataflow_seeds(model, {}, [], flow)
    assert changes.uncalled == {"body.vision.mlp.fc1", "body.vision.mlp.fc2"}
    modules = dict(model.named_modules())
    assert "body.vision.mlp.fc1" in unplanned_blocks(modules, changes.add, [])
    assert unplanned_blocks(modules, changes.add, changes.uncalled) == {}


def test_a_sequence_gathering_parent_refuses_sequence_sharded_boundaries_inside() -> None:
    """OPT's decoder layer gathers the sequence for fc1/fc2 (its forward flattens batch and
    sequence); the attention region inside it must not gather it again (--sp)."""
    from hpcodegen.generate.checks.sp_nesting import check_nested_gathers as typed_check
    from hpcodegen.plan.codec import entries_from_json

    def check_nested_gathers(plan: dict) -> None:
        typed_check(entries_from_json(plan))

    def entry(src: str, dst: str) -> dict:
        return {"in_src": {"x": {"tp": src}}, "in_dst": {"x": {"tp": dst}},
                "out_src": {"output": {"tp": "R"}}, "out_dst": {"output": {"tp": src}}}

    plan = {"layer": entry("S(1)", "R"), "layer.attn": entry("S(1)", "R"),
            "layer.fc1": entry("R", "R")}
    with pytest.raises(PlanError) as info:
        check_nested_gathers(plan)
    assert info.value.findings[0].code == "generate.sp_nested_gather"
    assert info.value.findings[0].where == "layer.attn"
    del plan["layer.attn"]  # the children take the whole sequence: accepted
    check_nested_gathers(plan)
    check_nested_gathers({"attn": entry("S(1)", "R"), "norm": entry("S(1)", "S(1)")})
    # a nested boundary that moves nothing (S(1) -> S(1) both ways: the existing system's
    # per-head norms inside its attention) is harmless
    still = {"in_src": {"x": {"tp": "S(1)"}}, "in_dst": {"x": {"tp": "S(1)"}},
             "out_src": {"output": {"tp": "S(1)"}}, "out_dst": {"output": {"tp": "S(1)"}}}
    check_nested_gathers({"layer": entry("S(1)", "R"), "layer.k_norm": still})


def test_the_trace_gives_the_model_back_as_it_was() -> None:
    """Eager attention and eval mode only for the trace: generate reads the attention
    implementation afterwards (--cp picks its kernel by it)."""
    from hpcodegen.hf import build_meta_model, read_hf_config

    config, _ = read_hf_config(Path(__file__).resolve().parents[1] / "fixtures" / "families"
                               / "opt")
    model = build_meta_model(config)
    before = model.config._attn_implementation
    training = [m.training for m in model.modules()]
    assert linear_flow(model, is_linear) is not None
    assert model.config._attn_implementation == before != "eager"
    assert [m.training for m in model.modules()] == training
