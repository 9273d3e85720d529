"""Which families the installed transformers has, and what kind each is.

The causal-LM families come from transformers' own auto mapping; whether a family is a
decoder, a bidirectional encoder or a seq2seq decoder half from its masked-LM and seq2seq
mappings; whether it is MoE from its config and its HF plan. No list of ours.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def causal_lm_families() -> dict[str, str]:
    """``{model_type: causal-LM class name}`` of the installed transformers."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    out = {}
    for model_type, cls in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items():
        name = cls[0] if isinstance(cls, (list, tuple)) else cls
        if isinstance(name, str) and name.endswith(("ForCausalLM", "LMHeadModel")):
            out[model_type] = name
    return dict(sorted(out.items()))


def family_kind(model_type: str) -> str:
    """``decoder``, ``encoder`` or ``seq2seq``: what the family's causal-LM class is.

    transformers also maps bidirectional encoders (BERT-like; their causal-LM class is the
    encoder run with ``is_decoder=True``) and the decoder half of encoder-decoder models to
    causal-LM classes. Those families are recognised by transformers' own masked-LM and
    seq2seq auto mappings, so the split is transformers' classification, not a list of ours.
    """
    from transformers.models.auto import modeling_auto as auto

    seq2seq = set(auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES) \
        | set(auto.MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES)
    if model_type in seq2seq:
        return "seq2seq"
    if model_type in auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        return "encoder"
    return "decoder"


def is_moe(config: Mapping[str, Any], styles: Iterable[str]) -> bool:
    """More than one expert in the config (or a nested sub-config), or an HF plan that
    shards experts."""
    for key, value in config.items():
        if isinstance(value, Mapping) and is_moe(value, ()):
            return True
        if isinstance(key, str) and "expert" in key \
                and not any(w in key for w in ("per_tok", "top", "shared", "group")) \
                and isinstance(value, int) and not isinstance(value, bool) and value > 1:
            return True
    return any("expert" in s or s.startswith("moe") for s in styles)


def hf_styles(config: Mapping[str, Any]) -> list[str]:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    plan = getattr(CONFIG_MAPPING[config["model_type"]], "base_model_tp_plan", None) or {}
    text = config.get("text_config")  # a composite config: its text part holds the plan
    if not plan and isinstance(text, Mapping) and text.get("model_type") in CONFIG_MAPPING:
        plan = getattr(CONFIG_MAPPING[text["model_type"]], "base_model_tp_plan", None) or {}
    return sorted(set(map(str, plan.values())))
