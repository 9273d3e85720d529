"""HF config reading (pure JSON) and the meta-device model (lazy torch + transformers).

A config may be named by a Hub id (``org/name``): :func:`resolve_model_dir` finds its
snapshot in the local Hugging Face cache through huggingface_hub (never downloading).

``read_hf_config`` and ``source_from_config`` never import transformers, so ``verify
--hf-config`` stays fast; only :func:`build_meta_model` loads torch and transformers, to
build the real model structure on the meta device (no weights, no download).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcodegen.artifact.load import parse_json_text
from hpcodegen.errors import InputError, PlanError, error

if TYPE_CHECKING:
    import torch

CONFIG_NAME = "config.json"
MAX_CONFIG_BYTES = 8 * 1024 * 1024

#: HF config fields that fix the model's shape; recorded as ``source.structure``.
STRUCTURE_FIELDS: tuple[str, ...] = (
    "hidden_size",
    "intermediate_size",
    "moe_intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "num_hidden_layers",
    "num_experts",
    "num_experts_per_tok",
    "num_local_experts",
    "vocab_size",
    "tie_word_embeddings",
    "attention_bias",
    "mlp_bias",
)


#: Names transformers configs give the routed-expert count (``attribute_map`` aliases one to
#: another per model: qwen3_moe/mixtral/gpt_oss ``num_experts`` -> ``num_local_experts``,
#: deepseek_v3/glm4_moe ``num_local_experts`` -> ``n_routed_experts``, olmoe the reverse). A
#: ``config.json`` holds one of them; a recorded structure may hold several.
EXPERT_COUNT_FIELDS: tuple[str, ...] = ("num_local_experts", "num_experts", "n_routed_experts")

#: Groups of structure fields that name one quantity (see ``EXPERT_COUNT_FIELDS``).
STRUCTURE_ALIASES: tuple[tuple[str, ...], ...] = (EXPERT_COUNT_FIELDS,)


def structure_value(config: Mapping[str, Any], key: str) -> tuple[str, Any] | None:
    """``(field, value)`` for structure field ``key`` (a name, or a dotted path into
    sub-configs: ``text_config.hidden_size``): the field itself, else an alias its config
    sets instead (``num_experts`` recorded, ``num_local_experts`` saved), the field named by
    its dotted path; None when neither is set."""
    *path, name = key.split(".")
    scope: Any = config
    for part in path:
        scope = scope.get(part)
        if not isinstance(scope, Mapping):
            return None
    prefix = "".join(f"{part}." for part in path)
    if name in scope:
        return key, scope[name]
    for group in STRUCTURE_ALIASES:
        if name in group:
            for alias in group:
                if alias in scope:
                    return prefix + alias, scope[alias]
    return None


#: ``org/name``: a Hub model id (a local path that exists always wins)
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


#: Longest Hub id (the Hub allows 96 characters per part).
MAX_HUB_ID = 200


def config_int(config: Any, *names: str) -> int | None:
    """The first positive integer among ``names`` of a config, its top level first, then its
    text part (``text_config`` of a JSON dict, ``get_text_config()`` of a transformers
    config); None when none is set. ``config`` is either (pure: nothing is imported)."""
    scopes: list[Any] = [config]
    if isinstance(config, Mapping):
        if isinstance(config.get("text_config"), Mapping):
            scopes.append(config["text_config"])
    elif callable(getattr(config, "get_text_config", None)):
        scopes.append(config.get_text_config())
    for scope in scopes:
        for name in names:
            value = scope.get(name) if isinstance(scope, Mapping) else getattr(scope, name, None)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


def is_hub_id(ref: str | os.PathLike[str]) -> bool:
    """``org/name`` that is not an existing local path."""
    text = os.fspath(ref)
    if len(text) > MAX_HUB_ID or not _HUB_ID.match(text) or ".." in text:
        return False
    try:
        return not Path(text).exists()
    except OSError:
        return False


def hub_snapshot_dir(repo_id: str) -> Path:
    """The local snapshot dir of a Hub model, found through huggingface_hub in the local
    cache only (``HF_HOME`` / ``HF_HUB_CACHE``); nothing is downloaded, so it works with
    ``HF_HUB_OFFLINE=1``. InputError (exit 2) when it is not cached."""
    from hpcodegen.extras import require

    require("hub", f"the Hub id {repo_id!r}", ("huggingface_hub",))
    from huggingface_hub import constants, hf_hub_download

    try:
        config = hf_hub_download(repo_id, CONFIG_NAME, local_files_only=True)
    except Exception as exc:  # LocalEntryNotFoundError, a broken cache entry, ...
        raise InputError([error(
            "config.hub_not_cached", repo_id,
            f"{repo_id} is not a local path, and the Hub model {repo_id} has no "
            f"{CONFIG_NAME} in the local Hugging Face cache ({constants.HF_HUB_CACHE}): "
            f"{type(exc).__name__}",
            hint=f"fetch it where the network is reachable (hf download {repo_id} "
                 f"{CONFIG_NAME}) into that cache (HF_HOME / HF_HUB_CACHE), or pass a "
                 "local directory")]) from None
    return Path(config).parent


def resolve_model_dir(ref: str | os.PathLike[str]) -> Path:
    """A local path as is, or a Hub id's snapshot dir from the local cache."""
    return hub_snapshot_dir(os.fspath(ref)) if is_hub_id(ref) else Path(ref)


