"""The loss rule: one forward and its loss, on the unsharded or the parallelized model.

The parity harness (:func:`hpcodegen.parity.harness.compare`) and launch's training steps
take the same loss, so a step that trains is a step that was compared:

* the reference (``active`` None): cross entropy on its logits;
* the sharded model: on the full logits (gathered per the LM head's planned placement) or,
  for a loss-parallel head (:meth:`~hpcodegen.plan.types.Plan.vocab_sharded_heads`), on the
  vocab-sharded logits themselves (:func:`~hpcodegen.runtime.loss.vocab_parallel_cross_entropy`,
  no gather; ``vocab`` is the head's full width);
* under context parallelism each rank feeds its positions of the batch
  (:func:`hpcodegen.runtime.cp.shard_batch`, the artifact's layout, padding and packed
  position ids included), takes its tokens' loss over the global label count and, after
  the backward, sums the gradients over cp (:func:`sync_gradients`, what FSDP2 over
  ``dp x cp`` does); the loss value is the sum of the ranks' shares, and
  :func:`whole_logits` puts the logits back in the batch's order.

Labels are aligned per position (``labels[:, t]`` is the target of ``logits[:, t]``), with
``-100`` where no loss is taken. Logits of a half-precision model are taken in float32.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hpcodegen.parity.gather import full_logits, output_module_fqn
from hpcodegen.plan.types import Plan

#: the batch fields :func:`hpcodegen.runtime.cp.shard_batch` cuts per rank
CP_FIELDS = ("input_ids", "attention_mask", "position_ids")


@dataclass
class Forward:
    """What one forward gave.

    Attributes:
        loss: the tensor to back-propagate (this rank's share under cp).
        value: the loss of the whole batch (a detached scalar).
        logits: the model's logits as returned (tp- and cp-local when sharded).
        batch: the cp batch (None without context parallelism).
    """

    loss: Any
    value: Any
    logits: Any
    batch: Any = None


def cp_active(active: Any) -> bool:
    """The active mesh has a cp axis: the batch is cut per rank."""
    return active is not None and "cp" in getattr(active, "axes", ())


def model_inputs(model: Any, inputs: Mapping[str, Any], active: Any,
                 labels: Any = None) -> tuple[dict[str, Any], Any]:
    """``(kwargs for model(...), cp batch or None)`` for the full batch ``inputs``."""
    if not cp_active(active):
        return dict(inputs), None
    from hpcodegen.runtime.cp import shard_batch

    batch = shard_batch(model, shift_labels=labels,
                        **{k: inputs[k] for k in CP_FIELDS if inputs.get(k) is not None})
    rest = {k: v for k, v in inputs.items() if k not in CP_FIELDS}
    return {**batch.inputs, **rest}, batch


def forward_loss(model: Any, inputs: Mapping[str, Any], labels: Any, plan: Plan,
                 active: Any | None, vocab: int | None = None) -> Forward:
    """The loss of ``model(**inputs)`` against ``labels`` by the rule above."""
    kwargs, batch = model_inputs(model, inputs, active, labels)
    logits = model(**kwargs).logits
    if batch is not None:
        if loss_parallel_head(model, plan, active):
            loss = batch.loss(logits, vocab_group=active.tp_group(), vocab_size=vocab)
        else:
            loss = batch.loss(full_logits(logits, model, plan, active))
        return Forward(loss, batch.total(loss).detach(), logits, batch)
    loss = loss_of_logits(logits, labels, model, plan, active, vocab)[0]
    return Forward(loss, loss.detach(), logits)


def loss_of_logits(logits: Any, labels: Any, model: Any, plan: Plan,
                   active: Any | None, vocab: int | None = None) -> tuple[Any, Any]:
    """``(loss, logits it was taken on)`` for logits already computed, without cp."""
    import torch
    import torch.nn.functional as F

    if loss_parallel_head(model, plan, active):
        from hpcodegen.runtime.loss import vocab_parallel_cross_entropy

        return vocab_parallel_cross_entropy(logits, labels, active.tp_group(),
                                            vocab_size=vocab), logits
    if active is not None:
        logits = full_logits(logits, model, plan, active)
    flat = logits.reshape(-1, logits.shape[-1])  # (batch, [codebooks,] seq) rows
    flat = flat if flat.dtype == torch.float64 else flat.float()
    return F.cross_entropy(flat, labels.flatten()), logits


def loss_parallel_head(model: Any, plan: Plan, active: Any | None) -> bool:
    """The sharded model's output head leaves its logits vocab-sharded for the loss (the
    one test: the pipeline's last stage asks it too). Not on a mesh with no plan axis (a
    loss-parallel artifact on one rank: nothing was installed, the logits are whole)."""
    return (active is not None and not active.degenerate
            and output_module_fqn(model) in plan.vocab_sharded_heads())


def whole_logits(fwd: Forward, model: Any, plan: Plan, active: Any) -> Any:
    """The full ``[B, S, V]`` logits of a forward, in the batch's order (for comparing)."""
    logits = fwd.logits.detach()
    if active is not None:
        logits = full_logits(logits, model, plan, active)
    return fwd.batch.gather(logits) if fwd.batch is not None else logits


def sync_gradients(model: Any, active: Any) -> None:
    """Sum every gradient over cp (each rank's holds its tokens' share); no-op without cp."""
    if cp_active(active):
        from hpcodegen.runtime.cp import all_reduce_gradients

        all_reduce_gradients(model, [active.cp_group()])


__all__ = ["Forward", "cp_active", "forward_loss", "loss_of_logits", "loss_parallel_head",
           "model_inputs", "sync_gradients", "whole_logits"]
