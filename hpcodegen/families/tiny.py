"""A tiny config of any transformers family, shrunk generically from its config class's
defaults: 2 layers (more, up to 8, where a per-layer type list needs them to hold every
layer kind of a hybrid), hidden 64, 4 heads / 2 kv heads, head_dim 16, vocab 256, MLP
widths 128, 4 experts (2 per token), per-layer lists cut to the layer count, token ids
clamped into the vocab; a composite config's sub-configs are shrunk the same way.

``bench/coverage.py`` measures every family on such configs, and the hand-kept tiny
configs of the tests (``tests/fixtures/families``) were built by the same rule.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Mapping
from typing import Any

SHRINK: dict[str, Any] = {
    "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128, "vocab_size": 256,
    "max_position_embeddings": 128, "num_experts": 4, "num_local_experts": 4,
    "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
    "rotary_dim": 8,  # GPT-J, CodeGen: at most head_dim (16)
}
#: other spellings of the shrunk fields, for configs without an ``attribute_map`` entry
ALIASES: dict[str, tuple[str, ...]] = {
    "num_hidden_layers": ("n_layer", "num_layers", "n_layers"),
    "hidden_size": ("n_embd", "d_model", "dim"),
    "num_attention_heads": ("n_head", "num_heads", "n_heads"),
    "num_key_value_heads": ("num_kv_heads", "n_head_kv", "multi_query_group_num"),
}
TOKEN_ID_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id",
                 "sep_token_id", "cls_token_id", "unk_token_id", "mask_token_id")
WIDTH_RE = re.compile(r"(intermediate|ffn|inner|n_inner|mlp_dim|expert_dim)")


def _shrunk_value(key: str, value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    if WIDTH_RE.search(key) and value > 128:
        return 32 if "moe" in key or "expert" in key else 128
    if "vocab" in key and value > SHRINK["vocab_size"]:
        # a second vocabulary (Gemma 3n's per-layer inputs, BLT's hashed byte groups)
        return SHRINK["vocab_size"]
    return None


def tiny_config(model_type: str, class_name: str) -> dict[str, Any]:
    """The config.json dict of a tiny model of ``model_type`` (see the module docstring).

    The config is the one the class is built from, as transformers builds it: a composite
    config (``text_config`` beside ``vision_config``) whose text sub-config the class takes
    is kept composite with its text part shrunk; a class that takes another config class
    altogether (``MusicgenForCausalLM``: the decoder's) gets that class's config.
    """
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    config_cls = CONFIG_MAPPING[model_type]
    wanted = getattr(getattr(transformers, class_name, None), "config_class", None)
    text_cls = (getattr(config_cls, "sub_configs", None) or {}).get("text_config")
    if isinstance(wanted, type) and not issubclass(config_cls, wanted) and text_cls is not wanted:
        config_cls = wanted
        model_type = getattr(wanted, "model_type", model_type) or model_type
    try:
        base = config_cls().to_dict()
    except Exception as exc:
        raise ValueError(f"transformers' default {config_cls.__name__} is invalid: "
                         f"{' '.join(str(exc).split())}") from None
    kw = _shrunk_kwargs(config_cls, base)
    if text_cls is not None and text_cls is wanted and isinstance(base.get("text_config"), dict):
        text = text_cls(**base["text_config"]).to_dict()
        kw["text_config"] = _clamped(text_cls(**_shrunk_kwargs(text_cls, text)).to_dict())
    data = _clamped(_built(config_cls, kw, base).to_dict())
    data["model_type"] = model_type
    data["architectures"] = [class_name]
    _rope_per_layer_type(data)
    del transformers
    # standard JSON has no Infinity (Mamba-2's default time_step_limit (0, inf)): a key left
    # at its default is dropped, so the class rebuilds it
    return {k: v for k, v in data.items() if _finite(v) or v != base.get(k)}


def _rope_per_layer_type(data: dict[str, Any]) -> None:
    """Give each layer type a default RoPE where the model reads its RoPE by layer type
    (``rope_parameters[layer_type]``) but the config class's default carries none.

    Cohere Compass' text decoder keys ``rope_parameters`` by layer type (a checkpoint's
    ``None`` entry marks a NoPE layer), yet its default config has no RoPE at all, so
    transformers cannot build even its own default model (``KeyError: 'full_attention'``).
    transformers' own test config of such a family gives every layer type a default RoPE
    (``rope_type`` default, ``rope_theta`` 10000); the tiny config does the same, and only
    when the model otherwise cannot be built for exactly that missing key.
    """
    types = data.get("layer_types")
    if not isinstance(types, list) or not types or data.get("rope_parameters"):
        return
    import torch

    from hpcodegen.hf import load_transformers_config, model_class_for

    def missing_type() -> bool:
        try:
            with torch.device("meta"):
                model_class_for(data)(load_transformers_config(data))
        except KeyError as exc:
            return bool(exc.args) and exc.args[0] in types
        except Exception:
            return False
        return False

    if missing_type():
        data["rope_parameters"] = {t: {"rope_type": "default", "rope_theta": 10000.0}
                                   for t in dict.fromkeys(map(str, types))}


def _built(config_cls: Any, kw: dict[str, Any], base: Mapping[str, Any]) -> Any:
    """``config_cls(**kw)``; where the class refuses a shrunk value its error names (ZAYA:
    "supports `num_experts_per_tok=1` only"), that field back at its default."""
    try:
        return config_cls(**kw)
    except Exception as exc:
        first = exc
    for key in sorted((k for k in kw if re.search(rf"\b{re.escape(k)}\b", str(first))),
                      key=len, reverse=True):
        if key in base:
            with contextlib.suppress(Exception):
                return config_cls(**{**kw, key: base[key]})
    raise first


def _finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, (list, tuple)):
        return all(_finite(v) for v in value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    return True


#: at most this many layers so that a tiny hybrid config holds every layer kind
MAX_LAYERS = 8


def _layer_count(base: Mapping[str, Any]) -> int:
    """The fewest leading layers (2 at least, :data:`MAX_LAYERS` at most) holding every kind
    a per-layer type list names (``layer_types``, ``*_layers_block_type``): a hybrid's
    attention and linear-attention layers are both exercised."""
    n = SHRINK["num_hidden_layers"]
    for key, value in base.items():
        if isinstance(value, list) and key.endswith(("layer_types", "_layers_block_type")):
            kinds, seen = {str(v) for v in value}, set()
            for i, kind in enumerate(value):
                seen.add(str(kind))
                if seen == kinds:
                    n = max(n, i + 1)
                    break
    return min(n, MAX_LAYERS)


def _shrunk_kwargs(config_cls: Any, base: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments that shrink ``base`` (a config class's defaults)."""
    amap = dict(getattr(config_cls, "attribute_map", {}) or {})
    layers = _layer_count(base)
    kw: dict[str, Any] = {}
    for key, value in SHRINK.items():
        value = layers if key == "num_hidden_layers" else value
        if key == "num_key_value_heads" and base.get("kv_lora_rank"):
            # multi-head latent attention expands its latent to every query head: its
            # key/value head count is the head count
            value = SHRINK["num_attention_heads"]
        if key == "head_dim" and base.get("kv_lora_rank"):
            continue  # MLA's head_dim is its rope part's width (qk_rope_head_dim), kept
        for name in (amap.get(key, key), *ALIASES.get(key, ())):
            if name in base and not isinstance(base[name], (dict, list)):
                kw[name] = value
                break
    full = next((base[n] for n in (amap.get("num_hidden_layers", "num_hidden_layers"),
                                   *ALIASES["num_hidden_layers"])
                 if isinstance(base.get(n), int)), None)
    for key, value in base.items():
        if key not in kw and (small := _shrunk_value(key, value)) is not None:
            kw[key] = small
        elif isinstance(value, list) and len(value) > layers and (
                key.endswith(("layer_types", "_layers_block_type")) or len(value) == full):
            kw[key] = value[:layers]  # per-layer lists follow the layer count
        elif re.fullmatch(r"num_\w+_layers", key) and key not in kw \
                and isinstance(value, int) and not isinstance(value, bool) and value >= layers:
            kw[key] = 0  # a count of special layers (kv-shared, dense) no longer fits
    _keep_expanded_heads(base, kw)
    _keep_expert_groups(base, kw)
    _follow_width(kw, base.get("hidden_size"), kw.get("hidden_size"), base)
    kw.update(_shrunk_sub_configs(config_cls, base))
    return kw


