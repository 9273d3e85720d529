"""Tiny configs of the mixture-of-experts families (random weights, no hub downloads)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

_COMMON: dict[str, Any] = {
    "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "num_hidden_layers": 2, "vocab_size": 256, "max_position_embeddings": 128,
    "tie_word_embeddings": False, "num_experts_per_tok": 2,
}

#: model_type -> config.json fields (4 experts so that ep 2 holds 2 per rank)
CONFIGS: dict[str, dict[str, Any]] = {
    "qwen3_moe": {"architectures": ["Qwen3MoeForCausalLM"], "intermediate_size": 128,
                  "moe_intermediate_size": 32, "num_experts": 4},
    "qwen2_moe": {"architectures": ["Qwen2MoeForCausalLM"], "intermediate_size": 128,
                  "moe_intermediate_size": 32, "shared_expert_intermediate_size": 64,
                  "num_experts": 4},
    "mixtral": {"architectures": ["MixtralForCausalLM"], "intermediate_size": 64,
                "num_local_experts": 4},
    "deepseek_v3": {"architectures": ["DeepseekV3ForCausalLM"], "intermediate_size": 128,
                    "moe_intermediate_size": 32, "n_routed_experts": 4, "n_shared_experts": 1,
                    "n_group": 2, "topk_group": 1, "first_k_dense_replace": 1,
                    "kv_lora_rank": 16, "q_lora_rank": 32, "qk_nope_head_dim": 16,
                    "qk_rope_head_dim": 8, "v_head_dim": 16, "num_key_value_heads": 4,
                    "head_dim": 8},
    "gpt_oss": {"architectures": ["GptOssForCausalLM"], "intermediate_size": 32,
                "num_local_experts": 4, "layer_types": ["sliding_attention", "full_attention"],
                "sliding_window": 8},
    # a normed embedding (embed_norm inside the lookup module), a fused gate_up_proj whose HF
    # rule is plain colwise (chunked in the forward), shared experts taking routing gammas
    "inkling_text": {"architectures": ["InklingForCausalLM"], "intermediate_size": 128,
                     "moe_intermediate_size": 32, "n_routed_experts": 4,
                     "n_shared_experts": 2, "layer_types": ["hybrid_sliding", "hybrid"],
                     "mlp_layer_types": ["sparse", "sparse"]},
    "llama4_text": {"architectures": ["Llama4ForCausalLM"], "intermediate_size": 32,
                    "intermediate_size_mlp": 64, "num_local_experts": 4,
                    "num_experts_per_tok": 1, "interleave_moe_layer_step": 1,
                    "no_rope_layers": [1, 1], "attention_chunk_size": 64},
}


def config_of(model_type: str, **changes: Any) -> dict[str, Any]:
    """The tiny config of one family (``changes`` applied)."""
    return {**_COMMON, "model_type": model_type, **CONFIGS[model_type], **changes}


def write_model_dir(dest: Path, model_type: str, **changes: Any) -> Path:
    """A model directory holding ``config.json`` for :func:`config_of`."""
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "config.json").write_text(json.dumps(config_of(model_type, **changes), indent=1))
    return dest


#: full-size shapes (the published configs' shape fields; no weights are ever built)
FULL_SIZE: dict[str, dict[str, Any]] = {
    "qwen3_30b_a3b": {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
        "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
        "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
        "num_hidden_layers": 48, "num_experts": 128, "num_experts_per_tok": 8,
        "vocab_size": 151936, "max_position_embeddings": 40960, "tie_word_embeddings": False,
        "norm_topk_prob": True},
    "deepseek_v3": {
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
        "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
        "num_attention_heads": 128, "num_key_value_heads": 128, "num_hidden_layers": 61,
        "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8,
        "first_k_dense_replace": 3, "n_group": 8, "topk_group": 4, "q_lora_rank": 1536,
        "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
        "v_head_dim": 128, "head_dim": 64, "vocab_size": 129280,
        "max_position_embeddings": 163840, "tie_word_embeddings": False},
}
