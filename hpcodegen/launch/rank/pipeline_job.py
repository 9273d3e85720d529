"""The built-in rank job for a pipelined artifact (``meta.pipeline``): build, parity, steps.

Steps (each a ``phase`` the launcher shows):

1. ``build``: the model parallelized over tp as for any artifact, then this pp rank's
   stages cut out of it and the frozen schedule set up
   (:class:`hpcodegen.runtime.pipeline_run.PipelineRunner`); with parity, the unsharded
   reference from the same weights;
2. ``parity``: one pipelined forward/backward of the global batch (``n_microbatches``
   rows), against the reference's mean cross entropy on the whole batch: the loss and the
   logits (on the last stage's rank), the gradient of every parameter this rank's stages
   own, and the point-to-point ops counted as posted against the frozen list's;
3. ``step k/K``: AdamW steps of the stages' parameters (the reference steps identically);
   the loss is shared over the pp group so every rank reports it.

Not yet with a pipeline (refused with the reason): ``--save``/``--resume``,
``--compile``, ``--max-grad-norm``; the memory check is skipped (it models whole-model
ranks).
"""

from __future__ import annotations

import math
from typing import Any

from hpcodegen.launch import env
from hpcodegen.launch.rank.context import RankContext
from hpcodegen.launch.rank.model import (
    build_model,
    build_parallel_model,
    resolve_model_dir,
    sliding_window_of,
    synthetic_length,
)
from hpcodegen.launch.rank.reporter import RankReporter

LEARNING_RATE = 1e-3
#: launch options a pipeline does not run yet, by their environment variable
_NOT_YET = {env.SAVE: "--save", env.RESUME: "--resume", env.COMPILE: "--compile",
            env.MAX_GRAD_NORM: "--max-grad-norm"}


def _batch(vocab: int, rows: int, length: int, seed: int, device: Any) -> tuple[Any, Any]:
    """Seeded ids and next-token labels (-100 at each row's last position), same on every
    rank."""
    import torch

    gen = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(0, vocab, (rows, length + 1), generator=gen)
    labels = ids[:, 1:].clone()
    labels[:, -1] = -100
    return ids[:, :-1].contiguous().to(device), labels.to(device)


def _ref_step(ref: Any, ids: Any, labels: Any) -> tuple[Any, Any]:
    import torch.nn.functional as F

    logits = ref(input_ids=ids, use_cache=False).logits
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1),
                           ignore_index=-100)
    loss.backward()
    return loss.detach(), logits.detach()


def _shared(loss: Any, group: Any, device: Any) -> float:
    """The last stage's loss on every pp rank (exactly one rank holds it)."""
    import torch
    import torch.distributed as dist

    value = torch.zeros((), device=device) if loss is None else loss.float().clone()
    dist.all_reduce(value, group=group)
    return float(value)


def _parity(runner: Any, built: Any, ref: Any, ids: Any, labels: Any, ctx: RankContext,
            pp_rank: int) -> dict[str, Any]:
    from hpcodegen.parity.gather import max_param_diff
    from hpcodegen.plan.schedule import parse_action
    from hpcodegen.runtime.pipeline_run import count_p2p
    from hpcodegen.runtime.pipeline_stage import owned_parameters

    pipe = ctx.meta.plan.pipeline
    with count_p2p() as seen:
        loss, logits = runner.step(ids, labels)
    ref_loss, ref_logits = _ref_step(ref.model, ids, labels)
    names = set(owned_parameters(built.model, pipe, pp_rank))
    grad, worst, odd = max_param_diff(built.model, ref.model, ctx.meta.plan, built.active,
                                      lambda p: p.grad, names=names)
    mine = [parse_action(a) for a in pipe.actions[str(pp_rank)]]
    predicted = {"isend": sum(a.kind.startswith("SEND") for a in mine),
                 "irecv": sum(a.kind.startswith("RECV") for a in mine)}
    measured = {"isend": seen["isend"], "irecv": seen["irecv"]}
    shared = _shared(loss, ctx.mesh.get_group("pp"), ctx.device)
    out = {"grad_max_diff": grad, "worst_grad": worst, "mismatched_params": odd,
           "loss": shared, "ref_loss": float(ref_loss), "params_compared": len(names),
           "p2p": {"measured": measured, "predicted": predicted,
                   "bytes_sent": seen["isend_bytes"]}}
    if logits is not None:
        out["logits_max_diff"] = float((logits.float() - ref_logits.float()).abs().max())
    out["loss_max_diff"] = abs(shared - float(ref_loss))
    built.model.zero_grad(set_to_none=True)
    ref.model.zero_grad(set_to_none=True)
    return out


