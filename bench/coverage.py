"""Which causal-LM families of the installed transformers hpcodegen supports, measured.

For every model type of transformers' causal-LM auto mapping (the ``*ForCausalLM`` classes,
and the few older ``*LMHeadModel`` names such as GPT-2's), this script:

1. builds a tiny config from the config class's defaults, shrunk generically: 2 layers
   (more, up to 8, where a per-layer type list needs them to hold every layer kind of a
   hybrid), hidden 64, 4 heads / 2 kv heads, head_dim 16, vocab 256, MLP widths 128,
   4 experts (2 per token), per-layer lists cut to the layer count, token ids clamped into
   the vocab; a composite config's text sub-config is shrunk the same way;
2. runs ``generate`` at tp 2, tp 4 (with 4 kv heads) and tp 2 ``--sp``, ``verify --hf-config``
   on each, and
   ``inspect-plan`` on the tp 2 artifact (through the CLI, in-process, families batched per
   worker process, ``--jobs`` workers at a time);
3. runs the parity check of every tp 2 (and ``--sp``) artifact that verified on 2 real gloo
   ranks: logits and every gradient against the unsharded model (tolerance 1e-5), several
   models per spawn;
4. writes ``docs/models.md``: one row per family (tp2, tp4, sp, parity), the precise reason
   for every family that is not supported, and the last line
   ``coverage: dense_ok=K/N moe_ok=K/N``.

A family counts as ok when tp 2 generates, verifies, inspects and passes parity (in float32,
or, where float32 rounding alone exceeds the bound, in float64: see ``parity_one``), and its
decoder layers are actually split over tp (a plan that only shards the embedding and the
LM head because nothing else has a rule is listed as ``replicated``, not ok). A family is
MoE when its config declares more than one expert or its HF plan shards experts.
Families whose causal-LM class is a bidirectional encoder or the decoder half of a seq2seq
model (transformers' masked-LM and seq2seq mappings) get their own table and are not
counted in ``dense_ok``. Models of a parity spawn that died run again one per spawn.

    python bench/coverage.py                       # every family, docs/models.md
    python bench/coverage.py --families llama,gpt2 --jobs 2 --out out/models.md
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from coverage_cp import cp_cell, cp_reason  # noqa: E402

TOL = 1e-5
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


# ------------------------------------------------------------------------------ families
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


# ------------------------------------------------------------------------ phase 1: CLI
def _cli(args: Sequence[str]) -> tuple[int, str]:
    from hpcodegen.cli.app import _register, app
    from typer.testing import CliRunner

    _register()  # the verbs, as the console script registers them
    result = CliRunner().invoke(app, list(args))
    text = (result.stdout or "") + (getattr(result, "stderr", "") or "")
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        text += f"\n{type(result.exception).__name__}: {result.exception}"
    return result.exit_code, text


def _reason(text: str) -> str:
    """The first finding of a CLI failure, on one line, without the verb prefix."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for i, ln in enumerate(lines):
        if ln.startswith("hpcodegen ") or re.search(r"\berror\b", ln):
            joined = " ".join(lines[i:i + 4])
            joined = re.sub(r"^hpcodegen \w[\w-]*: ", "", joined)
            return re.split(r" (?=hpcodegen \w[\w-]*: )", joined)[0][:300]
    return (lines[-1] if lines else "no output")[:300]


def layers_split(meta: Mapping[str, Any]) -> bool:
    """Some parameter below the first decoder layer is sharded on tp."""
    for fqn, entry in (meta.get("param_plan") or {}).items():
        for rel, named in (entry.get("params") or {}).items():
            full = f"{fqn}.{rel}" if fqn and rel else fqn or rel
            if re.search(r"\.(layers|h|layer|blocks|block|decoder\.layers)\.\d+\.", "." + full) \
                    and str((named or {}).get("tp", "R")) != "R":
                return True
    return False


