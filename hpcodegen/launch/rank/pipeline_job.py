"""The built-in rank job for a pipelined artifact (``meta.pipeline``): build, parity, steps.

Steps (each a ``phase`` the launcher shows):

1. ``build``: the model built on the meta device and parallelized over tp as for any
   artifact, only this pp rank's stages' parameters materialised (from the weights, or
   from the seeded init the reference builds, or left empty for ``--resume`` to fill; the
   rest stay on meta), then its stages cut
   out of it and the frozen schedule set up
   (:class:`hpcodegen.runtime.pipeline_run.PipelineRunner`); with parity, the unsharded
   reference from the same weights;
2. ``parity``: one pipelined forward/backward of the global batch (``n_microbatches``
   rows), against the reference's mean cross entropy on the whole batch: the loss and the
   logits (on the last stage's rank), the gradient of every parameter this rank's stages
   own, and the point-to-point ops counted as posted against the frozen list's;
3. ``step k/K``: AdamW steps of the stages' parameters (the reference steps identically);
   the loss is shared over the pp group so every rank reports it.

Every axis of the artifact composes with the pipeline. Under loss parallelism
(``parallel_dims.loss_parallel``: the head's output ``S(-1)`` on tp, the same test as
without pp, :func:`hpcodegen.parity.step.loss_parallel_head`) the last stage takes each
microbatch's loss on its vocabulary slice of the logits (the runner's ``vocab``), and the
parity check gathers the logits over tp before comparing them. Under cp (with or without
sequence parallelism, the boundary sharded over cp and tp alike) the batch is cut once
before stage 0, each later stage rebuilds the cp batch view of the shard it receives, the
gradients are summed over cp after the step and the logits gathered over cp.

On dp ranks (no ep) each stage runs FSDP2 over dp
(:mod:`hpcodegen.runtime.pipeline_fsdp`), each dp rank its rows of the global batch; with
cp each cp rank runs its positions of them (``pp x dp x cp x tp``).

With ``--save DIR`` the usual DCP checkpoint is written, each rank writing only the
parameters its stages own and their optimizer state (DCP's plan is the union over the
ranks): FQNs are the model's own, each parameter comes from its owner as the DTensor it
holds (under FSDP2 over dp, its shard over dp and tp; no gather), and the checkpoint
resumes on any mesh, pp or not, FSDP or not (``--resume``: each rank reads only its
stages' parameters and their state, resharded by DCP to what it holds).

With ``--max-grad-norm`` the gradients are clipped by the whole model's norm before each
step (:meth:`~hpcodegen.runtime.pipeline_run.PipelineRunner.clip_grad_norm_`: each stage's
owned parameters' norm over tp/dp, combined over pp, a tied parameter counted once); with
parity the reference clips by torch's own, the clipped gradients are compared and the
norms of every step too (``grad_norm_max_diff``).

``--compile`` (scope ``layers``) compiles each decoder layer before the stages are cut
(each stage runs its layers compiled); ``--compile-scope model`` is refused (no stage runs
the whole forward).

Before the build, the memory check of a pipelined rank
(:func:`hpcodegen.launch.rank.preflight.check_pipeline_memory`): what the rank holds, its
stages' gradients and AdamW state, and the activations the frozen schedule keeps in flight
on its stages; a rank that cannot fit refuses the whole job before anything is built.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from hpcodegen.launch import env
from hpcodegen.launch.rank.context import RankContext
from hpcodegen.launch.rank.model import (
    build_model,
    build_parallel_model,
    local_param_bytes,
    resolve_model_dir,
    smoke_length,
)
from hpcodegen.launch.rank.reporter import RankReporter

LEARNING_RATE = 1e-3


def _batch(vocab: int, rows: int, world: int, hf_config: Any, seed: int,
           device: Any) -> tuple[Any, Any]:
    """The smoke job's synthetic batch, of the launch's one bounded length (so a checkpoint
    resumed without pp trains on the same data), its rows repeated up to a multiple of the
    microbatch count."""
    from hpcodegen.launch.rank.model import synthetic_batch

    ids, labels = synthetic_batch(vocab, world, seed, device,
                                  length=smoke_length(world, hf_config).length)
    if ids.shape[0] % rows:
        reps = -(-rows // ids.shape[0])
        ids, labels = ids.repeat(reps, 1)[:rows], labels.repeat(reps, 1)[:rows]
    return ids, labels


def _ref_step(ref: Any, ids: Any, labels: Any) -> tuple[Any, Any]:
    import torch.nn.functional as F

    logits = ref(input_ids=ids, use_cache=False).logits
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1),
                           ignore_index=-100)
    loss.backward()
    return loss.detach(), logits.detach()


@dataclass(frozen=True)
class _Feed:
    """The global batch, the rows this rank runs (all of them, or under FSDP its dp rank's
    share), the whole batch's count of valid labels, and the groups a loss is summed over
    (pp: one rank holds the last stage; dp under FSDP: each holds its rows' share; cp: each
    holds its positions' share). Under cp, ``cp`` is this rank's share of the batch
    (:func:`hpcodegen.runtime.cp.shard_batch`, the frozen layout's order, made once before
    stage 0): the stages run its tokens, the loss is taken on its labels, and the
    gradients are summed over ``cp_group`` after the step."""

    ids: Any
    labels: Any
    rows: slice
    valid: int
    groups: tuple[Any, ...]
    cp: Any = None
    cp_group: Any = None

    def step(self, runner: Any) -> tuple[Any, Any]:
        if self.cp is None:
            return runner.step(self.ids[self.rows], self.labels[self.rows], self.valid)
        from hpcodegen.runtime.cp import all_reduce_gradients

        loss, logits = runner.step(self.cp.inputs["input_ids"][self.rows],
                                   self.cp.labels[self.rows], self.valid)
        all_reduce_gradients(runner.model, [self.cp_group])
        return loss, None if logits is None else self.cp.gather(logits)


def _feed(ids: Any, labels: Any, ctx: RankContext, fsdp: bool, model: Any = None) -> _Feed:
    rows, groups = slice(None), (ctx.mesh.get_group("pp"),)
    if fsdp:
        from hpcodegen.runtime.pipeline_fsdp import dp_rows

        dp = ctx.mesh["dp"]
        rows = dp_rows(ids.shape[0], dp.size(), dp.get_local_rank())
        groups = (*groups, dp.get_group())
    valid = int((labels != -100).sum())
    if "cp" not in ctx.layout.names or model is None:
        return _Feed(ids, labels, rows, valid, groups)
    from hpcodegen.runtime.cp import shard_batch

    cp_group = ctx.mesh.get_group("cp")
    return _Feed(ids, labels, rows, valid, (*groups, cp_group),
                 shard_batch(model, input_ids=ids, shift_labels=labels), cp_group)


def _shared(loss: Any, feed: _Feed, device: Any) -> float:
    """The step's loss on every rank: the last stage's, summed over the feed's groups."""
    import torch
    import torch.distributed as dist

    value = torch.zeros((), device=device) if loss is None else loss.float().clone()
    for group in feed.groups:
        dist.all_reduce(value, group=group)
    return float(value)


def _vocab(built: Any, ctx: RankContext) -> tuple[Any, int | None] | None:
    """``(tp group, the head's full vocabulary)`` when the plan keeps the head's logits
    vocab-sharded (loss parallelism: the last stage takes the loss on its slice), else
    None."""
    from hpcodegen.launch.rank.smoke import head_vocab
    from hpcodegen.parity.step import loss_parallel_head

    if not loss_parallel_head(built.model, ctx.meta.plan, built.active):
        return None
    return built.active.tp_group(), head_vocab(built)


def _whole(logits: Any, built: Any, ctx: RankContext) -> Any:
    """The last stage's logits with the whole vocabulary (gathered over tp under loss
    parallelism, as the plan places the head's output), for the parity check."""
    from hpcodegen.parity.gather import full_logits

    return full_logits(logits, built.model, ctx.meta.plan, built.active)


def _compile(model: Any, scope: str | None) -> None:
    """``--compile`` (scope ``layers``): each decoder layer compiled in place, as without a pipeline
    (:func:`~hpcodegen.runtime.compile.compile_parallelized`) and before the stages are cut,
    so each stage runs its layers compiled (compilation is lazy: a rank compiles only the
    layers its stages run). ``--compile-scope model`` compiles a forward no stage calls:
    refused."""
    if not scope:
        return
    if scope != "layers":
        raise RuntimeError(f"--compile-scope {scope} with a pipelined artifact: each stage "
                           "runs a part of the model; use --compile-scope layers (each "
                           "stage's decoder layers compiled)")
    from hpcodegen.runtime.compile import compile_parallelized

    compile_parallelized(model, scope, **env.compile_options())


def _clip(runner: Any, ref: Any, max_norm: float | None) -> tuple[float, float] | None:
    """With ``--max-grad-norm``: the pipeline's gradients clipped by the whole model's norm
    and the reference's by torch's own; the two norms."""
    if max_norm is None:
        return None
    import torch

    norm = float(runner.clip_grad_norm_(max_norm))
    ref_norm = float(torch.nn.utils.clip_grad_norm_(ref.model.parameters(), max_norm)) \
        if ref is not None else math.nan
    return norm, ref_norm


def _parity(runner: Any, built: Any, ref: Any, feed: _Feed, ctx: RankContext,
            pp_rank: int, max_norm: float | None) -> dict[str, Any]:
    from hpcodegen.parity.gather import max_param_diff
    from hpcodegen.plan.schedule import parse_action
    from hpcodegen.runtime.pipeline_fsdp import count_reduce_scatters
    from hpcodegen.runtime.pipeline_run import count_p2p
    from hpcodegen.runtime.pipeline_stage import owned_parameters

    pipe = ctx.meta.plan.pipeline
    with count_p2p() as seen, count_reduce_scatters() as reduced:
        loss, logits = feed.step(runner)
    ref_loss, ref_logits = _ref_step(ref.model, feed.ids, feed.labels)
    norms = _clip(runner, ref, max_norm)  # the gradients compared are the clipped ones
    names = set(owned_parameters(built.model, pipe, pp_rank))
    grad, worst, odd = max_param_diff(
        built.model, ref.model, ctx.meta.plan, built.active,
        lambda p: p.grad, expert=built.expert,  # a DTensor over (dp, tp): full_tensor()
        names=names)
    mine = [parse_action(a) for a in pipe.actions[str(pp_rank)]]
    predicted = {"isend": sum(a.kind.startswith("SEND") for a in mine),
                 "irecv": sum(a.kind.startswith("RECV") for a in mine)}
    measured = {"isend": seen["isend"], "irecv": seen["irecv"]}
    shared = _shared(loss, feed, ctx.device)
    out = {"grad_max_diff": grad, "worst_grad": worst, "mismatched_params": odd,
           "loss": shared, "ref_loss": float(ref_loss), "params_compared": len(names),
           "ep": built.expert.ep_size if built.expert is not None else 1,
           "loss_parallel": runner.vocab is not None,
           "dp_reduce_scatters": reduced["reduce_scatter"],
           "stage_units": sum(len(pipe.stages[i].modules) for i in pipe.ranks_stages(pp_rank)),
           "p2p": {"measured": measured, "predicted": predicted,
                   "bytes_sent": seen["isend_bytes"]}}
    if logits is not None:
        logits = _whole(logits, built, ctx)
        out["logits_max_diff"] = float((logits.float() - ref_logits[feed.rows].float())
                                       .abs().max())
    out["loss_max_diff"] = abs(shared - float(ref_loss))
    if norms is not None:
        out["grad_norms"] = [norms[0]]
        out["ref_grad_norms"] = [norms[1]]
    built.model.zero_grad(set_to_none=True)
    ref.model.zero_grad(set_to_none=True)
    return out


def _optimizers(built: Any, ref: Any) -> list[Any]:
    """AdamW over every parameter of the model, in the model's order, on every rank (a
    parameter another stage owns gets no gradient, so no state and no update here): the
    parameter groups are the same on every rank and in a checkpoint."""
    import torch

    opts = [torch.optim.AdamW(built.model.parameters(), lr=LEARNING_RATE)]
    if ref is not None:
        opts.append(torch.optim.AdamW(ref.model.parameters(), lr=LEARNING_RATE))
    return opts


def _train(runner: Any, ref: Any, opts: list[Any], feed: _Feed, steps: int,
           first: int, ctx: RankContext, reporter: RankReporter,
           max_norm: float | None) -> list[tuple[float, float]]:
    """``steps`` AdamW steps (clipped with ``--max-grad-norm``); the norms per step."""
    norms = []
    for k in range(1, steps + 1):
        for opt in opts:
            opt.zero_grad(set_to_none=True)
        loss, _ = feed.step(runner)
        if ref is not None:
            ref_loss, _ = _ref_step(ref.model, feed.ids, feed.labels)
            reporter.record.ref_losses.append(float(ref_loss))
        clipped = _clip(runner, ref, max_norm)
        if clipped is not None:
            norms.append(clipped)
        for opt in opts:
            opt.step()
        reporter.record.losses.append(_shared(loss, feed, ctx.device))
        reporter.update(phase=f"step {first + k}/{first + steps}")
    return norms


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
    from hpcodegen.checkpoint.safetensors_io import SafetensorsCheckpoint
    from hpcodegen.launch.rank.smoke import _fits, vocab_size_of
    from hpcodegen.runtime.pipeline_run import PipelineRunner
    from hpcodegen.runtime.pipeline_stage import owned_parameters

    parity_on = env.get(env.CHECK_PARITY) == "1"
    steps, seed = env.get_int(env.STEPS, 0), env.get_int(env.SEED, 0)
    tol = float(env.get(env.TOLERANCE, "1e-5"))
    max_norm = float(env.get(env.MAX_GRAD_NORM)) if env.get(env.MAX_GRAD_NORM) else None
    dtype = env.get(env.DTYPE, "fp32")
    pipe = ctx.meta.plan.pipeline
    directory = resolve_model_dir(None, ctx.meta.artifact_dir)
    sizes = dict(zip(ctx.layout.names, ctx.layout.sizes, strict=True))
    fsdp = sizes.get("dp", 1) > 1 and ctx.layout.ep <= 1
    save_dir, resume_dir = env.get(env.SAVE), env.get(env.RESUME)
    if not _fits(reporter, directory, ctx, pipeline=True, dtype=dtype, parity=parity_on,
                 steps=steps, seeded=not resume_dir and not SafetensorsCheckpoint(directory),
                 dp=sizes.get("dp", 1) if fsdp else 1):
        return
    reporter.update(phase="build")
    pp_rank = ctx.mesh.get_local_rank("pp")
    stages = set(pipe.ranks_stages(pp_rank))
    built = build_parallel_model(directory, ctx, seed, dtype, empty=bool(resume_dir),
                                 owns=lambda fqn: pipe.owner(fqn) in stages)
    ref = build_model(directory, ctx.meta.artifact_dir, seed, ctx.device, dtype) \
        if parity_on else None
    _compile(built.model, env.get(env.COMPILE))
    runner = PipelineRunner(built.model, pipe, pp_rank, ctx.mesh.get_group("pp"), ctx.device,
                            sizes.get("tp", 1), ctx.mesh["dp"] if fsdp else None,
                            _vocab(built, ctx))
    opts = _optimizers(built, ref)  # after FSDP: its sharded parameters
    first = 0
    # the parameters this rank's stages own (a tied one under each FQN naming it): what it
    # reads from a checkpoint and writes to one
    mine = set(owned_parameters(built.model, pipe, pp_rank))
    if resume_dir:
        from hpcodegen.checkpoint.dcp_io import resume

        reporter.update(phase="resume")
        first = resume(resume_dir, built.model, optimizer=opts[0], params=mine)
        if ref is not None:
            resume(resume_dir, ref.model, optimizer=opts[1])
    dp = sizes.get("dp", 1) if fsdp else 1
    ids, labels = _batch(vocab_size_of(built.hf_config), pipe.n_microbatches * dp,
                         ctx.world_size, built.hf_config, seed, ctx.device)
    feed = _feed(ids, labels, ctx, fsdp, built.model)
    reporter.update(phase="forward", weights=built.weights,
                    local_param_bytes=local_param_bytes(built.model))
    parity = None
    if ref is not None:
        reporter.update(phase="parity")
        parity = {**_parity(runner, built, ref, feed, ctx, pp_rank, max_norm), "tolerance": tol,
                  "fsdp_dp": dp}
        if env.get(env.COMPILE):
            from torch._dynamo.utils import counters

            parity["compiled_graphs"] = int(counters["stats"]["unique_graphs"])
        reporter.update(parity=parity)
    if steps:
        norms = _train(runner, ref, opts, feed, steps, first, ctx, reporter, max_norm)
        if parity is not None:
            rec = reporter.record
            diffs = [abs(a - b) for a, b in zip(rec.losses, rec.ref_losses, strict=True)]
            parity["loss_max_diff"] = max([parity["loss_max_diff"], *diffs])
            for norm, ref_norm in norms:
                parity["grad_norms"].append(norm)
                parity["ref_grad_norms"].append(ref_norm)
            reporter.update(parity=parity)
    if parity is not None and max_norm is not None:
        from hpcodegen.launch.rank.smoke import _nan_max

        parity["grad_norm_max_diff"] = _nan_max(
            [abs(a - b) / max(1.0, abs(b))
             for a, b in zip(parity["grad_norms"], parity["ref_grad_norms"], strict=True)])
        reporter.update(parity=parity)
    if save_dir:
        from hpcodegen.checkpoint.dcp_io import save
        from hpcodegen.launch.rank.smoke import _checkpoint_record

        reporter.update(phase="save")
        save(save_dir, built.model, optimizer=opts[0], step=first + steps,
             record=_checkpoint_record(ctx, built), params=mine)
    bad = [k for k, x in enumerate(reporter.record.losses, 1) if not math.isfinite(x)]
    reporter.finish(_failure(parity, tol) or (f"non-finite loss at step {bad[0]}" if bad
                                              else None))
