"""The built-in rank job: parallelize from the artifact, forward, parity, training steps.

Steps, in order (each is a ``phase`` the launcher shows):

1. ``init``: device, process group, mesh (:func:`rank.init_rank`).
2. ``build``: the full model from the generated class (seeded or safetensors weights); with
   parity, a deep copy stays unsharded as the reference.
3. ``parallelize``: :func:`hpcodegen.runtime.parallelize_from_generated` on the model;
   with ``--compile``, :func:`hpcodegen.runtime.compile.compile_parallelized` after it.
4. ``forward``: one timed forward of the synthetic batch.
5. ``parity``: logits and every parameter's gradient against the reference.
6. ``step k/K``: AdamW steps; with parity the reference steps identically and the losses
   are compared.
"""

from __future__ import annotations

import copy
import time
from typing import Any

from hpcodegen.launch import env
from hpcodegen.launch.model import (
    build_model,
    local_param_bytes,
    resolve_model_dir,
    synthetic_batch,
)
from hpcodegen.launch.parity import full_logits, max_param_diff
from hpcodegen.launch.rank import RankContext, init_rank
from hpcodegen.launch.reporter import RankReporter
from hpcodegen.plan.entry import vocab_sharded_heads

LEARNING_RATE = 1e-3


def parallelize(model: Any, ctx: RankContext, hf_config: Any) -> Any:
    """Install the artifact's plan on ``model``; returns the runtime's active mesh."""
    from hpcodegen.runtime import MeshContext, parallelize_from_generated
    from hpcodegen.runtime.mesh import resolve_active_mesh

    context = MeshContext(device_mesh=ctx.mesh)
    parallelize_from_generated(model, context, ctx.meta.artifact_dir, hf_config=hf_config,
                               allowed_target_prefixes=env.allowed_targets())
    return resolve_active_mesh(ctx.meta.data, context)


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "npu":
        torch.npu.synchronize(device)  # type: ignore[attr-defined]


def _loss(model: Any, ids: Any, labels: Any, ctx: RankContext, active: Any | None) -> Any:
    """Cross entropy and the logits it was taken on.

    The sharded model (``active`` given): on the full logits, gathered per plan; with a
    loss-parallel head (:func:`~hpcodegen.plan.entry.vocab_sharded_heads`) on the
    vocab-sharded logits themselves (:func:`~hpcodegen.runtime.loss.vocab_parallel_cross_entropy`,
    no gather), which are returned as they are.
    """
    import torch.nn.functional as F

    logits = model(input_ids=ids).logits
    if active is not None and vocab_sharded_heads(ctx.meta.data):
        from hpcodegen.runtime.loss import vocab_parallel_cross_entropy

        vocab = getattr(getattr(model, "config", None), "vocab_size", None)
        return vocab_parallel_cross_entropy(logits, labels, active.tp_group(),
                                            vocab_size=vocab), logits
    if active is not None:
        logits = full_logits(logits, model, ctx.meta.data, active)
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten()), logits


def _timed_forward(model: Any, ids: Any, device: Any) -> float:
    import torch

    with torch.no_grad():
        _sync(device)
        start = time.perf_counter()
        model(input_ids=ids)
        _sync(device)
    return (time.perf_counter() - start) * 1000.0


def _parity(model: Any, ref: Any, batch: tuple[Any, Any], ctx: RankContext,
            active: Any) -> dict[str, Any]:
    """One forward/backward on both models; max diffs of logits and gradients."""
    ids, labels = batch
    loss, logits = _loss(model, ids, labels, ctx, active)
    loss.backward()
    # vocab-sharded logits (loss parallel) are gathered here for the comparison only
    logits = full_logits(logits.detach(), model, ctx.meta.data, active)
    ref_loss, ref_logits = _loss(ref, ids, labels, ctx, None)
    ref_loss.backward()
    grad_diff, worst, odd = max_param_diff(model, ref, ctx.meta.data, active,
                                           lambda p: p.grad)
    model.zero_grad(set_to_none=True)
    ref.zero_grad(set_to_none=True)
    return {"logits_max_diff": float((logits.detach() - ref_logits.detach()).abs().max()),
            "grad_max_diff": grad_diff, "worst_grad": worst, "mismatched_params": odd,
            "loss": float(loss), "ref_loss": float(ref_loss)}