def resolve_config_path(path: str | os.PathLike[str]) -> Path:
    """A model dir, a ``config.json`` or a cached Hub id (``org/name``) -> the config file;
    InputError when absent."""
    p = resolve_model_dir(path)
    try:
        candidate = p / CONFIG_NAME if p.is_dir() else p
        found = candidate.is_file()
    except OSError:  # a name too long, a loop of links
        candidate, found = p, False
    if not found:
        raise InputError([error("config.not_found", str(p), "no HF config found",
                                expected=f"a {CONFIG_NAME}, a directory holding one, or a "
                                         "Hub id (org/name) in the local HF cache",
                                file=str(candidate))])
    return candidate


def read_hf_config(path: str | os.PathLike[str]) -> tuple[dict[str, Any], Path]:
    """Read an HF ``config.json`` as plain JSON (no transformers import).

    Returns:
        ``(config dict, config path)``.

    Raises:
        InputError: missing, unreadable, not JSON (``NaN``/``Infinity``, which transformers
            writes, are read as floats), or not an object.
    """
    config_path = resolve_config_path(path)
    try:
        raw = config_path.read_bytes()
    except OSError as exc:
        raise InputError([error("config.unreadable", "", f"cannot read: {exc.strerror}",
                                file=str(config_path))]) from None
    # transformers writes non-finite floats (``"time_step_limit": [0.0, Infinity]``) as
    # Python's json does: what HF writes must read
    value, _ = parse_json_text(raw, str(config_path), MAX_CONFIG_BYTES, python_constants=True)
    if not isinstance(value, dict):
        raise InputError([error("config.not_object", "", "HF config is not a JSON object",
                                file=str(config_path))])
    check_config(value, str(config_path))
    return value, config_path


#: Sanity bounds on a config's counts and sizes, by the key's ending (at any depth): far
#: above any real model (the deepest have ~200 layers), low enough that a hostile config
#: is refused at once instead of building 10^5 layers. Layers and blocks are modules, so
#: theirs is the tightest bound, still above the 2,500 layers of the 10,000-entry dense plan
#: the gate is sized for (bench/gate_speed.py derives it); sizes only guard against absurd
#: values.
SIZE_LIMITS: tuple[tuple[tuple[str, ...], int], ...] = (
    (("layers", "n_layer", "blocks"), 4_096), (("experts",), 65_536),
    (("heads", "n_head"), 65_536), (("_size", "_dim"), 2**31))
#: Structure fields that are booleans; the others are counts or sizes (integers).
BOOL_FIELDS = frozenset({"tie_word_embeddings", "attention_bias", "mlp_bias"})
#: Deepest nesting of sub-configs walked here (transformers' own nest 2-3 deep).
MAX_CONFIG_DEPTH = 32