def check_family(model_type: str, class_name: str, work: Path) -> dict[str, Any]:
    """Phase 1 of one family: config, generate x3, verify x3, inspect (see the docstring)."""
    row: dict[str, Any] = {"family": model_type, "class": class_name,
                           "kind": family_kind(model_type)}
    cfg_dir = work / model_type / "config"
    try:
        try:
            config = tiny_config(model_type, class_name)
        except Exception:
            # defaults that do not shrink (GPT-Neo's attention_types must match its layer
            # count): the hand-made tiny config of the tests, when there is one
            fixture = REPO / "tests" / "fixtures" / "families" / model_type / "config.json"
            if not fixture.is_file():
                raise
            config = json.loads(fixture.read_text())
            row["config_from"] = str(fixture.relative_to(REPO))
        row["moe"] = is_moe(config, hf_styles(config))
        row["hf_plan"] = bool(hf_styles(config))
    except Exception as exc:
        row.update(moe=False, hf_plan=False, config_error=f"{type(exc).__name__}: {exc}"[:300])
        return row
    cfg_dir.mkdir(parents=True, exist_ok=True)
    (cfg_dir / "config.json").write_text(json.dumps(config, indent=1, default=str))
    cfg4_dir = work / model_type / "config_kv4"  # tp 4 needs 4 kv heads
    cfg4_dir.mkdir(parents=True, exist_ok=True)
    def kv4(scope: Mapping[str, Any]) -> dict[str, Any]:
        return {k: 4 for k in ("num_key_value_heads", *ALIASES["num_key_value_heads"])
                if isinstance(scope.get(k), int) and not isinstance(scope.get(k), bool)}

    config4 = {**config, **kv4(config)}
    for name, sub in config.items():  # text_config, BLT's encoder/global/decoder/patcher
        if isinstance(sub, Mapping) and kv4(sub):
            config4[name] = {**sub, **kv4(sub)}
    (cfg4_dir / "config.json").write_text(json.dumps(config4, indent=1, default=str))
    for variant, extra in (("tp2", ["--tp", "2"]), ("tp4", ["--tp", "4"]),
                           ("sp", ["--tp", "2", "--sp"]), ("cp2", ["--tp", "1", "--cp", "2"])):
        out = work / model_type / variant
        cfg = cfg4_dir if variant == "tp4" else cfg_dir
        code, text = _cli(["generate", "--model", str(cfg), *extra, "-o", str(out)])
        if code != 0:
            reason = _reason(text)
            if "transformers cannot build" in reason:
                reason = _default_build_error(model_type, class_name) or reason
            row[variant] = {"ok": False, "stage": "generate", "reason": reason}
            continue
        # generate's note naming the file (a warning may mention package rules in a hint);
        # also a model_type reusing a family's rules
        packaged = "\npackage rules " in f"\n{text}"
        code, text = _cli(["verify", str(out), "--hf-config", str(cfg)])
        if code != 0:
            row[variant] = {"ok": False, "stage": "verify", "reason": _reason(text)}
            continue
        meta = json.loads((out / "codegen_meta.json").read_text())
        row[variant] = {"ok": True, "dir": str(out), "split": layers_split(meta),
                        "package": packaged or _uses_package(model_type)}
        if variant == "tp2":
            code, text = _cli(["inspect-plan", str(out)])
            if code != 0:
                row[variant] = {"ok": False, "stage": "inspect-plan", "reason": _reason(text)}
    return row


def _default_build_error(model_type: str, class_name: str) -> str | None:
    """Why ``class_name`` cannot be built even from transformers' own default config (on
    the meta device), or None when it can: the failure is then not the tiny config's."""
    import torch
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cls = getattr(transformers, class_name, None)
    config_cls = getattr(cls, "config_class", None) or CONFIG_MAPPING[model_type]
    try:
        with torch.device("meta"):
            cls(config_cls())
    except Exception as exc:
        return (f"transformers' default {config_cls.__name__} cannot build {class_name}: "
                f"{type(exc).__name__}: {' '.join(str(exc).split())}")[:300]
    return None


