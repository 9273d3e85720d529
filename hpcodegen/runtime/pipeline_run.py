"""Run a frozen pipeline with ``torch.distributed.pipelining``, exactly (torch).

Steps of :class:`PipelineRunner`:

1. cut this pp rank's stages out of the (tp-installed) model
   (:func:`hpcodegen.runtime.pipeline_stage.build_stage_modules`) and wrap each in a
   ``PipelineStage`` on the pp process group;
2. hand torch's IR runtime (``_PipelineScheduleRuntime``) the *frozen* action list, sends
   and receives included (``compute_comms``): what runs is what verify simulated, not
   torch's own order (torch 2.13's 1F1B order fails its own validator); DualPipeV's
   overlapped ``F B`` pairs are frozen as their two halves, which is how torch's runtime
   runs an ``OVERLAP_F_B`` action (the forward, then the backward);
3. per step, the loss contract of the section: each microbatch's loss is the sum of its
   token losses divided by the global count of valid labels (counted on the whole batch
   before the split), and ``scale_grads=False``, so the summed microbatch losses are the
   unsharded mean loss and every gradient equals the unsharded one. Under loss
   parallelism (``vocab``: the tp group and the head's full vocabulary) the last stage's
   logits are this tp rank's vocabulary slice and the token losses come from
   :func:`hpcodegen.runtime.loss.vocab_parallel_token_losses` (three all-reduces per
   microbatch over tp, no gather of the logits): the same sum, the same normalizer;
4. after the schedule, tied parameters owned by different stages get their gradients
   summed over the pp group (ranks holding no copy add zeros);
5. optionally (:meth:`PipelineRunner.clip_grad_norm_`) the gradients clipped by the whole
   model's norm, the stages' norms combined over pp.

Point-to-point traffic is counted as it is posted (:func:`count_p2p`), so a test can
hold it against ``inspect-plan``'s prediction.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist

from hpcodegen.plan.pipeline import Pipeline
from hpcodegen.plan.schedule import schedule_spec
from hpcodegen.runtime.pipeline_stage import build_stage_modules, stage_parameters

IGNORE_INDEX = -100


@contextmanager
def count_p2p() -> Iterator[Counter]:
    """``with count_p2p() as seen:`` ``seen["isend"]``, ``seen["irecv"]`` (op counts) and
    ``seen["isend_bytes"]``, ``seen["irecv_bytes"]`` posted inside: every pipeline
    send and receive goes through the schedule module's ``_batch_p2p``."""
    from torch.distributed.pipelining import schedules

    seen: Counter = Counter()
    real = schedules._batch_p2p

    def counting(ops: list[Any], *args: Any, **kwargs: Any) -> Any:
        for op in ops:
            name = getattr(op.op, "__name__", str(op.op))
            seen[name] += 1
            seen[f"{name}_bytes"] += op.tensor.numel() * op.tensor.element_size()
        return real(ops, *args, **kwargs)

    schedules._batch_p2p = counting
    try:
        yield seen
    finally:
        schedules._batch_p2p = real


