"""The built-in rank job: parallelize from the artifact, forward, parity, training steps.

Steps, in order (each is a ``phase`` the launcher shows):

1. ``init``: device, process group, mesh (:func:`~hpcodegen.launch.rank.context.init_rank`).
2. ``memory check``: the model built and installed on the meta device, each rank's peak
   estimated and compared with its node's and device's free memory; if any rank cannot
   fit, every rank stops here, status ``refused`` (:mod:`hpcodegen.launch.rank.preflight`).
3. ``build``: the model, parallelized, each rank reading only its shards of the
   safetensors weights (or a seeded init, or empty shards for ``--resume``); with parity,
   the unsharded reference is built from the same weights. With ``--compile``,
   :func:`hpcodegen.runtime.compile.compile_parallelized` after the install.
4. ``resume``: with ``--resume DIR``, model, optimizer and step from the DCP checkpoint
   (saved at any tp and dp); the reference loads it too.
5. ``forward``: one timed forward of the synthetic batch.
6. ``parity``: logits and every parameter's gradient against the reference.
7. ``step k/K``: AdamW steps (``--max-grad-norm``: clipped by the global norm); with parity
   the reference steps identically (clipped by torch) and losses and norms are compared.
8. ``save``: with ``--save DIR``, a DCP checkpoint of model, optimizer and step.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from hpcodegen.hf import no_cache_kwargs
from hpcodegen.launch import env
from hpcodegen.launch.rank.context import RankContext, init_rank
from hpcodegen.launch.rank.model import (
    BATCH_SIZE,
    BuiltModel,
    build_model,
    build_parallel_model,
    local_param_bytes,
    resolve_model_dir,
    smoke_length,
    synthetic_batch,
)
from hpcodegen.launch.rank.reporter import RankReporter
from hpcodegen.parity.gather import max_param_diff, output_module_fqn
from hpcodegen.parity.harness import Installed, compare
from hpcodegen.parity.step import forward_loss, model_inputs, sync_gradients

LEARNING_RATE = 1e-3


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "npu":
        torch.npu.synchronize(device)  # type: ignore[attr-defined]


def head_vocab(built: BuiltModel) -> int | None:
    """The full output width of the model's head: its weight's global rows (the layout's
    pre-install shape), which is what the vocab-sharded logits are slices of; it can differ
    from ``config.vocab_size`` (a head sized from its embedding). Else the config's."""
    fqn = output_module_fqn(built.model)
    weight = f"{fqn}.weight" if fqn else ""
    layout = built.layout
    spec = layout.params.get(layout.aliases.get(weight, weight)) if layout is not None else None
    if spec is not None and spec.global_shape:
        return int(spec.global_shape[0])
    return vocab_size_of(built.hf_config)


def vocab_size_of(hf_config: Any) -> int | None:
    """The vocabulary the token ids index: the config's own, else its text part's (Fuyu's
    composite config keeps it in ``text_config`` only)."""
    vocab = getattr(hf_config, "vocab_size", None)
    if vocab is None and hasattr(hf_config, "get_text_config"):
        vocab = getattr(hf_config.get_text_config(), "vocab_size", None)
    return vocab


def _timed_forward(model: Any, ids: Any, device: Any, active: Any, *, compiled: bool = False,
                   warm: bool = True) -> float:
    """Milliseconds of one sharded forward of the smoke batch.

    Eager: one no-grad forward. Compiled (``--compile``): a no-grad forward would compile an
    inference graph the job never runs again (seconds of CPU per rank) and time that
    compile, so the forward runs in the job's own grad mode, reusing the graph its training
    forward compiled; ``warm=False`` (nothing ran that graph yet) runs it once untimed first.
    """
    import torch

    kwargs, _ = model_inputs(model, _inputs(model, ids), active)
    with torch.set_grad_enabled(compiled):
        if compiled and not warm:
            model(**kwargs)
        _sync(device)
        start = time.perf_counter()
        model(**kwargs)
        _sync(device)
    return (time.perf_counter() - start) * 1000.0


def _inputs(model: Any, ids: Any) -> dict[str, Any]:
    """The synthetic batch as the model's keyword arguments (no KV cache)."""
    return {"input_ids": ids, **no_cache_kwargs(model)}


def _parity(model: Any, ref: Any, batch: tuple[Any, Any], ctx: RankContext,
            active: Any, expert: Any = None, vocab: int | None = None) -> dict[str, Any]:
    """One forward/backward on both models: the parity harness's
    :func:`~hpcodegen.parity.harness.compare` (under cp each rank's share, the gradients
    summed over cp, the logits put back in order)."""
    ids, labels = batch
    r = compare(model, ref, ctx.meta.plan, Installed({}, active, expert), _inputs(model, ids),
                labels, vocab, zero_grad=True)
    return {"logits_max_diff": r.logits, "grad_max_diff": r.grad, "worst_grad": r.worst,
            "mismatched_params": r.odd, "loss": r.loss, "ref_loss": r.ref_loss}