def _uses_package(model_type: str) -> bool:
    return (REPO / "hpcodegen" / "generate" / "rules" / f"{model_type}.yaml").is_file()


def phase1_worker(families: Sequence[tuple[str, str]], work: Path, out: Path) -> None:
    import warnings

    warnings.filterwarnings("ignore")
    rows = []
    for model_type, cls in families:
        start = time.perf_counter()
        try:
            row = check_family(model_type, cls, work)
        except Exception as exc:
            row = {"family": model_type, "class": cls, "moe": False,
                   "config_error": f"{type(exc).__name__}: {exc}"[:300]}
        row["seconds"] = round(time.perf_counter() - start, 1)
        rows.append(row)
        out.write_text(json.dumps(rows))


# --------------------------------------------------------------------- phase 2: parity
def parity_one(artifact: str, config_dir: str, mesh: Any) -> dict[str, Any]:
    """One forward/backward of the parallelized model vs the unsharded one, same weights.

    On a float32 miss two float64 runs tell rounding from a sharding error: the unsharded
    model in float64 (how far float32 itself is from the exact answer: ``f64``), and the
    same parity check with both models in float64 (``exact64``: where the sharded model
    is exact, this is near 1e-15 however large the float32 miss).
    """
    import torch

    from hpcodegen.hf import load_transformers_config, model_class_for

    config_dict = json.loads(Path(config_dir, "config.json").read_text())
    config = load_transformers_config(config_dict)
    torch.manual_seed(0)
    ref = model_class_for(config_dict)(config).float().eval()
    g = torch.Generator().manual_seed(1)
    # the rows the model takes: MusicGen's decoder reads batch x num_codebooks rows
    rows = 2 * max(1, int(getattr(config, "num_codebooks", 1) or 1))
    vocab = getattr(config, "vocab_size", None) or config.get_text_config().vocab_size
    ids = torch.randint(0, vocab, (rows, 17), generator=g)  # a text sub-config's
    ids, labels = ids[:, :-1], ids[:, 1:]
    result = _parity_at(artifact, config, config_dict, ref, ids, labels, mesh, exact=True)
    if not result["ok"] and not result["odd"] and "f64" in result:
        try:  # a float32-only kernel cannot run this diagnostic; the float32 miss stands
            ref64 = model_class_for(config_dict)(config).double().eval()
            ref64.load_state_dict(ref.state_dict())
            again = _parity_at(artifact, config, config_dict, ref64, ids, labels, mesh)
        except Exception:
            return result
        result["exact64"] = {"logits": again["logits"], "grad": again["grad"],
                             "ok": again["ok"]}
    return result