class PipelineRunner:
    """This rank's stages and the frozen schedule over them.

    Example::

        runner = PipelineRunner(model, plan.pipeline, pp_rank, mesh["pp"].get_group(), dev)
        loss = runner.step(input_ids, labels)      # gradients are on the parameters
    """

    def __init__(self, model: torch.nn.Module, pipe: Pipeline, pp_rank: int, group: Any,
                 device: Any, tp_size: int = 1, dp_mesh: Any = None,
                 vocab: tuple[Any, int | None] | None = None) -> None:
        from torch.distributed.pipelining import PipelineStage
        from torch.distributed.pipelining.schedules import _Action, _PipelineScheduleRuntime

        self.model, self.pipe, self.pp_rank, self.group = model, pipe, pp_rank, group
        self.vocab = vocab
        """``(tp group, full vocabulary)`` when the head's logits stay vocab-sharded (loss
        parallelism); None: the last stage's logits are whole."""
        self.device = device
        self.modules = build_stage_modules(model, pipe, pp_rank, tp_size)
        if schedule_spec(pipe.schedule).split_backward:
            from hpcodegen.runtime.local_views import without_aliases

            without_aliases(stage_parameters(m for _, m in self.modules))
        self.fsdp = dp_mesh is not None and dp_mesh.size() > 1
        """FSDP2 over ``dp_mesh`` (:mod:`hpcodegen.runtime.pipeline_fsdp`)."""
        self._dp_group = dp_mesh.get_group() if self.fsdp else None
        if self.fsdp:
            from hpcodegen.runtime.pipeline_fsdp import shard_stage

            for index, module in self.modules:
                shard_stage(module, [model.get_submodule(f)
                                     for f in pipe.stages[index].modules], dp_mesh)
        stages = [PipelineStage(module, index, pipe.n_stages, device, group=group)
                  for index, module in self.modules]
        self._normalizer: list[float] = [1.0]
        self.schedule = _PipelineScheduleRuntime(stages, pipe.n_microbatches,
                                                 loss_fn=self._loss, scale_grads=False)
        actions = {int(r): [_Action.from_str(a) for a in acts]
                   for r, acts in (pipe.actions or {}).items()}
        if self.fsdp:
            from hpcodegen.runtime.pipeline_fsdp import with_fsdp_actions

            actions = {r: with_fsdp_actions(acts, pipe.n_microbatches)
                       for r, acts in actions.items()}
        self.schedule._prepare_schedule_with_comms(actions, format="compute_comms")
        self.first = any(i == 0 for i, _ in self.modules)
        self.last = any(i == pipe.n_stages - 1 for i, _ in self.modules)

    def _loss(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if self.vocab is not None:
            from hpcodegen.runtime.loss import vocab_parallel_token_losses

            group, size = self.vocab
            total = vocab_parallel_token_losses(logits, target, group, vocab_size=size,
                                                ignore_index=IGNORE_INDEX).sum()
            return total / self._normalizer[0]
        flat = logits.reshape(-1, logits.shape[-1]).float()
        total = torch.nn.functional.cross_entropy(flat, target.reshape(-1), reduction="sum",
                                                  ignore_index=IGNORE_INDEX)
        return total / self._normalizer[0]

    def parameters(self) -> list[Any]:
        """The distinct parameters this rank's stages train."""
        return stage_parameters(m for _, m in self.modules)

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Clip this rank's gradients by the whole model's norm (after :meth:`step`;
        collective over the pp group and the stages' tp/dp meshes): each parameter counted
        once, by the stage owning its canonical FQN, the ranks' norms combined over pp
        (:func:`hpcodegen.checkpoint.clip.clip_pipeline_grad_norm_`). Returns the norm,
        equal to torch's ``clip_grad_norm_`` on the unsharded model."""
        from hpcodegen.checkpoint.clip import clip_pipeline_grad_norm_
        from hpcodegen.runtime.pipeline_stage import owned_parameters

        names = set(owned_parameters(self.model, self.pipe, self.pp_rank))
        return clip_pipeline_grad_norm_(self.model, self.parameters(), names, self.group,
                                        max_norm, norm_type)

    def step(self, input_ids: torch.Tensor, labels: torch.Tensor,
             valid_tokens: int | None = None
             ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """One forward and backward of the global batch (with FSDP, this dp rank's rows of
        it, and ``valid_tokens`` the whole batch's count of valid labels). Returns
        ``(loss, logits)`` on the rank running the last stage (the unsharded mean cross
        entropy, or this rank's share of it under FSDP, and the rows' logits: this tp
        rank's vocabulary slice of them under loss parallelism),
        ``(None, None)`` elsewhere; the gradients are on the parameters."""
        if valid_tokens is None:
            valid_tokens = int((labels != IGNORE_INDEX).sum())
        self._normalizer[0] = float(max(valid_tokens, 1))
        losses: list[torch.Tensor] = []
        args = (input_ids,) if self.first else ()
        logits = self.schedule.step(*args, target=labels if self.last else None,
                                    losses=losses if self.last else None,
                                    return_outputs=self.last)
        self._sum_tied_grads()
        if not self.last:
            return None, None
        return torch.stack(losses).sum().detach(), logits.detach()

    def _sum_tied_grads(self) -> None:
        """Tied parameters on several stages: each copy's gradient is the sum of all (the
        local shard's, when the runtime keeps parameters as DTensors)."""
        named = dict(self.model.named_parameters(remove_duplicate=False))
        mine = set(self.pipe.ranks_stages(self.pp_rank))
        for tied in self.pipe.tied_across_stages or ():
            held = [named[p] for p, s in zip(tied.params, tied.stages, strict=True)
                    if s in mine and p in named]
            param = held[0] if held else named.get(tied.params[0])
            if param is None:
                continue
            grad = param.grad if held else None
            local = _local(grad) if grad is not None else torch.zeros(
                _local(param).shape, dtype=param.dtype, device=self.device)  # param: on meta
            if grad is None and self.fsdp and not held:  # a holder's gradient is dp-sharded
                local = local.chunk(dist.get_world_size(self._dp_group))[
                    dist.get_rank(self._dp_group)].contiguous()
            summed = local.clone()
            dist.all_reduce(summed, group=self.group)
            if held and grad is not None:
                local.copy_(summed)
            elif held:
                param.grad = _like_param(summed, param)


def _like_param(local: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """``local`` as a gradient of ``param``: a DTensor with its mesh, placements and shape
    when the parameter is one (a plain gradient on a DTensor parameter raises)."""
    from torch.distributed.tensor import DTensor

    if not isinstance(param, DTensor):
        return local
    return DTensor.from_local(local, param.device_mesh, param.placements, run_check=False,
                              shape=param.shape, stride=param.stride())


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard, else the tensor itself."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if to_local is not None else tensor