def _optimizer(model: Any) -> Any:
    """AdamW; with fp16 parameters its ``eps`` is 1e-4, as 1e-8 is 0 in fp16 (and a
    gradient's square underflows to 0 there, so the update would be 0/0)."""
    import torch

    fp16 = any(p.dtype == torch.float16 for p in model.parameters())
    return torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, eps=1e-4 if fp16 else 1e-8)


def _clip(built: BuiltModel, max_norm: float | None) -> float | None:
    """Clip by the global norm (the sharded model) or torch's own (the reference)."""
    if max_norm is None:
        return None
    import torch

    from hpcodegen.checkpoint.clip import clip_grad_norm_

    if built.active is None:
        return float(torch.nn.utils.clip_grad_norm_(built.model.parameters(), max_norm))
    return float(clip_grad_norm_(built.model, max_norm))


def _train(runs: list[tuple[BuiltModel, Any]], batch: tuple[Any, Any], steps: int,
           first: int, ctx: RankContext, max_norm: float | None,
           reporter: RankReporter) -> list[list[float | None]]:
    """``steps`` AdamW steps of every ``(model, optimizer)`` on the synthetic batch.

    Returns the gradient norms per model per step (None without clipping).
    """
    norms: list[list[float | None]] = [[] for _ in runs]
    for k in range(1, steps + 1):
        losses = []
        for i, (built, opt) in enumerate(runs):
            opt.zero_grad(set_to_none=True)
            ids, labels = batch
            fwd = forward_loss(built.model, _inputs(built.model, ids), labels, ctx.meta.plan,
                               built.active, head_vocab(built))
            fwd.loss.backward()
            sync_gradients(built.model, built.active)
            norms[i].append(_clip(built, max_norm))
            opt.step()
            losses.append(float(fwd.value))
        reporter.record.losses.append(losses[0])
        if len(runs) > 1:
            reporter.record.ref_losses.append(losses[1])
        reporter.update(phase=f"step {first + k}/{first + steps}")
    return norms


def _failure(parity: dict[str, Any], tol: float) -> str | None:
    """The parity check's verdict: None when every compared quantity is within ``tol``
    (a NaN anywhere fails)."""
    if parity.get("mismatched_params"):
        return f"parameters differ in shape or presence: {parity['mismatched_params'][:3]}"
    for key in ("logits_max_diff", "grad_max_diff", "loss_max_diff", "grad_norm_max_diff"):
        value = parity.get(key)
        if value is not None and not value <= tol:
            where = f" at {parity['worst_grad']}" if key == "grad_max_diff" else ""
            return f"parity {key.replace('_', ' ')} {value:.3e}{where} > tolerance {tol:g}"
    return None


def _nan_max(values: list[float]) -> float:
    """``max`` that returns NaN when any value is NaN or infinite (plain ``max`` skips NaN)."""
    return math.nan if any(not math.isfinite(v) for v in values) else max(values, default=0.0)


def _checkpoint_record(ctx: RankContext, built: BuiltModel) -> dict[str, Any]:
    meta = ctx.meta.data
    return {"config": built.config,
            "mesh": dict(zip(ctx.layout.names, ctx.layout.sizes, strict=True)),
            "artifact": {"name": Path(ctx.meta.artifact_dir).name,
                         "signature": meta.get("signature"),
                         "parallel_dims": meta.get("parallel_dims")}}


def _resume(directory: str, runs: list[tuple[BuiltModel, Any]], reporter: RankReporter) -> int:
    from hpcodegen.checkpoint.dcp_io import resume

    reporter.update(phase="resume")
    steps = {resume(directory, built.model, optimizer=opt) for built, opt in runs}
    return steps.pop()


def _fits(reporter: RankReporter, directory: Path, ctx: RankContext, *,
          pipeline: bool = False, **job: Any) -> bool:
    """The memory check (a pipelined rank's with ``pipeline``); False (and this rank's
    final state written) when the job is refused: ``refused`` with the figures on a rank
    that cannot fit, ``ended`` elsewhere."""
    from hpcodegen.launch.rank.preflight import check_memory, check_pipeline_memory
    from hpcodegen.launch.results import STATUS_ENDED

    reporter.update(phase="memory check")
    verdict = (check_pipeline_memory if pipeline else check_memory)(directory, ctx, **job)
    if verdict.first_refused is None:
        return True
    if verdict.refusal is not None:
        reporter.refuse(verdict.refusal)
    else:
        reporter.update(status=STATUS_ENDED, phase=f"rank {verdict.first_refused} cannot fit")
    return False