def _count_limit(key: str) -> int | None:
    low = key.lower()
    return next((limit for ends, limit in SIZE_LIMITS if low.endswith(ends)), None)


def config_problems(config: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(JSON pointer, what is wrong)`` for a config no model should be built from: a
    structure field of the wrong type (``"num_hidden_layers": "2"``, a boolean head count),
    a count or size beyond :data:`SIZE_LIMITS`, a ``model_type`` that is not a string or
    ``architectures`` that are not strings. Pure; empty for every real config."""
    from hpcodegen.errors import pointer

    out: list[tuple[str, str]] = []
    if "model_type" in config and not isinstance(config["model_type"], str):
        out.append(("/model_type", "expected a string"))
    archs = config.get("architectures")
    if archs is not None and not (isinstance(archs, list)
                                  and all(isinstance(a, str) for a in archs)):
        out.append(("/architectures", "expected a list of class names"))
    stack: list[tuple[tuple[str, ...], Mapping[str, Any]]] = [((), config)]
    while stack:
        path, scope = stack.pop()
        if len(path) > MAX_CONFIG_DEPTH:
            out.append((pointer(*path), f"sub-configs nested deeper than {MAX_CONFIG_DEPTH}"))
            continue
        for key, value in scope.items():
            where = pointer(*path, key)
            if isinstance(value, Mapping):
                stack.append(((*path, str(key)), value))
            elif key in BOOL_FIELDS:
                if value is not None and not isinstance(value, bool):
                    out.append((where, f"{key} is {str(value)[:40]!r}, expected true or false"))
            elif key in STRUCTURE_FIELDS and not _counts(value):
                out.append((where, f"{key} is {str(value)[:40]!r}, expected a non-negative "
                                   "integer"))
            else:
                out += _limit_problems(where, str(key), value)
    return out


def _counts(value: Any) -> bool:
    """None, a non-negative integer, or a list of them (per-layer sizes)."""
    items = value if isinstance(value, list) else [value]
    return all(v is None or (type(v) is int and v >= 0) for v in items)


def _limit_problems(where: str, key: str, value: Any) -> list[tuple[str, str]]:
    limit = _count_limit(key)
    items = value if isinstance(value, list) else [value]
    big = [v for v in items if type(v) is int and limit is not None and v > limit]
    if big:
        return [(where, f"{key} is {big[0]}, more than the sanity limit {limit} for a count "
                        "or size of this kind")]
    return []


def check_config(config: Mapping[str, Any], file: str | None = None) -> None:
    """Refuse (InputError, exit 2) a config :func:`config_problems` objects to, before
    anything is built from it."""
    problems = config_problems(config)
    if problems:
        raise InputError([error("config.bad_value", where, message, file=file,
                                hint="fix the config; real models stay far below these "
                                     "limits") for where, message in problems[:5]])


def architecture_of(config: Mapping[str, Any]) -> str | None:
    """``architectures[0]`` when present."""
    archs = config.get("architectures")
    if isinstance(archs, list) and archs and isinstance(archs[0], str):
        return archs[0]
    return None


def structure_of(config: Mapping[str, Any]) -> dict[str, Any]:
    """The shape fields (``STRUCTURE_FIELDS``) of the config and of all its sub-configs.

    Top-level fields keep their names, as the existing system records them. Composite models
    keep their shapes in sub-configs (``text_config``, ``vision_config``, BLT's
    ``encoder_config``, MusicGen's ``decoder``): the fields of every nested object, at any
    depth, are keyed by their dotted path (``text_config.hidden_size``). Only objects under
    identifier keys are visited (HF config attributes are identifiers), so a path has one
    reading. Order: fields in ``STRUCTURE_FIELDS`` order, the top level first, then the
    sub-configs depth-first by sorted key; objects holding no field add nothing.
    """
    found: dict[str, Any] = {}
    stack: list[tuple[str, Mapping[str, Any]]] = [("", config)]
    while stack:  # iterative: a config may nest as deep as JSON parsing allows
        prefix, scope = stack.pop()
        found.update((prefix + key, scope[key]) for key in STRUCTURE_FIELDS if key in scope)
        subs = sorted(key for key, value in scope.items()
                      if isinstance(key, str) and key.isidentifier()
                      and isinstance(value, Mapping))
        stack.extend((f"{prefix}{key}.", scope[key]) for key in reversed(subs))
    return found


def structure_view(config: Mapping[str, Any], keys: Iterable[str]) -> dict[str, Any]:
    """A copy of ``config`` whose structure fields, at every depth, are exactly those of
    ``keys`` that it sets (through aliases too, stored under the name in ``keys``).

    ``PretrainedConfig.to_dict()`` adds class defaults and aliases that the ``config.json``
    an artifact was generated from never wrote; the recorded fields are the ones to compare.
    """
    found = {key: structure_value(config, key) for key in keys}
    view = _without_structure(config)
    for key, hit in found.items():
        if hit is None:
            continue
        *path, name = key.split(".")
        scope = view
        for part in path:
            scope = scope.setdefault(part, {})
        scope[name] = hit[1]
    return view


def structure_config(structure: Mapping[str, Any]) -> dict[str, Any]:
    """A recorded ``source.structure`` as a config: dotted fields nested back into their
    sub-configs (``text_config.hidden_size`` -> ``{"text_config": {"hidden_size": ...}}``)."""
    config: dict[str, Any] = {}
    for key, value in structure.items():
        *path, name = str(key).split(".")
        scope: Any = config
        for part in path:
            scope = scope.setdefault(part, {})
            if not isinstance(scope, dict):
                break
        else:
            scope[name] = value
    return config


def _without_structure(config: Mapping[str, Any]) -> dict[str, Any]:
    return {key: _without_structure(value) if isinstance(value, Mapping) else value
            for key, value in config.items() if key not in STRUCTURE_FIELDS}


def source_from_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The part of ``meta.source`` that a config determines (architecture, type, structure)."""
    return {
        "architecture": architecture_of(config),
        "model_type": config.get("model_type"),
        "structure": structure_of(config),
    }


def load_transformers_config(config: Mapping[str, Any]) -> Any:
    """A transformers ``PretrainedConfig`` from a config dict (imports transformers): the
    config the class named by ``architectures[0]`` takes (:func:`config_for_class`)."""
    from transformers import AutoConfig

    data = dict(config)
    model_type = data.pop("model_type", None)
    if not model_type:
        raise PlanError([error("config.no_model_type", "/model_type",
                               "HF config has no model_type")])
    check_config(config)
    try:
        hf_config = AutoConfig.for_model(model_type, **data)
    except (ValueError, KeyError) as exc:
        # transformers' message lists every model type it knows (~500): keep its first clause
        reason = str(exc).split(". Should contain one of")[0].strip()
        reason = reason if len(reason) <= 200 else reason[:200] + "..."
        message = f"transformers cannot build model_type {model_type!r}: {reason}"
        raise PlanError([error("config.unknown_model_type", "/model_type", message,
                               hint="check the config's model_type, or the installed "
                                    "transformers version")]) from None
    except Exception as exc:  # the config class's own validation (strict dataclass fields)
        reason = " ".join(str(exc).split())
        reason = reason if len(reason) <= 240 else reason[:240] + "..."
        raise PlanError([error("config.model_unbuildable", "",
                               f"transformers refuses this config ({model_type}): "
                               f"{type(exc).__name__}: {reason}",
                               hint="fix the field it names")]) from None
    arch = architecture_of(config)
    import transformers

    cls = getattr(transformers, arch, None) if arch else None
    return config_for_class(hf_config, cls) if isinstance(cls, type) else hf_config


def config_for_class(hf_config: Any, cls: type) -> Any:
    """The config ``cls`` is built from, as transformers' auto classes choose it.

    A composite config (a vision-language model's: ``text_config`` beside
    ``vision_config``) names a causal-LM class whose ``config_class`` is its text
    sub-config's class (``Qwen3_5ForCausalLM`` takes a ``Qwen3_5TextConfig``): transformers
    builds that class from ``config.get_text_config()``, and so do we. A class that takes
    neither the config nor its text sub-config cannot be built from it (PlanError naming
    both classes).
    """
    wanted = getattr(cls, "config_class", None)
    if not isinstance(wanted, type) or isinstance(hf_config, wanted):
        return hf_config
    subs = getattr(hf_config, "sub_configs", None) or {}
    if subs.get("text_config") is wanted:
        return hf_config.get_text_config()
    owned = [key for key, sub in subs.items() if sub is wanted]
    hint = (f"the config's {owned[0]!r} sub-config is a {wanted.__name__}: use it as the "
            f"config.json (model_type {getattr(wanted, 'model_type', '?')!r})" if owned
            else "use a config of the class's own model_type")
    raise PlanError([error(
        "config.class_mismatch", "/architectures/0",
        f"{cls.__name__} takes a {wanted.__name__} (model_type "
        f"{getattr(wanted, 'model_type', '?')!r}); this config is a "
        f"{type(hf_config).__name__} (model_type {getattr(hf_config, 'model_type', '?')!r}) "
        "and transformers cannot build the class from it", hint=hint)])


def model_class_for(config: Mapping[str, Any]) -> type:
    """The transformers class named by ``architectures[0]`` (imports transformers)."""
    import transformers

    arch = architecture_of(config)
    if arch is None:
        raise PlanError([error("config.no_architecture", "/architectures",
                               "the HF config names no model class (architectures[0])",
                               expected='e.g. "architectures": ["LlamaForCausalLM"]')])
    cls = getattr(transformers, arch, None)
    if not isinstance(cls, type):
        raise PlanError([error("config.unknown_architecture", "/architectures/0",
                               f"transformers has no model class {arch!r}")])
    return cls


def build_meta_model(config: Mapping[str, Any], model_cls: type | None = None) -> torch.nn.Module:
    """Build the model on the meta device: the real structure, no weights, no download.

    A config transformers itself cannot build the model from (a missing or inconsistent
    field: its ``__init__`` raises) is a PlanError naming the class and transformers'
    reason, never a traceback.

    Args:
        config: the HF config as a dict.
        model_cls: the class to instantiate; default ``architectures[0]`` from transformers.
    """
    from hpcodegen.gc_pause import MODEL_STACK, import_paused

    import_paused(*MODEL_STACK)  # the collector paused: hpcodegen.gc_pause
    import torch

    hf_config = load_transformers_config(config)
    cls = model_cls or model_class_for(config)
    hf_config = config_for_class(hf_config, cls)
    try:
        with torch.device("meta"):
            return cls(hf_config)
    except Exception as exc:  # transformers' own __init__ on this config: its reason
        reason = " ".join(str(exc).split()) or "no message"
        reason = reason if len(reason) <= 240 else reason[:240] + "..."
        raise PlanError([error(
            "config.model_unbuildable", "",
            f"transformers cannot build {cls.__name__} from this config: "
            f"{type(exc).__name__}: {reason}",
            hint="the config is missing or contradicts a field the model's __init__ "
                 "reads; check it against the model's reference config")]) from None


def no_cache_kwargs(model: Any) -> dict[str, Any]:
    """``{"use_cache": False}`` when ``model``'s forward takes it, else ``{}``.

    Training steps, parity checks and dry runs call the model once per batch: a KV cache
    is never read back there, costs memory and time, and some families size it from
    fields their decoder does not follow (a cache for ``num_hidden_layers`` layers in
    front of a decoder with more), so every such call goes without it.
    """
    import inspect

    forward = getattr(model, "forward", None)
    try:
        params = inspect.signature(forward).parameters if forward is not None else {}
    except (TypeError, ValueError):
        return {}
    return {"use_cache": False} if "use_cache" in params else {}
