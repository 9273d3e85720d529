"""``hpcodegen.launch.setup()``: the one call a user script needs under ``hpcodegen launch``.

Example (``train.py``, run with ``hpcodegen launch ARTIFACT --nproc 2 -- train.py``)::

    import hpcodegen.launch

    run = hpcodegen.launch.setup(dtype="bf16")
    model, mesh_context = run                      # unpacks like a pair
    optim = torch.optim.AdamW(model.parameters(), lr=1e-4)
    step = run.resume("ckpt/step100", optim) if resuming else 0
    ...
    loss.backward()
    run.clip_grad_norm_(1.0)                       # the unsharded model's global norm
    optim.step()
    ...
    run.save("ckpt/step200", optim, step=200)      # DCP; resumable at any tp and dp

With safetensors weights in the model directory each rank reads only its own shards
(the model is built on the meta device first); without, every rank builds the same seeded
model. The mesh is built from the artifact exactly as the launcher checked it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcodegen.launch import env
from hpcodegen.launch.rank.context import RankContext, init_rank
from hpcodegen.launch.rank.model import build_parallel_model, local_param_bytes, resolve_model_dir
from hpcodegen.launch.rank.reporter import current


@dataclass
class Setup:
    """What :func:`setup` returns: the model, its mesh, and what checkpoints need.

    Unpacks as ``model, mesh_context = setup()``.

    Attributes:
        model: parameters are local shards, boundaries installed.
        mesh_context: the :class:`hpcodegen.runtime.MeshContext` it was installed on.
        layout: global shape and plan placements of every parameter
            (:class:`hpcodegen.checkpoint.ShardLayout`).
        config: the HF config as a dict (recorded in checkpoints, written by export).
        rank: the rank's context (device, meta, mesh layout).
    """

    model: Any
    mesh_context: Any
    layout: Any
    config: dict[str, Any]
    rank: RankContext

    def __iter__(self) -> Iterator[Any]:
        return iter((self.model, self.mesh_context))

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> Any:
        """Clip gradients by the unsharded model's global norm; returns that norm."""
        from hpcodegen.checkpoint.clip import clip_grad_norm_

        return clip_grad_norm_(self.model, max_norm, norm_type)

    def save(self, directory: str | os.PathLike[str], optimizer: Any = None, *,
             step: int = 0) -> Path:
        """Write a DCP checkpoint (collective: every rank calls it)."""
        from hpcodegen.checkpoint.dcp_io import save

        meta = self.rank.meta.data
        layout = self.rank.layout
        record = {"config": self.config,
                  "mesh": dict(zip(layout.names, layout.sizes, strict=True)),
                  "artifact": {"name": Path(self.rank.meta.artifact_dir).name,
                               "signature": meta.get("signature"),
                               "parallel_dims": meta.get("parallel_dims")}}
        return save(directory, self.model, optimizer=optimizer, step=step, record=record)

    def resume(self, directory: str | os.PathLike[str], optimizer: Any = None) -> int:
        """Load a checkpoint saved at any tp and dp in place; returns its step."""
        from hpcodegen.checkpoint.dcp_io import resume
        from hpcodegen.checkpoint.record import check_same_model, read_record

        check_same_model(read_record(directory, checked=False), self.config, directory)
        return resume(directory, self.model, optimizer=optimizer)


def setup(*, artifact: str | os.PathLike[str] | None = None,
          model_dir: str | os.PathLike[str] | None = None,
          seed: int | None = None, device: str | None = None,
          dtype: str | None = None, empty: bool = False) -> Setup:
    """Init this rank and return the model parallelized from the artifact (a :class:`Setup`).

    Keyword Args:
        artifact: the artifact dir; default ``$HPCODEGEN_ARTIFACT`` (set by the launcher).
        model_dir: ``config.json`` (+ safetensors) dir; default ``$HPCODEGEN_MODEL_DIR``,
            else the artifact dir.
        seed: init seed (default ``$HPCODEGEN_SEED``, else 0); the same on every rank.
        device: ``cuda``/``npu``/``cpu``/``auto``; default ``$HPCODEGEN_DEVICE``.
        dtype: ``fp32``/``bf16``/``fp16``; default ``$HPCODEGEN_DTYPE``, else fp32.
        empty: allocate the shards without reading weights (you will ``resume``).

    Returns:
        A :class:`Setup`; ``model, mesh_context = setup()`` still works.
    """
    from hpcodegen.runtime import MeshContext

    reporter = current()
    reporter.update(phase="init")
    ctx = init_rank(artifact, device)
    reporter.update(phase="build", device=str(ctx.device), world_size=ctx.world_size)
    seed = env.get_int(env.SEED, 0) if seed is None else seed
    dtype = dtype or env.get(env.DTYPE, "fp32")
    directory = resolve_model_dir(model_dir, ctx.meta.artifact_dir)
    built = build_parallel_model(directory, ctx, seed, dtype, empty=empty)
    scope = env.get(env.COMPILE)
    if scope:  # launch --compile: the script gets the model compiled, as the smoke job does
        from hpcodegen.runtime.compile import compile_parallelized

        compile_parallelized(built.model, scope, **env.compile_options())
    reporter.update(phase="running", weights=built.weights,
                    local_param_bytes=local_param_bytes(built.model))
    return Setup(built.model, MeshContext(device_mesh=ctx.mesh), built.layout, built.config,
                 ctx)
