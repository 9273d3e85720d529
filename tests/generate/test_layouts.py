"""Megatron's layouts where the HF plan replicates or gathers
(hpcodegen/generate/layouts/layouts.py).

Plans here (meta device, one process); numerics in tests/runtime/test_layout_parity.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "moe"))

from artifact_memo import build_bundle

from hpcodegen.hf import read_hf_config

pytestmark = pytest.mark.slow
FAMILIES = Path(__file__).resolve().parents[1] / "fixtures" / "families"


def _meta(config: dict, tp: int = 2, sp: bool = False,
          notes: list[str] | None = None) -> dict:
    files = build_bundle(config, tp, sp, None, config["model_type"], notes=notes)
    return json.loads(files["codegen_meta.json"])


def test_mla_without_rules_splits_like_deepseek_v2() -> None:
    """DeepSeek-V3's HF plan names no attention module: the MLA rule splits the query and
    key/value up-projections and o_proj, the down-projections stay in the region."""
    from moe_configs import config_of

    notes: list[str] = []
    plan = _meta(config_of("deepseek_v3"), notes=notes)["param_plan"]
    attn = plan["model.layers.0.self_attn"]
    assert attn["params"]["q_b_proj.weight"] == {"tp": "S(0)"}
    assert attn["params"]["kv_b_proj.weight"] == {"tp": "S(0)"}
    assert attn["params"]["o_proj.weight"] == {"tp": "S(1)"}
    assert attn["params"]["q_a_proj.weight"] == {"tp": "R"}
    assert "kv_a_proj_with_mqa.weight" in attn["partial_grad_params"]
    assert any(n.startswith("Megatron layout: ") for n in notes)
    with_sp = _meta(config_of("deepseek_v3"), sp=True)["param_plan"]
    assert with_sp["model.layers.0.self_attn"]["in_src"] == {"hidden_states": {"tp": "S(1)"}}


def test_fused_gate_up_and_equal_qkv_split_per_block() -> None:
    config, _ = read_hf_config(FAMILIES / "phi3")
    config["num_key_value_heads"] = config["num_attention_heads"]
    plan = _meta(config)["param_plan"]
    attn = plan["model.layers.0.self_attn"]
    assert attn["params"] == {"qkv_proj.weight": {"tp": "SS(0,3)"},
                              "o_proj.weight": {"tp": "S(1)"}}
    # the forward slices q|k|v at config.num_attention_heads * head_dim: divided per rank
    assert attn["tp_divide_attrs"] == ["config.num_attention_heads", "num_key_value_heads"]
    assert plan["model.layers.0.mlp"]["params"]["gate_up_proj.weight"] == {"tp": "SS(0,2)"}


def test_whole_width_qk_norms_split_with_the_heads() -> None:
    """OLMo-2 normalises q and k over all heads at once: the heads are split anyway, each
    norm a boundary of its own whose compute sums the squares over tp."""
    config, _ = read_hf_config(FAMILIES / "olmo2")
    meta = _meta(config, sp=True)
    plan = meta["param_plan"]
    attn = plan["model.layers.0.self_attn"]
    assert attn["params"]["q_proj.weight"] == {"tp": "S(0)"}
    assert attn["params"]["o_proj.weight"] == {"tp": "S(1)"}
    norm = plan["model.layers.0.self_attn.q_norm"]
    assert norm["params"] == {"weight": {"tp": "S(0)"}}
    assert norm["in_src"] == norm["in_dst"] == {"hidden_states": {"tp": "S(-1)"}}
    targets = {i["match"]: i["local_compute_fn"]["_target_"] for i in meta["injections"]}
    assert targets["model.layers.0.self_attn.q_norm"] == \
        "hpcodegen.runtime.norms.sharded_rms_norm"


def test_rms_norm_variant_reads_the_module_arithmetic() -> None:
    import torch

    from hpcodegen.generate.layouts.layouts import rms_norm_variant

    class LastCast(torch.nn.Module):  # OLMo-2: (w * x).to(dtype)
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(64))
            self.variance_epsilon = 1e-6

        def forward(self, x):
            h = x.float()
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
            return (self.weight * h).to(x.dtype)

    class FirstCast(LastCast):  # Llama: w * x.to(dtype)
        def forward(self, x):
            h = x.float()
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
            return self.weight * h.to(x.dtype)

    class Centered(LastCast):  # a LayerNorm-like mean subtraction: not an RMS norm
        def forward(self, x):
            return super().forward(x - x.mean(-1, keepdim=True))

    assert rms_norm_variant(LastCast()) is True
    assert rms_norm_variant(FirstCast()) is False
    assert rms_norm_variant(Centered()) is None


def test_unplanned_attention_and_mlp_split_in_a_planned_model() -> None:
    """Phi-3.5-MoE's HF plan names the experts only, Qwen2-MoE's misses the shared expert:
    attentions and MLPs no rule names are split like Llama's (a model with no rule at all
    stays replicated, as planned)."""
    from moe_configs import config_of

    phimoe = {"architectures": ["PhimoeForCausalLM"], "model_type": "phimoe",
              "hidden_size": 64, "intermediate_size": 32, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "num_local_experts": 4,
              "num_experts_per_tok": 2, "vocab_size": 256, "max_position_embeddings": 128}
    attn = _meta(phimoe)["param_plan"]["model.layers.0.self_attn"]
    assert attn["params"]["q_proj.weight"] == {"tp": "S(0)"}
    assert attn["params"]["o_proj.weight"] == {"tp": "S(1)"}
    shared = _meta(config_of("qwen2_moe"))["param_plan"]["model.layers.0.mlp.shared_expert"]
    assert shared["params"] == {"gate_proj.weight": {"tp": "S(0)"},
                                "up_proj.weight": {"tp": "S(0)"},
                                "down_proj.weight": {"tp": "S(1)"}}
    assert shared["out_src"] == {"output": {"tp": "P(sum)"}}


def test_unrouted_experts_reduce_with_their_block() -> None:
    """Llama-4's experts output experts x tokens rows: the block is the region, reduced
    once per token; --sp and --ep are still refused for them."""
    from moe_configs import config_of

    plan = _meta(config_of("llama4_text"))["param_plan"]
    block = plan["model.layers.0.feed_forward"]
    assert block["out_src"] == {"output": {"tp": "P(sum)"}}
    assert block["params"]["experts.down_proj"] == {"tp": "S(1)"}
    assert block["params"]["shared_expert.down_proj.weight"] == {"tp": "S(1)"}
    assert "model.layers.0.feed_forward.experts" not in plan


def test_structural_rules_split_only_what_they_know() -> None:
    """An MLA attention holding another projection (a gate over the heads' output) or an
    attention with a parameter of its own that is not per head stays as planned; per-head
    sinks split with the heads."""
    from torch import nn

    from hpcodegen.generate.layouts.layouts import Kind, mla_assignments
    from hpcodegen.generate.seeds.seeds import block_styles, children

    class Mla(nn.Module):
        def __init__(self, gate: bool) -> None:
            super().__init__()
            self.q_proj, self.o_proj = nn.Linear(8, 8), nn.Linear(8, 8)
            self.kv_a_proj_with_mqa, self.kv_b_proj = nn.Linear(8, 4), nn.Linear(4, 8)
            if gate:
                self.g_proj = nn.Linear(8, 8)

    for gate, split in ((False, True), (True, False)):
        root = nn.Module()
        root.attn = Mla(gate)
        assert bool(mla_assignments(dict(root.named_modules()), {}, ())) is split

    class Attention(nn.Module):
        def __init__(self, extra: int) -> None:
            super().__init__()
            self.head_dim, self.num_heads = 4, 2
            self.q_proj, self.k_proj = nn.Linear(8, 8), nn.Linear(8, 8)
            self.v_proj, self.o_proj = nn.Linear(8, 8), nn.Linear(8, 8)
            self.sinks = nn.Parameter(nn.init.zeros_(nn.Parameter(nn.Linear(1, extra).bias)))

        def forward(self, hidden_states):
            return self.o_proj(self.q_proj(hidden_states))

    for extra, split in ((2, True), (3, False)):  # [heads] sinks split, anything else not
        root = nn.Module()
        root.attn = Attention(extra)
        styles = block_styles(root.attn, children(dict(root.named_modules()), "attn"), False)
        assert (styles is not None) is split
        if split:
            assert styles["sinks"] is Kind.COLWISE and styles["o_proj"] is Kind.ROWWISE
