"""The model a rank runs: its class, its weights, and the synthetic batch it is fed.

The class comes from the artifact's generated modeling module (through the runtime's
loader), so the boundary forwards the runtime binds exist on it; unparallelized, that class
behaves exactly like transformers' own (its class defaults are no-ops), which is why the
parity reference is a deep copy of the same model taken before sharding. Weights come from
``*.safetensors`` files in the model directory when there are any, else from a seeded
random init: every rank builds the same full model.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hpcodegen.errors import PlanError, error
from hpcodegen.hf import load_transformers_config, read_hf_config
from hpcodegen.launch import env

BATCH_SIZE = 2
TOKENS_PER_RANK = 8


def resolve_model_dir(explicit: str | os.PathLike[str] | None, artifact: Path) -> Path:
    """``explicit``, else ``$HPCODEGEN_MODEL_DIR``, else the artifact directory."""
    return Path(explicit or env.get(env.MODEL_DIR) or artifact)


def model_class(artifact: Path, config: dict[str, Any]) -> type:
    """The generated module's model class (``meta.model_class``).

    The module is imported only after the artifact passed the runtime's own checks (output
    hashes included, architecture against ``config``), through the runtime's loader, so
    :func:`~hpcodegen.runtime.parallelize_from_generated` later finds the same module.
    """
    from hpcodegen.runtime.api import load_verified_meta
    from hpcodegen.runtime.loader import generated_model_class, import_verified_module

    trusted = env.allowed_targets()
    loaded = load_verified_meta(artifact, config, allowed_target_prefixes=trusted)
    return generated_model_class(loaded.data, import_verified_module(loaded, trusted))


def _check_shapes(model: Any, state: dict[str, Any], directory: Path) -> None:
    """Name the tensors whose shape is not the model's (torch lists them in a long text)."""
    own = model.state_dict()
    wrong = [f"{k}: file {tuple(v.shape)}, model {tuple(own[k].shape)}"
             for k, v in state.items() if k in own and tuple(v.shape) != tuple(own[k].shape)]
    if wrong:
        more = f" (+{len(wrong) - 3} more)" if len(wrong) > 3 else ""
        raise PlanError([error("launch.weights_shape", str(directory),
                               f"weights of another shape than the model: "
                               f"{'; '.join(wrong[:3])}{more}",
                               hint="--model-dir must hold the config the weights were saved "
                                    "with")])


def _load_weights(model: Any, directory: Path) -> int:
    """Load every ``*.safetensors`` in ``directory`` into ``model``; returns the file count."""
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        return 0
    from safetensors.torch import load_file

    state: dict[str, Any] = {}
    for file in files:
        try:
            state.update(load_file(str(file)))
        except Exception as exc:  # safetensors raises its own error types on a bad header
            raise PlanError([error("launch.weights_unreadable", "", "not a readable "
                                   f"safetensors file: {type(exc).__name__}: {exc}",
                                   file=str(file))]) from None
    _check_shapes(model, state, directory)
    result = model.load_state_dict(state, strict=False)
    tied = {k for k in result.missing_keys if k.endswith("lm_head.weight")}
    missing = [k for k in result.missing_keys if k not in tied]
    if missing or result.unexpected_keys:
        raise PlanError([error("launch.weights", str(directory),
                               f"weights do not match the model: missing {missing[:3]}, "
                               f"unexpected {list(result.unexpected_keys)[:3]}")])
    return len(files)


def build_model(directory: Path, artifact: Path, seed: int, device: Any) -> tuple[Any, Any, str]:
    """The full (unsharded) model in float32 on ``device``, its transformers config, and
    where its weights came from (``"N safetensors file(s)"`` or ``"seeded init (seed S)"``).

    Args:
        directory: holds ``config.json`` and optionally ``*.safetensors``.
        artifact: the artifact dir (the generated class comes from it).
        seed: torch seed for the random init (the same on every rank).
        device: the rank's ``torch.device``.
    """
    import torch

    config, _ = read_hf_config(directory)
    hf_config = load_transformers_config(config)
    cls = model_class(artifact, config)
    torch.manual_seed(seed)
    with torch.device("cpu"):
        model = cls(hf_config)
    files = _load_weights(model, directory)
    model = model.to(dtype=torch.float32, device=device)
    model.eval()  # no dropout: the sharded and the reference model must see the same math
    weights = f"{files} safetensors file(s)" if files else f"seeded init (seed {seed})"
    return model, hf_config, weights


def synthetic_batch(vocab_size: int, world_size: int, seed: int, device: Any) -> tuple[Any, Any]:
    """``(input_ids, labels)`` of shape ``(2, 8 * world)``, token ids < ``vocab_size``.

    The sequence length is a multiple of the world size, so sequence-parallel plans split it
    evenly; the same seed gives every rank the same batch.
    """
    import torch

    gen = torch.Generator().manual_seed(seed + 1)
    shape = (BATCH_SIZE, TOKENS_PER_RANK * world_size)
    ids = torch.randint(0, vocab_size, shape, generator=gen)
    labels = torch.randint(0, vocab_size, shape, generator=gen)
    return ids.to(device), labels.to(device)


def local_param_bytes(model: Any) -> int:
    """Bytes of the parameters this rank holds (local shards; tied weights counted once)."""
    total = 0
    for _, p in model.named_parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        total += local.numel() * local.element_size()
    return total