def _train(model: Any, ref: Any | None, batch: tuple[Any, Any], steps: int, ctx: RankContext,
           active: Any, reporter: RankReporter) -> None:
    """``steps`` AdamW steps on the synthetic batch (the reference steps identically)."""
    import torch

    pairs = [(model, active)] + ([(ref, None)] if ref is not None else [])
    opts = [torch.optim.AdamW(m.parameters(), lr=LEARNING_RATE) for m, _ in pairs]
    for k in range(1, steps + 1):
        losses = []
        for (m, act), opt in zip(pairs, opts, strict=True):
            opt.zero_grad(set_to_none=True)
            loss, _ = _loss(m, *batch, ctx, act)
            loss.backward()
            opt.step()
            losses.append(float(loss))
        reporter.record.losses.append(losses[0])
        if ref is not None:
            reporter.record.ref_losses.append(losses[1])
        reporter.update(phase=f"step {k}/{steps}")


def _failure(parity: dict[str, Any], tol: float) -> str | None:
    """The parity check's verdict: None when every compared quantity is within ``tol``."""
    if parity.get("mismatched_params"):
        return f"parameters differ in shape or presence: {parity['mismatched_params'][:3]}"
    for key in ("logits_max_diff", "grad_max_diff", "loss_max_diff"):
        value = parity.get(key)
        if value is not None and not value <= tol:
            where = f" at {parity['worst_grad']}" if key == "grad_max_diff" else ""
            return f"parity {key.replace('_', ' ')} {value:.3e}{where} > tolerance {tol:g}"
    return None


def run(reporter: RankReporter) -> None:
    """The whole smoke job for this rank; the final record says ok or what failed."""
    parity_on = env.get(env.CHECK_PARITY) == "1"
    steps, seed = env.get_int(env.STEPS, 0), env.get_int(env.SEED, 0)
    tol = float(env.get(env.TOLERANCE, "1e-5"))
    ctx = init_rank()
    reporter.update(device=str(ctx.device), phase="build", world_size=ctx.world_size)
    directory = resolve_model_dir(None, ctx.meta.artifact_dir)
    model, hf_config, weights = build_model(directory, ctx.meta.artifact_dir, seed,
                                            ctx.device)
    ref = copy.deepcopy(model) if parity_on else None
    reporter.update(phase="parallelize", weights=weights)
    active = parallelize(model, ctx, hf_config)
    scope = env.get(env.COMPILE)
    if scope:
        from hpcodegen.runtime.compile import compile_parallelized

        compile_parallelized(model, scope)
    batch = synthetic_batch(hf_config.vocab_size, ctx.world_size, seed, ctx.device)
    reporter.update(phase="forward", local_param_bytes=local_param_bytes(model))
    reporter.update(forward_ms=_timed_forward(model, batch[0], ctx.device))
    parity: dict[str, Any] | None = None
    if ref is not None:
        reporter.update(phase="parity")
        parity = {**_parity(model, ref, batch, ctx, active), "tolerance": tol}
        reporter.update(parity=parity)
    if steps:
        _train(model, ref, batch, steps, ctx, active, reporter)
        if parity is not None:
            rec = reporter.record
            parity["loss_max_diff"] = max(abs(a - b) for a, b in zip(rec.losses, rec.ref_losses,
                                                                     strict=True))
            parity["param_max_diff"] = max_param_diff(model, ref, ctx.meta.data, active,
                                                      lambda p: p.data)[0]
    reporter.update(parity=parity)
    reporter.finish(_failure(parity, tol) if parity is not None else None)