def _parity_at(artifact: str, config: Any, config_dict: Mapping[str, Any], ref: Any,
               ids: Any, labels: Any, mesh: Any, exact: bool = False) -> dict[str, Any]:
    """Parity of the artifact's model against ``ref`` at ``ref``'s dtype; with ``exact``,
    a miss also gets the float64 distances of the sharded and unsharded results."""
    import torch
    import torch.nn.functional as F

    from hpcodegen.artifact.load import load_meta
    from hpcodegen.hf import model_class_for
    from hpcodegen.launch.parity import full_logits, max_param_diff
    from hpcodegen.runtime import MeshContext, parallelize_from_generated
    from hpcodegen.runtime.loader import generated_model_class, import_generated_module
    from hpcodegen.runtime.mesh import resolve_active_mesh

    meta = load_meta(Path(artifact)).data
    dtype = next(ref.parameters()).dtype
    gen_cls = generated_model_class(meta, import_generated_module(Path(artifact)))
    gen = gen_cls(config).to(dtype).eval()
    gen.load_state_dict(ref.state_dict())
    context = MeshContext(device_mesh=mesh)
    parallelize_from_generated(gen, context, artifact, hf_config=dict(config_dict))
    active = resolve_active_mesh(meta, context)

    def loss_of(model: Any, sharded: bool) -> tuple[Any, Any]:
        logits = model(input_ids=ids, use_cache=False).logits
        if sharded:
            logits = full_logits(logits, model, meta, active)
        flat = logits.reshape(-1, logits.shape[-1])  # (batch, [codebooks,] seq) rows
        flat = flat if flat.dtype == torch.float64 else flat.float()
        return F.cross_entropy(flat, labels.flatten()), logits

    loss, logits = loss_of(gen, True)
    loss.backward()
    ref_loss, ref_logits = loss_of(ref, False)
    ref_loss.backward()
    grad, worst, odd = max_param_diff(gen, ref, meta, active, lambda p: p.grad)
    logit_diff = float((logits.detach() - ref_logits.detach()).abs().max())
    result = {"logits": logit_diff, "grad": grad, "worst": worst, "odd": odd,
              "ok": logit_diff <= TOL and grad <= TOL and not odd}
    if exact and not result["ok"] and not odd:  # how far is float32 from the exact answer?
        try:
            exact_ref = model_class_for(config_dict)(config).double().eval()
            exact_ref.load_state_dict(ref.state_dict())
            exact_loss, exact_logits = loss_of(exact_ref, False)
            exact_loss.backward()
            result["f64"] = {
                "sharded_logits": float((logits.detach().double() - exact_logits.detach()
                                         ).abs().max()),
                "unsharded_logits": float((ref_logits.detach().double() - exact_logits.detach()
                                           ).abs().max()),
                "sharded_grad": max_param_diff(gen, exact_ref, meta, active,
                                               lambda p: p.grad)[0],
                "unsharded_grad": max(float((a.grad.double() - b.grad).abs().max())
                                      for a, b in zip(ref.parameters(), exact_ref.parameters(),
                                                      strict=True) if a.grad is not None)}
        except Exception:  # a float32-only kernel: the float32 numbers stand alone
            result.pop("f64", None)
    return result


def _parity_rank(rank: int, world: int, init: str, jobs: list[tuple[str, str, str]],
                 out_dir: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    import warnings

    warnings.filterwarnings("ignore")
    dist.init_process_group("gloo", rank=rank, world_size=world, init_method=init)
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    cp_mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("cp",))
    results: dict[str, Any] = {}
    try:
        for key, artifact, config_dir in jobs:
            try:
                if key.endswith("/cp2"):
                    from coverage_cp import cp_parity_one

                    results[key] = cp_parity_one(artifact, config_dir, cp_mesh)
                else:
                    results[key] = parity_one(artifact, config_dir, mesh)
            except Exception as exc:
                results[key] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
            dist.barrier()
            Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
    finally:
        dist.destroy_process_group()


def parity_worker(jobs_file: Path, out_dir: Path, world: int = 2) -> None:
    import torch.multiprocessing as mp

    jobs = json.loads(jobs_file.read_text())
    init = Path(out_dir, "rendezvous").resolve().as_uri()
    mp.spawn(_parity_rank, args=(world, init, jobs, str(out_dir)), nprocs=world, join=True)


# -------------------------------------------------------------------------- the driver
def _run_batches(batches: list[list[str]], timeout: float, jobs: int) -> list[tuple[int, str]]:
    """Run each argv, ``jobs`` at a time, each with a hard timeout."""
    results: list[tuple[int, str]] = [(-1, "")] * len(batches)
    running: list[tuple[int, subprocess.Popen, float]] = []
    pending = list(enumerate(batches))
    while pending or running:
        while pending and len(running) < jobs:
            i, argv = pending.pop(0)
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, start_new_session=True)
            running.append((i, proc, time.monotonic()))
        time.sleep(0.5)
        for item in list(running):
            i, proc, started = item
            if proc.poll() is not None:
                results[i] = (proc.returncode, proc.stdout.read() if proc.stdout else "")
                running.remove(item)
            elif time.monotonic() - started > timeout:
                os.killpg(proc.pid, 9)
                proc.wait()
                results[i] = (124, "timeout")
                running.remove(item)
    return results


