"""``hpcodegen.launch.setup()``: the one call a user script needs under ``hpcodegen launch``.

Example (``train.py``, run with ``hpcodegen launch ARTIFACT --nproc 2 -- train.py``)::

    import hpcodegen.launch

    model, mesh_context = hpcodegen.launch.setup()
    optim = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ...

.. note:: Every rank builds the *full* model before sharding it (seeded random init, or
   the safetensors weights of ``--model-dir``), so host memory must hold one full copy per
   rank. The mesh is built from the artifact exactly as the launcher checked it.
"""

from __future__ import annotations

import os
from typing import Any

from hpcodegen.launch import env
from hpcodegen.launch.model import build_model, local_param_bytes, resolve_model_dir
from hpcodegen.launch.rank import init_rank
from hpcodegen.launch.reporter import current


def setup(*, artifact: str | os.PathLike[str] | None = None,
          model_dir: str | os.PathLike[str] | None = None,
          seed: int | None = None, device: str | None = None) -> tuple[Any, Any]:
    """Init this rank and return ``(model, mesh_context)`` parallelized from the artifact.

    Keyword Args:
        artifact: the artifact dir; default ``$HPCODEGEN_ARTIFACT`` (set by the launcher).
        model_dir: ``config.json`` (+ safetensors) dir; default ``$HPCODEGEN_MODEL_DIR``,
            else the artifact dir.
        seed: init seed (default ``$HPCODEGEN_SEED``, else 0); the same on every rank.
        device: ``cuda``/``npu``/``cpu``/``auto``; default ``$HPCODEGEN_DEVICE``.

    Returns:
        The model (parameters are local shards, boundaries installed) and the
        :class:`hpcodegen.runtime.MeshContext` it was installed on.
    """
    from hpcodegen.runtime import MeshContext, parallelize_from_generated

    reporter = current()
    reporter.update(phase="init")
    ctx = init_rank(artifact, device)
    reporter.update(phase="build", device=str(ctx.device), world_size=ctx.world_size)
    seed = env.get_int(env.SEED, 0) if seed is None else seed
    directory = resolve_model_dir(model_dir, ctx.meta.artifact_dir)
    model, hf_config, weights = build_model(directory, ctx.meta.artifact_dir, seed,
                                            ctx.device)
    reporter.update(phase="parallelize", weights=weights)
    context = MeshContext(device_mesh=ctx.mesh)
    parallelize_from_generated(model, context, ctx.meta.artifact_dir, hf_config=hf_config,
                               allowed_target_prefixes=env.allowed_targets())
    reporter.update(phase="running", local_param_bytes=local_param_bytes(model))
    return model, context