def _train(runner: Any, ref: Any, ids: Any, labels: Any, steps: int, ctx: RankContext,
           reporter: RankReporter) -> None:
    import torch

    opts = [torch.optim.AdamW(runner.parameters(), lr=LEARNING_RATE)]
    if ref is not None:
        opts.append(torch.optim.AdamW(ref.model.parameters(), lr=LEARNING_RATE))
    for k in range(1, steps + 1):
        for opt in opts:
            opt.zero_grad(set_to_none=True)
        loss, _ = runner.step(ids, labels)
        opts[0].step()
        reporter.record.losses.append(_shared(loss, ctx.mesh.get_group("pp"), ctx.device))
        if ref is not None:
            ref_loss, _ = _ref_step(ref.model, ids, labels)
            opts[1].step()
            reporter.record.ref_losses.append(float(ref_loss))
        reporter.update(phase=f"step {k}/{steps}")


def _failure(parity: dict[str, Any] | None, tol: float) -> str | None:
    if parity is None:
        return None
    from hpcodegen.launch.rank.smoke import _failure as smoke_failure

    p2p = parity["p2p"]
    if p2p["measured"] != p2p["predicted"]:
        return f"p2p ops {p2p['measured']} differ from the frozen list's {p2p['predicted']}"
    return smoke_failure(parity, tol)


def run(reporter: RankReporter, ctx: RankContext) -> None:
    """The pipeline job for this rank; the final record says ok or what failed."""
    from hpcodegen.launch.rank.smoke import vocab_size_of
    from hpcodegen.runtime.pipeline_run import PipelineRunner

    for var, flag in _NOT_YET.items():
        if env.get(var):
            raise RuntimeError(f"{flag} with a pipelined artifact is not supported yet")
    parity_on = env.get(env.CHECK_PARITY) == "1"
    steps, seed = env.get_int(env.STEPS, 0), env.get_int(env.SEED, 0)
    tol = float(env.get(env.TOLERANCE, "1e-5"))
    dtype = env.get(env.DTYPE, "fp32")
    pipe = ctx.meta.plan.pipeline
    directory = resolve_model_dir(None, ctx.meta.artifact_dir)
    reporter.update(phase="build")
    built = build_parallel_model(directory, ctx, seed, dtype)
    ref = build_model(directory, ctx.meta.artifact_dir, seed, ctx.device, dtype) \
        if parity_on else None
    pp_rank = ctx.mesh.get_local_rank("pp")
    runner = PipelineRunner(built.model, pipe, pp_rank, ctx.mesh.get_group("pp"), ctx.device)
    length = synthetic_length(ctx.world_size, sliding_window_of(built.hf_config))
    ids, labels = _batch(vocab_size_of(built.hf_config), pipe.n_microbatches, length, seed,
                         ctx.device)
    reporter.update(phase="forward", weights=built.weights,
                    local_param_bytes=sum(p.numel() * p.element_size()
                                          for p in runner.parameters()))
    parity = None
    if ref is not None:
        reporter.update(phase="parity")
        parity = {**_parity(runner, built, ref, ids, labels, ctx, pp_rank), "tolerance": tol}
        reporter.update(parity=parity)
    if steps:
        _train(runner, ref, ids, labels, steps, ctx, reporter)
        if parity is not None:
            rec = reporter.record
            diffs = [abs(a - b) for a, b in zip(rec.losses, rec.ref_losses, strict=True)]
            parity["loss_max_diff"] = max([parity["loss_max_diff"], *diffs])
            reporter.update(parity=parity)
    bad = [k for k, x in enumerate(reporter.record.losses, 1) if not math.isfinite(x)]
    reporter.finish(_failure(parity, tol) or (f"non-finite loss at step {bad[0]}" if bad
                                              else None))