def run_phase1(families: Mapping[str, str], work: Path, jobs: int, per_worker: int
               ) -> list[dict[str, Any]]:
    items = list(families.items())
    chunks = [items[i:i + per_worker] for i in range(0, len(items), per_worker)]
    argvs = []
    for n, chunk in enumerate(chunks):
        spec = work / f"phase1_{n}.json"
        if spec.is_file() and json.loads(spec.read_text()) == [list(c) for c in chunk] \
                and spec.with_suffix(".out.json").is_file():
            continue  # done by an earlier run in the same --work dir
        spec.write_text(json.dumps(chunk))
        argvs.append([sys.executable, __file__, "--phase1-worker", str(spec)])
    _run_batches(argvs, timeout=120 * per_worker, jobs=jobs)
    rows: dict[str, dict[str, Any]] = {}
    for n, chunk in enumerate(chunks):
        done = work / f"phase1_{n}.out.json"
        for row in json.loads(done.read_text()) if done.is_file() else []:
            rows[row["family"]] = row
        for model_type, cls in chunk:
            rows.setdefault(model_type, {"family": model_type, "class": cls, "moe": False,
                                         "config_error": "worker crashed or timed out"})
    return [rows[k] for k in families]


def _spawn_parity(batches: list[list[list[str]]], work: Path, tag: str
                  ) -> dict[str, dict[str, Any]]:
    """Run each batch of ``[key, artifact, config_dir]`` in one 2-rank spawn; the status per
    key, with a died spawn's last output line for the keys it did not reach."""
    argvs = []
    for n, batch in enumerate(batches):
        spec = work / f"parity_{tag}{n}.json"
        spec.write_text(json.dumps(batch))
        out = work / f"parity_{tag}{n}"
        out.mkdir(exist_ok=True)
        for stale in out.glob("rank*.json"):
            stale.unlink()
        argvs.append([sys.executable, __file__, "--parity-worker", str(spec), str(out)])
    codes = _run_batches(argvs, timeout=60 + 40 * max(len(b) for b in batches), jobs=1) \
        if batches else []
    found: dict[str, dict[str, Any]] = {}
    for n, batch in enumerate(batches):
        ranks = []
        for r in (0, 1):
            f = work / f"parity_{tag}{n}" / f"rank{r}.json"
            ranks.append(json.loads(f.read_text()) if f.is_file() else {})
        code, output = codes[n]
        last = next((ln.strip() for ln in reversed(output.splitlines())
                     if ln.strip() and not ln.startswith(" ")), "")
        for key, _, _ in batch:
            res = [rk.get(key) for rk in ranks]
            if any(x is None for x in res):
                found[key] = {"ok": False, "died": True,
                              "error": f"the parity spawn died or timed out (exit {code})"
                                       + (f": {last[:200]}" if last else "")}
            else:
                found[key] = {"ok": all(x["ok"] for x in res),
                              "logits": max(x.get("logits", 0.0) for x in res),
                              "grad": max(x.get("grad", 0.0) for x in res),
                              "error": next((x["error"] for x in res if x.get("error")), None),
                              "worst": res[0].get("worst"),
                              "odd": res[0].get("odd"), "f64": res[0].get("f64"),
                              "exact64": _exact64(res)}
    return found


