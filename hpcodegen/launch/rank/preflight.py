"""The smoke job's memory check, on every rank, before any weight is allocated.

Each rank builds the model on the meta device, installs the artifact's plan on it with the
runtime (so the count of what it will hold is the runtime's own, expert parallelism
included), estimates its peak (:mod:`hpcodegen.launch.rank.memory`) and compares it with its
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

from hpcodegen.hf import config_int
from hpcodegen.launch.rank import memory
from hpcodegen.launch.rank.model import (
    BATCH_SIZE,
    build_on_meta,
    checked_artifact,
    model_dtype_bytes,
    parallelize,
    smoke_length,
)


@dataclass(frozen=True)
class Verdict:
    """This rank's refusal (None: it fits) and the first rank of the job that refused
    (None: none did)."""

    refusal: str | None
    first_refused: int | None


@dataclass(frozen=True)
class _Counts:
    full: int
    local: int
    vocab: int
    hf_config: Any
    dims: tuple[int, int, int, int]  # hidden, intermediate, heads, layers


def _dims(model: Any, hf_config: Any) -> tuple[int, int, int, int]:
    """``(hidden, intermediate, heads, layers)`` of the model built on the meta device:
    the hidden width is its input embedding's; the layers, MLP width and heads the config's
    (when it names no layer count, the model's longest ``ModuleList``; 4x hidden and no
    heads when it names none)."""
    from torch import nn

    try:  # some models raise NotImplementedError here
        emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    except (NotImplementedError, AttributeError):
        emb = None
    weight = getattr(emb, "weight", None)
    hidden = int(weight.shape[-1]) if weight is not None and weight.dim() == 2 else (
        config_int(hf_config, "hidden_size", "n_embd", "d_model") or 0)
    layers = config_int(hf_config, "num_hidden_layers", "n_layer", "num_layers", "n_layers") \
        or max((len(m) for m in model.modules() if isinstance(m, nn.ModuleList)), default=1)
    inter = config_int(hf_config, "intermediate_size", "ffn_dim", "n_inner") or 4 * hidden
    heads = config_int(hf_config, "num_attention_heads", "n_head", "n_heads") or 0
    return hidden, inter, heads, layers


def _counts(directory: Path, ctx: Any) -> _Counts:
    """The whole model's parameters, this rank's after the plan, the vocabulary and the
    activation sizes, from the model built and installed on the meta device."""
    model, hf_config, config = build_on_meta(directory, ctx.meta.artifact_dir)
    full = sum(p.numel() for p in model.parameters())
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    vocab = int(head.weight.shape[0]) if getattr(head, "weight", None) is not None \
        else int(config.get("vocab_size") or 0)
    dims = _dims(model, hf_config)
    parallelize(model, ctx, checked_artifact(ctx.meta.artifact_dir, config))
    local = sum(p.numel() for p in model.parameters())
    return _Counts(full, local, vocab, hf_config, dims)


def job_shape(directory: Path, ctx: Any, *, dtype: str, parity: bool, steps: int,
              seeded: bool) -> memory.JobShape:
    """The smoke job's :class:`~hpcodegen.launch.rank.memory.JobShape` on this rank: the
    batch is the one the job will feed (:func:`~hpcodegen.launch.rank.model.smoke_length`)."""
    counts = _counts(directory, ctx)
    length = smoke_length(ctx.world_size, counts.hf_config).length
    hidden, inter, heads, layers = counts.dims
    width = model_dtype_bytes(dtype)
    act = memory.activation_bytes(
        memory.ActivationShape(BATCH_SIZE, length, hidden, inter, heads, layers), width,
        backward=parity or bool(steps))
    tp = int(ctx.meta.plan.dims.sizes.get("tp") or 1)
    return memory.JobShape(full_numel=counts.full, local_numel=counts.local,
                           dtype_bytes=width, seeded=seeded, parity=parity, steps=steps,
                           logits_numel=BATCH_SIZE * length * counts.vocab,
                           accelerator=ctx.device.type != "cpu", activations=act, tp=tp)


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
    return _verdict(memory.estimate(job_shape(directory, ctx, dtype=dtype, parity=parity,
                                              steps=steps, seeded=seeded)), ctx)


def _verdict(need: memory.MemoryNeed, ctx: Any) -> Verdict:
    ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    refusal = memory.check(need, ranks_here, memory.host_free(), memory.device_free(ctx.device))
    return Verdict(refusal, agree(ctx, refusal is not None))


def _local_numel(param: Any) -> int:
    return param.to_local().numel() if hasattr(param, "to_local") else param.numel()


def pipeline_shape(directory: Path, ctx: Any, *, dtype: str, parity: bool, steps: int,
                   seeded: bool, dp: int = 1) -> memory.PipelineShape:
    """This pp rank's :class:`~hpcodegen.launch.rank.memory.PipelineShape`, from the model
    built and installed on the meta device: what it holds after tp, what its stages own
    (:func:`~hpcodegen.runtime.pipeline_stage.owned_parameters`), and its stages'
    activations in flight under the frozen schedule
    (:func:`~hpcodegen.inspect.pipeline.activations_in_flight`) for one microbatch of the
    batch the pipeline job feeds (``n_microbatches`` rows per dp rank, each microbatch a
    stage's layers' share of :func:`~hpcodegen.launch.rank.memory.activation_bytes`)."""
    from hpcodegen.inspect.pipeline import activations_in_flight
    from hpcodegen.runtime.pipeline_stage import owned_parameters

    pipe = ctx.meta.plan.pipeline
    model, hf_config, config = build_on_meta(directory, ctx.meta.artifact_dir)
    full = sum(p.numel() for p in model.parameters())
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    vocab = int(head.weight.shape[0]) if getattr(head, "weight", None) is not None \
        else int(config.get("vocab_size") or 0)
    hidden, inter, heads, layers = _dims(model, hf_config)
    parallelize(model, ctx, checked_artifact(ctx.meta.artifact_dir, config))
    pp_rank = ctx.mesh.get_local_rank("pp")
    owned = sum(_local_numel(p) for p in
                {id(p): p for p in owned_parameters(model, pipe, pp_rank).values()}.values())
    held = owned  # a pp rank builds only its stages' parameters
    length = smoke_length(ctx.world_size, hf_config).length
    width = model_dtype_bytes(dtype)
    tp = int(ctx.meta.plan.dims.sizes.get("tp") or 1)
    mb_rows, backward = 1, parity or bool(steps)
    per_mb = {}
    for stage in pipe.stages:
        n = sum(1 for fqn in stage.modules if fqn.rpartition(".")[2].isdigit())
        act = memory.activation_bytes(memory.ActivationShape(
            mb_rows, length, hidden, inter, heads, n), width) if n and backward else 0
        per_mb[stage.index] = -(-act // tp)
    in_flight = activations_in_flight(pipe, per_mb)
    mine = pipe.ranks_stages(pp_rank)
    rows = pipe.n_microbatches * dp
    last = pipe.n_stages - 1 in mine
    reference = memory.activation_bytes(memory.ActivationShape(
        rows, length, hidden, inter, heads, layers), width) if parity else 0
    job = memory.JobShape(full_numel=full, local_numel=held, dtype_bytes=width, seeded=seeded,
                          parity=parity, steps=steps,
                          logits_numel=pipe.n_microbatches * length * vocab if last else 0,
                          accelerator=ctx.device.type != "cpu", activations=reference, tp=tp)
    return memory.PipelineShape(job=job, owned_numel=owned,
                                in_flight_bytes=sum(in_flight[i] or 0 for i in mine))


def check_pipeline_memory(directory: Path, ctx: Any, *, dtype: str, parity: bool, steps: int,
                          seeded: bool, dp: int = 1) -> Verdict:
    """:func:`check_memory` for a pipelined rank (:func:`pipeline_shape`)."""
    return _verdict(memory.estimate_pipeline(pipeline_shape(
        directory, ctx, dtype=dtype, parity=parity, steps=steps, seeded=seeded, dp=dp)), ctx)
