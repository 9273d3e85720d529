"""The model a rank runs: its class, its weights, and the synthetic batch it is fed.

The class comes from the artifact's generated modeling module (through the runtime's
loader), so the boundary forwards the runtime binds exist on it; unparallelized, that class
behaves exactly like transformers' own (its class defaults are no-ops), which is why the
parity reference is the same class built unsharded. With ``*.safetensors`` weights in the
model directory the model is built with its parameters on the meta device and each rank
reads only its own shards after the plan is installed (:mod:`hpcodegen.checkpoint`);
without weights every rank builds the same seeded model and shards it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcodegen.hf import load_transformers_config, read_hf_config
from hpcodegen.launch import env
from hpcodegen.launch.rank.artifact import checked_artifact
from hpcodegen.parity.lengths import SmokeLength, bounded_length, smoke_length_for

BATCH_SIZE = 2
TOKENS_PER_RANK = 8
SEQ_LEN = 32


def resolve_model_dir(explicit: str | os.PathLike[str] | None, artifact: Path) -> Path:
    """``explicit``, else ``$HPCODEGEN_MODEL_DIR``, else the artifact directory."""
    return Path(explicit or env.get(env.MODEL_DIR) or artifact)


def model_class(artifact: Path, config: dict[str, Any]) -> type:
    """The generated module's model class (``meta.model_class``), imported from the checked
    bytes (:func:`checked_artifact`)."""
    return checked_artifact(artifact, config).model_class()


#: ``--dtype`` names -> torch dtype attribute names.
DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def torch_dtype(name: str) -> Any:
    """``fp32``/``bf16``/``fp16`` (or a torch dtype name) -> the torch dtype."""
    import torch

    return getattr(torch, DTYPES.get(name, name))


def model_dtype_bytes(name: str) -> int:
    """Bytes per element of ``--dtype`` (4 for fp32, 2 for bf16 and fp16)."""
    return int(torch_dtype(name).itemsize)


@dataclass
class BuiltModel:
    """A rank's model and what was learned building it.

    Attributes:
        model: the model (parallelized by :func:`build_parallel_model`).
        hf_config: its transformers config; ``config`` the same as a JSON dict.
        weights: where the weights came from, for the report.
        layout: global shapes and plan placements per parameter (checkpoints, clipping).
        active: the runtime's active mesh (None for the unsharded reference).
    """

    model: Any
    hf_config: Any
    config: dict[str, Any]
    weights: str
    layout: Any
    active: Any = None
    #: the runtime's expert mesh (``runtime.experts.ExpertMesh``; None without ep)
    expert: Any = None


def _cast_parameters(model: Any, dtype: Any) -> None:
    """Floating-point parameters to ``dtype``; buffers (rotary frequencies) keep theirs."""
    for param in model.parameters():
        if param.is_floating_point() and param.dtype != dtype:
            param.data = param.data.to(dtype)


def _construct(directory: Path, artifact: Path, *, on_meta: bool,
               seed: int) -> tuple[Any, Any, dict[str, Any]]:
    """The generated class built from ``directory``'s config: parameters on meta, or a
    seeded float32 init on the CPU (identical on every rank)."""
    import torch

    from hpcodegen.checkpoint.shard_load import parameters_on_meta

    config, _ = read_hf_config(directory)
    hf_config = load_transformers_config(config)
    cls = model_class(artifact, config)
    if on_meta:
        with parameters_on_meta():
            return cls(hf_config), hf_config, config
    torch.manual_seed(seed)
    with torch.device("cpu"):
        return cls(hf_config), hf_config, config


def build_on_meta(directory: Path, artifact: Path) -> tuple[Any, Any, dict[str, Any]]:
    """The generated class built from ``directory``'s config, every parameter on the
    meta device: ``(model, transformers config, config dict)``."""
    return _construct(directory, artifact, on_meta=True, seed=0)


def _weights_text(checkpoint: Any, seed: int) -> str:
    return (f"{len(checkpoint.files)} safetensors file(s)" if checkpoint
            else f"seeded init (seed {seed})")


def build_model(directory: Path, artifact: Path, seed: int, device: Any,
                dtype: str = "fp32") -> BuiltModel:
    """The full (unsharded) model: the parity reference, or a one-rank run.

    Weights come from ``*.safetensors`` in ``directory`` (single file or sharded with an
    index) when there are any, else from a seeded init. ``dtype`` is ``fp32``, ``bf16`` or
    ``fp16`` (parameters only).
    """
    from hpcodegen.checkpoint.layout import ShardLayout, global_shapes
    from hpcodegen.checkpoint.safetensors_io import SafetensorsCheckpoint
    from hpcodegen.checkpoint.shard_load import materialize

    checkpoint = SafetensorsCheckpoint(directory)
    model, hf_config, config = _construct(directory, artifact, on_meta=bool(checkpoint),
                                          seed=seed)
    layout = ShardLayout.from_model(model, global_shapes(model), None)
    if checkpoint:
        materialize(model, layout, dtype=torch_dtype(dtype), device=device,
                    checkpoint=checkpoint)
    _cast_parameters(model, torch_dtype(dtype))
    model = model.to(device=device)
    model.eval()  # no dropout: the sharded and the reference model must see the same math
    return BuiltModel(model, hf_config, config, _weights_text(checkpoint, seed), layout)


def build_parallel_model(directory: Path, ctx: Any, seed: int, dtype: str = "fp32", *,
                         empty: bool = False,
                         owns: Callable[[str], bool] | None = None) -> BuiltModel:
    """The model parallelized from the artifact, each rank holding only its shards.

    With safetensors weights (or ``empty``, for a checkpoint resume) the model is built
    with its parameters on the meta device, the plan is installed, and only then is each
    local shard allocated and read from the files: a rank never holds the full model.
    Without weights every rank builds the same seeded model and shards it.

    ``owns`` (a predicate on parameter FQNs: a pipeline rank's stages') builds only those
    parameters: the model is always built on the meta device, and only the parameters
    ``owns`` accepts get their local shards, from the weights, or, without any, from the
    seeded init the unsharded reference builds (made whole on the host, sliced, dropped);
    the others stay on meta (no stage of this rank runs them).
    """
    from hpcodegen.checkpoint.layout import ShardLayout, global_shapes
    from hpcodegen.checkpoint.safetensors_io import SafetensorsCheckpoint
    from hpcodegen.checkpoint.shard_load import materialize

    artifact = ctx.meta.artifact_dir
    checkpoint = None if empty else SafetensorsCheckpoint(directory)
    on_meta = empty or bool(checkpoint) or owns is not None
    model, hf_config, config = _construct(directory, artifact, on_meta=on_meta, seed=seed)
    _cast_parameters(model, torch_dtype(dtype))  # on meta too: another stage's keep the dtype
    if not on_meta:
        model = model.to(device=ctx.device)
    shapes = global_shapes(model)
    params = None if owns is None else [f for f in shapes if owns(f)]
    # the config as written: the artifact's signature hashes its fields, not the defaults
    # and attribute aliases ``PretrainedConfig.to_dict`` adds
    art = checked_artifact(artifact, config)
    info, active = parallelize(model, ctx, art)
    layout = ShardLayout.from_model(model, shapes, info)
    if on_meta:
        seeded = owns is not None and not empty and not checkpoint
        source = _construct(directory, artifact, on_meta=False, seed=seed)[0] \
            if seeded else None
        materialize(model, layout, dtype=torch_dtype(dtype), device=ctx.device,
                    checkpoint=checkpoint or None, params=params, source=source)
        del source
        _buffers_to(model, ctx.device)
    model.eval()
    weights = "empty (resumed)" if empty else _weights_text(checkpoint, seed)
    from hpcodegen.runtime.experts import resolve_expert_mesh

    return BuiltModel(model, hf_config, config, weights, layout, active,
                      resolve_expert_mesh(art.plan, ctx.mesh))


def _buffers_to(model: Any, device: Any) -> None:
    """The buffers (rotary frequencies...) to ``device``; parameters left as they are (a
    pipeline rank's other stages' stay on meta: ``Module.to`` would refuse them)."""
    for module in model.modules():
        for name, buf in module._buffers.items():
            if buf is not None:
                module._buffers[name] = buf.to(device)


def parallelize(model: Any, ctx: Any, art: Any) -> tuple[dict[str, Any], Any]:
    """Install the checked artifact's plan on ``model``; returns the source info and the
    active mesh."""
    from hpcodegen.runtime import MeshContext
    from hpcodegen.runtime.mesh import resolve_active_mesh

    context = MeshContext(device_mesh=ctx.mesh)
    info = art.install(model, context)
    return info, resolve_active_mesh(art.plan, context)


def _base_length(world_size: int) -> int:
    return SEQ_LEN if SEQ_LEN % world_size == 0 else TOKENS_PER_RANK * world_size


def smoke_length(world_size: int, hf_config: Any = None) -> SmokeLength:
    """The smoke batch's bounded length for ``hf_config`` (:mod:`hpcodegen.parity.lengths`):
    ``SEQ_LEN`` whenever the world size divides it (1, 2, 4, 8...), so a run resumed on
    another mesh trains on the same batch, else ``8 * world``; lengthened (up to 8 windows,
    never past ``MAX_SMOKE_TOKENS`` or the config's max positions) where the config's
    sliding window is short enough to be exercised cheaply."""
    if hf_config is None:
        return bounded_length(_base_length(world_size), multiple=world_size)
    return smoke_length_for(hf_config, _base_length(world_size), world_size)


def synthetic_length(world_size: int, window: int | None = None,
                     max_positions: int | None = None) -> int:
    """The smoke batch's sequence length for a window and max positions given directly
    (:func:`smoke_length` reads them from a config)."""
    return bounded_length(_base_length(world_size), multiple=world_size, window=window,
                          max_positions=max_positions).length


def synthetic_batch(vocab_size: int, world_size: int, seed: int, device: Any,
                    window: int | None = None, max_positions: int | None = None,
                    length: int | None = None) -> tuple[Any, Any]:
    """``(input_ids, labels)`` of shape ``(2, length)``, ids < ``vocab_size``; the length
    :func:`synthetic_length` when not given.

    Sequence-parallel plans split it evenly; the same seed gives every rank the same batch
    (a context-parallel rank keeps its positions of it, :mod:`hpcodegen.runtime.cp.batch`).
    The labels are per position (already shifted).
    """
    import torch

    gen = torch.Generator().manual_seed(seed + 1)
    if length is None:
        length = synthetic_length(world_size, window, max_positions)
    shape = (BATCH_SIZE, length)
    ids = torch.randint(0, vocab_size, shape, generator=gen)
    labels = torch.randint(0, vocab_size, shape, generator=gen)
    return ids.to(device), labels.to(device)


def local_param_bytes(model: Any) -> int:
    """Bytes of the parameters this rank holds (local shards; tied weights counted once;
    a pipeline rank's other stages' parameters, left on the meta device, are not held)."""
    total = 0
    for _, p in model.named_parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        if local.device.type != "meta":
            total += local.numel() * local.element_size()
    return total