def run(reporter: RankReporter) -> None:
    """The whole smoke job for this rank; the final record says ok or what failed."""
    parity_on = env.get(env.CHECK_PARITY) == "1"
    steps, seed = env.get_int(env.STEPS, 0), env.get_int(env.SEED, 0)
    tol = float(env.get(env.TOLERANCE, "1e-5"))
    dtype = env.get(env.DTYPE, "fp32")
    save_dir, resume_dir = env.get(env.SAVE), env.get(env.RESUME)
    max_norm = float(env.get(env.MAX_GRAD_NORM)) if env.get(env.MAX_GRAD_NORM) else None
    ctx = init_rank()
    reporter.update(device=str(ctx.device), world_size=ctx.world_size)
    if ctx.meta.plan.pipeline is not None:  # stages and a frozen schedule: its own job
        from hpcodegen.launch.rank import pipeline_job

        pipeline_job.run(reporter, ctx)
        return
    directory = resolve_model_dir(None, ctx.meta.artifact_dir)
    from hpcodegen.checkpoint.safetensors_io import SafetensorsCheckpoint

    seeded = not resume_dir and not SafetensorsCheckpoint(directory)
    if not _fits(reporter, directory, ctx, dtype=dtype, parity=parity_on, steps=steps,
                 seeded=seeded):
        return
    reporter.update(phase="build")
    built = build_parallel_model(directory, ctx, seed, dtype, empty=bool(resume_dir))
    scope = env.get(env.COMPILE)
    if scope:
        from hpcodegen.runtime.compile import compile_parallelized

        compile_parallelized(built.model, scope, **env.compile_options())
    ref = None
    if parity_on:
        ref = build_model(directory, ctx.meta.artifact_dir, seed, ctx.device, dtype)
    runs = [(b, _optimizer(b.model)) for b in (built, ref) if b is not None]
    first = _resume(resume_dir, runs, reporter) if resume_dir else 0
    weights = f"checkpoint {resume_dir} (step {first})" if resume_dir else built.weights
    reporter.update(phase="forward", weights=weights,
                    local_param_bytes=local_param_bytes(built.model))
    shape = smoke_length(ctx.world_size, built.hf_config)
    reporter.update(batch={"rows": BATCH_SIZE, **shape.to_json()})
    batch = synthetic_batch(vocab_size_of(built.hf_config), ctx.world_size, seed, ctx.device,
                            length=shape.length)
    if not scope:
        reporter.update(forward_ms=_timed_forward(built.model, batch[0], ctx.device,
                                                  built.active))
    parity: dict[str, Any] | None = None
    if ref is not None:
        reporter.update(phase="parity")
        parity = {**_parity(built.model, ref.model, batch, ctx, built.active, built.expert,
                            head_vocab(built)),
                  "tolerance": tol}
        reporter.update(parity=parity)
    if steps:
        norms = _train(runs, batch, steps, first, ctx, max_norm, reporter)
        if parity is not None and ref is not None:
            rec = reporter.record
            diffs = [abs(a - b) for a, b in zip(rec.losses, rec.ref_losses, strict=True)]
            finite = all(math.isfinite(x) for x in rec.losses)  # a NaN loss must fail
            parity["loss_max_diff"] = _nan_max(diffs) if finite else math.nan
            parity["param_max_diff"] = max_param_diff(built.model, ref.model, ctx.meta.plan,
                                                      built.active, lambda p: p.data,
                                                      built.expert)[0]
            if max_norm is not None:
                parity["grad_norms"] = norms[0]
                parity["grad_norm_max_diff"] = _nan_max(
                    [abs(a - b) / max(1.0, abs(b)) for a, b in zip(*norms, strict=True)])
    if scope:  # after the job's own forwards compiled its graph (see _timed_forward)
        reporter.update(forward_ms=_timed_forward(built.model, batch[0], ctx.device,
                                                  built.active, compiled=True,
                                                  warm=parity is not None or steps > 0))
    if save_dir:
        from hpcodegen.checkpoint.dcp_io import save

        reporter.update(phase="save")
        save(save_dir, built.model, optimizer=runs[0][1], step=first + steps,
             record=_checkpoint_record(ctx, built))
    reporter.update(parity=parity)
    failure = _failure(parity, tol) if parity is not None else None
    bad = [first + k for k, x in enumerate(reporter.record.losses, 1) if not math.isfinite(x)]
    reporter.finish(failure or (f"non-finite loss at step {bad[0]}" if bad else None))