def _sub_config_class(config_cls: Any, name: str, value: Mapping[str, Any]) -> Any:
    """The config class of the sub-config ``name`` (an ``AutoConfig`` entry resolves by the
    sub-config's own ``model_type``), or None."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    sub_cls = (getattr(config_cls, "sub_configs", None) or {}).get(name)
    if sub_cls is None or getattr(sub_cls, "__name__", "") == "AutoConfig":
        kind = str(value.get("model_type"))  # the lazy mapping has no working .get
        sub_cls = CONFIG_MAPPING[kind] if kind in CONFIG_MAPPING else None  # noqa: SIM401
    return sub_cls if isinstance(sub_cls, type) else None


def _shrunk_sub_configs(config_cls: Any, base: Mapping[str, Any]) -> dict[str, Any]:
    """Every sub-config (``text_config``, ``vision_config``, BLT's patcher/encoder/decoder,
    Fuyu's Persimmon text model) shrunk the same way, recursively: a default sub-config left
    full size builds a model of billions of parameters. A sub-config whose shrunk form its
    own class refuses is left out (kept at its default)."""
    out: dict[str, Any] = {}
    for name in getattr(config_cls, "sub_configs", None) or {}:
        value = base.get(name)
        if not isinstance(value, Mapping):
            continue
        sub_cls = _sub_config_class(config_cls, name, value)
        if sub_cls is None:
            continue
        try:
            full = sub_cls(**value).to_dict()
            out[name] = _clamped(sub_cls(**_shrunk_kwargs(sub_cls, full)).to_dict())
        except Exception:
            continue
    _follow_text_width(base, out)
    return out


def _follow_text_width(base: Mapping[str, Any], subs: dict[str, Any]) -> None:
    """A sub-config width that equals another sub-config's default width (a vision or
    audio adapter's output width equal to the text model's, BLT's ``hidden_size_global``
    in its local encoder equal to its global transformer's) follows that shrunk width, so
    that the composite's own check that they match still holds."""
    for src, shrunk in subs.items():
        full = base.get(src)
        old = full.get("hidden_size") if isinstance(full, Mapping) else None
        new = shrunk.get("hidden_size") if isinstance(shrunk, Mapping) else None
        for name, sub in subs.items():
            if name != src and isinstance(sub, dict):
                _follow_width(sub, old, new, dict(sub))


def _follow_width(kw: dict[str, Any], old: Any, new: Any, base: Mapping[str, Any]) -> None:
    """Every width field of ``base`` (other than ``hidden_size`` and those ``kw`` shrinks
    already) whose value is the old width ``old`` set to ``new`` in ``kw``: an adapter's
    width that a config checks equal to ``hidden_size`` stays equal."""
    if not isinstance(old, int) or not isinstance(new, int) or old == new:
        return
    for key, value in base.items():
        if isinstance(value, int) and not isinstance(value, bool) and value == old \
                and key != "hidden_size" and "vocab" not in key \
                and re.search(r"(dim|size|width)", key) and kw.get(key, old) == old:
            kw[key] = new


def _keep_expert_groups(base: Mapping[str, Any], kw: dict[str, Any]) -> None:
    """Group-limited routing (DeepSeek-V3 style ``n_group``/``topk_group``) views the scores
    as ``(tokens, groups, experts // groups)``: when the shrunk expert count no longer
    splits into the default groups (4 experts in 8 groups gave ``[-1, 8, 0]``), route over
    one group."""
    experts = next((kw[k] for k in ("n_routed_experts", "num_experts", "num_local_experts")
                    if isinstance(kw.get(k), int)), None)
    for group, top in (("n_group", "topk_group"), ("num_expert_group", "topk_group")):
        groups = base.get(group)
        if isinstance(experts, int) and isinstance(groups, int) and groups > 0 \
                and experts % groups:
            kw[group] = 1
            if isinstance(base.get(top), int):
                kw[top] = 1


def _keep_expanded_heads(base: Mapping[str, Any], kw: dict[str, Any]) -> None:
    """Keep a state-space mixer's invariant ``hidden_size * expand == num_heads * head_dim``
    (Mamba-2 and its hybrids validate it) when the defaults hold it: the head count
    follows the shrunk width."""
    hidden = kw.get("hidden_size", base.get("hidden_size"))
    expand, head_dim = base.get("expand"), kw.get("head_dim", base.get("head_dim"))
    for name in ("num_heads", "mamba_n_heads"):
        heads = base.get(name)
        if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0
                   for v in (hidden, expand, head_dim, heads)):
            continue
        if base.get("hidden_size", 0) * expand == heads * base.get("head_dim", 0) \
                and (hidden * expand) % head_dim == 0:
            kw[name] = hidden * expand // head_dim


def _clamped(data: dict[str, Any]) -> dict[str, Any]:
    """Token ids clamped into the (shrunk) vocabulary."""
    vocab = data.get("vocab_size")
    for key in TOKEN_ID_KEYS:
        v = data.get(key)
        if isinstance(vocab, int) and isinstance(v, int) and v >= vocab:
            data[key] = min(1, vocab - 1)
        elif isinstance(vocab, int) and isinstance(v, list):
            data[key] = [x if not isinstance(x, int) or x < vocab else 1 for x in v]
    return data