def _exact64(per_rank: list[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The ranks' float64 parity of a float32 miss, worst over ranks (None if not run)."""
    runs = [x.get("exact64") for x in per_rank]
    if not all(runs):
        return None
    return {"ok": all(r["ok"] for r in runs), "logits": max(r["logits"] for r in runs),
            "grad": max(r["grad"] for r in runs)}


def run_phase2(rows: list[dict[str, Any]], work: Path, per_spawn: int) -> None:
    """Parity of every artifact that verified, ``per_spawn`` models per spawn; the models a
    died spawn did not reach run again, one per spawn, so one crash blames one family."""
    jobs = []
    for row in rows:
        for variant in ("tp2", "sp", "cp2"):
            v = row.get(variant) or {}
            if v.get("ok"):
                jobs.append([f"{row['family']}/{variant}", v["dir"],
                             str(work / row["family"] / "config")])
    found = _spawn_parity([jobs[i:i + per_spawn] for i in range(0, len(jobs), per_spawn)],
                          work, "")
    lost = [job for job in jobs if found[job[0]].get("died")]
    if per_spawn > 1 and lost:
        found.update(_spawn_parity([[job] for job in lost], work, "alone"))
    by_row = {r["family"]: r for r in rows}
    for key, status in found.items():
        family, variant = key.split("/")
        status.pop("died", None)
        by_row[family].setdefault("parity", {})[variant] = status


# --------------------------------------------------------------------------- the report
def _cell(v: Mapping[str, Any] | None) -> str:
    if not v:
        return "-"
    if v.get("ok"):
        return "ok" if v.get("split", True) else "replicated"
    return f"fail ({v.get('stage')})"


def _parity_cell(p: Mapping[str, Any] | None) -> str:
    if not p:
        return "-"
    if p.get("ok"):
        return f"ok ({max(p['logits'], p['grad']):.0e})"
    if _rounding_only(p):
        return f"ok in fp64 ({max(p['exact64']['logits'], p['exact64']['grad']):.0e})"
    return "FAIL"


def _rounding_only(p: Mapping[str, Any]) -> bool:
    """A float32 miss whose float64 run matches: the sharded model computes the unsharded
    model's function; float32 cannot hold 1e-5 at this model's magnitudes."""
    return bool((p.get("exact64") or {}).get("ok")) and not p.get("odd") and not p.get("error")


def _rounding_note(f64: Mapping[str, Any] | None) -> str:
    """What a float64 run of the unsharded model says of a miss: the sharded model is no
    further from the exact answer than the unsharded float32 model (rounding, kept a miss:
    the bound stays absolute), or it is (a real error)."""
    if not f64:
        return ""
    line = (f" (vs float64: sharded logits {f64['sharded_logits']:.1e} / grads "
            f"{f64['sharded_grad']:.1e}, unsharded float32 {f64['unsharded_logits']:.1e} / "
            f"{f64['unsharded_grad']:.1e}")
    rounding = f64["sharded_logits"] <= max(TOL, 2 * f64["unsharded_logits"]) and \
        f64["sharded_grad"] <= max(TOL, 2 * f64["unsharded_grad"])
    return line + (": float32 rounding, not a sharding error)" if rounding else ")")


def classify_row(row: Mapping[str, Any]) -> tuple[str, str]:
    """``(status, reason)`` of one family; status is ok, replicated or unsupported."""
    if row.get("config_error"):
        return "unsupported", f"no tiny model: {row['config_error']}"
    tp2 = row.get("tp2") or {}
    if not tp2.get("ok"):
        return "unsupported", f"tp2 {tp2.get('stage')}: {tp2.get('reason')}"
    par = (row.get("parity") or {}).get("tp2") or {}
    if not par:
        return "unsupported", "tp2 parity: not run (--no-parity)"
    notes = []
    if not par.get("ok") and _rounding_only(par):
        notes.append(f"tp2 parity in float32 misses {TOL:g} by rounding (logits "
                     f"{par['logits']:.1e}, grad {par['grad']:.1e} at {par.get('worst')}"
                     f"{_rounding_note(par.get('f64')).rstrip(')')}); in float64 the "
                     f"sharded model matches ({par['exact64']['logits']:.0e} / "
                     f"{par['exact64']['grad']:.0e})")
    elif not par.get("ok"):
        why = par.get("error") or (f"logits diff {par.get('logits'):.1e}, grad diff "
                                   f"{par.get('grad'):.1e} at {par.get('worst')}"
                                   + _rounding_note(par.get("f64")))
        return "unsupported", f"tp2 parity: {why}"
    if not tp2.get("split"):
        return "replicated", ("no tp rules (no HF base_model_tp_plan, no package rule): only "
                              "the embedding and LM head are split, the layers replicated")
    for variant in ("tp4", "sp"):
        v = row.get(variant) or {}
        if v and not v.get("ok"):
            notes.append(f"{variant} {v.get('stage')}: {v.get('reason')}")
    sp_par = (row.get("parity") or {}).get("sp")
    if sp_par and not sp_par.get("ok") and not _rounding_only(sp_par):
        notes.append(f"sp parity: {sp_par.get('error') or 'mismatch'}")
    return "ok", "; ".join(notes)


def render(rows: list[dict[str, Any]], transformers_version: str, seconds: float) -> str:
    lines = [
        "# Model coverage",
        "",
        f"Measured by `bench/coverage.py` against transformers {transformers_version} "
        f"({len(rows)} causal-LM model types, {seconds:.0f} s). Each family is a tiny",
        "config built from its config class's defaults (2 layers, hidden 64, 4 heads / 2 kv",
        "heads, vocab 256); `tp2`, `tp4`, `sp` (tp 2 with `--sp`) are `generate` + `verify",
        "--hf-config` (+ `inspect-plan` for tp2); parity is logits and every gradient against",
        f"the unsharded model on 2 gloo ranks (tolerance {TOL:g}; the worst diff is shown).",
        "Where float32 misses the tolerance, the same check runs with both models in float64:",
        "`ok in fp64` means the sharded model matches there, so the float32 miss is rounding",
        "at the model's magnitudes (the unsharded float32 model is as far from the float64",
        "answer; both distances are in the reason), not a sharding error.",
        "`replicated`: the plan verified but splits no decoder layer (no rule names it).",
        "`cp2`: `generate --tp 1 --cp 2` + `verify`, then parity at cp 2 on 2 gloo ranks on a",
        "plain and a padded batch of 32 tokens (`bench/coverage_cp.py`); `refused`: generate",
        "names what context parallelism cannot make exact (the reasons are listed below",
        "the tables).",
        "`rules`: hf (transformers' plan), pkg (hpcodegen/generate/rules/<model_type>.yaml),",
        "none. Regenerate: `python bench/coverage.py`.",
        "",
    ]
    groups = _groups(rows)
    for title, group in (("Dense decoder families", groups["dense"]),
                         ("MoE families", groups["moe"]),
                         ("Encoder and encoder-decoder families", groups["other"])):
        lines += [f"## {title}", ""]
        if title.startswith("Encoder"):
            lines += ["transformers also maps these to causal-LM classes: a bidirectional "
                      "encoder run with", "`is_decoder=True` (it has a masked-LM head) or the "
                      "decoder half of a seq2seq model.", "They are listed, not counted in "
                      "`dense_ok`.", ""]
        lines += ["| family | rules | tp2 | tp4 | sp | parity tp2 | parity sp | cp2 | status "
                  "| reason |", "|---|---|---|---|---|---|---|---|---|---|"]
        for row in group:
            status, reason = classify_row(row)
            tp2 = row.get("tp2") or {}
            rules = "pkg" if tp2.get("package") or _uses_package(row["family"]) else \
                ("hf" if row.get("hf_plan") else "none")
            par = row.get("parity") or {}
            cells = [row["family"], rules, _cell(row.get("tp2")), _cell(row.get("tp4")),
                     _cell(row.get("sp")), _parity_cell(par.get("tp2")),
                     _parity_cell(par.get("sp")), cp_cell(row), status,
                     reason.replace("|", "\\|").replace("\n", " ")]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")

    def count(group: list[dict[str, Any]], status: str) -> int:
        return sum(classify_row(r)[0] == status for r in group)

    dense, moe, other = groups["dense"], groups["moe"], groups["other"]
    lines += ["## Context parallelism (cp2) not ok", "",
              "| family | why |", "|---|---|"]
    lines += [f"| {r['family']} | {cp_reason(r).replace('|', '/').replace(chr(10), ' ')} |"
              for r in rows if cp_reason(r)]
    lines.append("")
    lines.append("cp2: " + ", ".join(
        f"{name} ok={sum(cp_cell(r).startswith('ok') for r in group)}/{len(group)} "
        f"refused={sum(cp_cell(r) == 'refused' for r in group)}"
        for name, group in (("dense", dense), ("moe", moe))))
    lines.append("replicated only (exact, layers not split): "
                 f"dense={count(dense, 'replicated')} moe={count(moe, 'replicated')}")
    lines.append(f"encoder and encoder-decoder families: ok={count(other, 'ok')}/{len(other)} "
                 f"replicated={count(other, 'replicated')}")
    lines.append("")
    lines.append(f"coverage: dense_ok={count(dense, 'ok')}/{len(dense)} "
                 f"moe_ok={count(moe, 'ok')}/{len(moe)}")
    return "\n".join(lines) + "\n"


def _groups(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Rows by table: dense decoders, MoE (any kind), encoder / encoder-decoder."""
    out: dict[str, list[dict[str, Any]]] = {"dense": [], "moe": [], "other": []}
    for row in rows:
        kind = row.get("kind") or family_kind(row["family"])
        out["moe" if row.get("moe") else "dense" if kind == "decoder" else "other"].append(row)
    return out


@contextlib.contextmanager
def _locked(path: str) -> Iterator[None]:
    if not path:
        yield
        return
    import fcntl

    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", default="", help="comma list of model types (default all)")
    parser.add_argument("--jobs", type=int, default=2, help="phase-1 worker processes")
    parser.add_argument("--per-worker", type=int, default=6, help="families per phase-1 worker")
    parser.add_argument("--per-spawn", type=int, default=8, help="parity models per gloo spawn")
    parser.add_argument("--no-parity", action="store_true")
    parser.add_argument("--lock", default="", help="hold this flock file during the parity "
                        "spawns (a shared machine's heavy-job lock)")
    parser.add_argument("--out", default=str(REPO / "docs" / "models.md"))
    parser.add_argument("--work", default="", help="keep artifacts here (default a temp dir)")
    parser.add_argument("--json", default="", help="also write the raw rows here")
    parser.add_argument("--phase1-worker", nargs=1, help=argparse.SUPPRESS)
    parser.add_argument("--parity-worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.phase1_worker:
        spec = Path(args.phase1_worker[0])
        phase1_worker([tuple(x) for x in json.loads(spec.read_text())], spec.parent,
                      spec.with_suffix(".out.json"))
        return 0
    if args.parity_worker:
        parity_worker(Path(args.parity_worker[0]), Path(args.parity_worker[1]))
        return 0
    import transformers

    families = causal_lm_families()
    if args.families:
        wanted = [f.strip() for f in args.families.split(",") if f.strip()]
        unknown = [f for f in wanted if f not in families]
        if unknown:
            parser.error(f"unknown model types: {', '.join(unknown)}")
        families = {f: families[f] for f in wanted}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="hpcodegen-coverage-") as tmp:
        work = Path(args.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        rows = run_phase1(families, work, args.jobs, args.per_worker)
        if not args.no_parity:
            with _locked(args.lock):
                run_phase2(rows, work, args.per_spawn)
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
    text = render(rows, transformers.__version__, time.perf_counter() - start)
    Path(args.out).write_text(text)
    print(text.splitlines()[-1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
