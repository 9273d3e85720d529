"""Bring one rank up: device, process group, artifact meta and device mesh.

Shared by the smoke job and :func:`hpcodegen.launch.setup`, so a user script gets exactly
the mesh the launcher checked (same ``resolve_mesh_layout``) on the device the launcher
resolved.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcodegen.artifact.load import LoadedMeta
from hpcodegen.launch import env
from hpcodegen.launch.rank.artifact import rank_artifact
from hpcodegen.launch.rank.device import BACKENDS, bind_device, resolve_device
from hpcodegen.launch.rank.mesh import MeshLayout, build_device_mesh, resolve_mesh_layout


@dataclass(frozen=True)
class RankContext:
    """What a rank knows after start-up.

    Attributes:
        rank / local_rank / world_size: torchrun's numbering.
        device: this rank's ``torch.device``.
        meta: the artifact's loaded meta, with its typed ``plan``, as
            :func:`~hpcodegen.launch.rank.artifact.rank_artifact` checked it (the mesh is
            laid out from that checked plan).
        layout: the mesh layout (names and sizes).
        mesh: the live ``DeviceMesh``.
    """

    rank: int
    local_rank: int
    world_size: int
    device: Any
    meta: LoadedMeta
    layout: MeshLayout
    mesh: Any


def artifact_dir(explicit: str | os.PathLike[str] | None = None) -> Path:
    """``explicit``, else ``$HPCODEGEN_ARTIFACT``; a clear error when neither is set."""
    value = explicit or env.get(env.ARTIFACT)
    if not value:
        raise RuntimeError(f"no artifact: pass one or set {env.ARTIFACT} "
                           "(hpcodegen launch ARTIFACT sets it)")
    return Path(value)


def init_rank(artifact: str | os.PathLike[str] | None = None,
              device: str | None = None) -> RankContext:
    """Bind the device, init the process group (if not yet), build the mesh.

    Args:
        artifact: the artifact directory (default ``$HPCODEGEN_ARTIFACT``).
        device: ``cuda``/``npu``/``cpu``/``auto`` (default ``$HPCODEGEN_DEVICE``, else auto).
    """
    import torch.distributed as dist

    kind = resolve_device(device or env.get(env.DEVICE, "auto")).kind
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    dev = bind_device(kind, local_rank)
    if not dist.is_initialized():
        kwargs = {} if kind == "cpu" else {"device_id": dev}
        dist.init_process_group(backend=BACKENDS[kind], **kwargs)
    meta = rank_artifact(artifact_dir(artifact)).loaded
    layout = resolve_mesh_layout(meta.plan, dist.get_world_size())
    mesh = build_device_mesh(layout, dev.type)
    return RankContext(dist.get_rank(), local_rank, dist.get_world_size(), dev, meta,
                       layout, mesh)
