"""The smoke job's memory check, on every rank, before any weight is allocated.

Each rank builds the model on the meta device, installs the artifact's plan on it with the
runtime (so the count of what it will hold is the runtime's own, expert parallelism
included), estimates its peak (:mod:`hpcodegen.launch.memory`) and compares it with its
node's host memory and its own device's free memory. The ranks then agree (one all-reduce)
so that all of them stop when any cannot fit: the job is refused as a whole, nothing is
built, and the launcher reports it as a usage error (exit 2) with the figures. Each node
checks its own memory, which a launcher on one node could not see.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcodegen.launch import memory
from hpcodegen.launch.model import (
    BATCH_SIZE,
    SEQ_LEN,
    TOKENS_PER_RANK,
    build_on_meta,
    checked_artifact,
    model_dtype_bytes,
    parallelize,
)


@dataclass(frozen=True)
class Verdict:
    """This rank's refusal (None: it fits) and the first rank of the job that refused
    (None: none did)."""

    refusal: str | None
    first_refused: int | None


def _counts(directory: Path, ctx: Any) -> tuple[int, int, int]:
    """``(whole model's parameters, this rank's after the plan, vocabulary)``, from the
    model built and installed on the meta device."""
    model, _, config = build_on_meta(directory, ctx.meta.artifact_dir)
    full = sum(p.numel() for p in model.parameters())
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    vocab = int(head.weight.shape[0]) if getattr(head, "weight", None) is not None \
        else int(config.get("vocab_size") or 0)
    parallelize(model, ctx, checked_artifact(ctx.meta.artifact_dir, config))
    local = sum(p.numel() for p in model.parameters())
    return full, local, vocab


def job_shape(directory: Path, ctx: Any, *, dtype: str, parity: bool, steps: int,
              seeded: bool) -> memory.JobShape:
    """The smoke job's :class:`~hpcodegen.launch.memory.JobShape` on this rank."""
    full, local, vocab = _counts(directory, ctx)
    length = SEQ_LEN if SEQ_LEN % ctx.world_size == 0 else TOKENS_PER_RANK * ctx.world_size
    return memory.JobShape(full_numel=full, local_numel=local,
                           dtype_bytes=model_dtype_bytes(dtype), seeded=seeded,
                           parity=parity, steps=steps, logits_numel=BATCH_SIZE * length * vocab,
                           accelerator=ctx.device.type != "cpu")


def agree(ctx: Any, refused: bool) -> int | None:
    """The lowest rank that refused, across the whole job (None: none did)."""
    import torch
    import torch.distributed as dist

    flag = torch.tensor([ctx.rank if refused else ctx.world_size], device=ctx.device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    first = int(flag.item())
    return None if first >= ctx.world_size else first


def check_memory(directory: Path, ctx: Any, *, dtype: str, parity: bool, steps: int,
                 seeded: bool) -> Verdict:
    """Estimate, compare with this node's and this device's memory, agree with the others."""
    need = memory.estimate(job_shape(directory, ctx, dtype=dtype, parity=parity, steps=steps,
                                     seeded=seeded))
    ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    refusal = memory.check(need, ranks_here, memory.host_free(), memory.device_free(ctx.device))
    return Verdict(refusal, agree(ctx, refusal is not None))
