"""One forward and loss of the smoke job, on the unsharded or the parallelized model.

The sharded model takes the loss its plan calls for: on the full logits (gathered per the
LM head's planned placement) or, for a loss-parallel head
(:meth:`~hpcodegen.plan.types.Plan.vocab_sharded_heads`), on the vocab-sharded logits themselves
(:func:`~hpcodegen.runtime.loss.vocab_parallel_cross_entropy`, no gather). Under context
parallelism each rank feeds its positions of the batch (:func:`hpcodegen.runtime.cp.shard_batch`,
the artifact's layout), takes its tokens' loss over the global label count and, after the
backward, sums the gradients over cp (what FSDP2 over ``dp x cp`` does); the loss shown is
the sum of the ranks' shares, and the logits compared are put back in the original order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpcodegen.hf import no_cache_kwargs
from hpcodegen.parity.gather import full_logits, output_module_fqn
from hpcodegen.plan.types import Plan


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


def _cp_active(active: Any) -> bool:
    return active is not None and "cp" in getattr(active, "axes", ())


def model_inputs(model: Any, ids: Any, active: Any) -> tuple[dict[str, Any], Any]:
    """``(kwargs for model(...), cp batch or None)`` for the batch ``ids``."""
    if not _cp_active(active):
        return {"input_ids": ids, **no_cache_kwargs(model)}, None
    from hpcodegen.runtime.cp import shard_batch

    batch = shard_batch(model, ids)
    return batch.inputs, batch


def forward_loss(model: Any, ids: Any, labels: Any, plan: Plan, active: Any,
                 vocab: int | None = None) -> Forward:
    """Cross entropy of ``labels`` (aligned per position) on ``model``'s logits of ``ids``;
    ``active`` None for the unsharded reference; ``vocab`` the head's full width."""
    if not _cp_active(active):
        logits = model(input_ids=ids, **no_cache_kwargs(model)).logits
        loss = _plain_loss(logits, labels, model, plan, active, vocab)
        return Forward(loss, loss.detach(), logits)
    from hpcodegen.runtime.cp import shard_batch

    batch = shard_batch(model, ids, shift_labels=labels)
    logits = model(**batch.inputs).logits
    if output_module_fqn(model) in plan.vocab_sharded_heads():
        loss = batch.loss(logits, vocab_group=active.tp_group(), vocab_size=vocab)
    else:
        loss = batch.loss(full_logits(logits, model, plan, active))
    return Forward(loss, batch.total(loss), logits, batch)


def _plain_loss(logits: Any, labels: Any, model: Any, plan: Plan, active: Any,
                vocab: int | None) -> Any:
    """The parity harness's loss rule (:func:`hpcodegen.parity.harness.loss_of_logits`)."""
    from hpcodegen.parity.harness import loss_of_logits

    return loss_of_logits(logits, labels, model, plan, active, vocab)[0]


def whole_logits(fwd: Forward, model: Any, plan: Plan, active: Any) -> Any:
    """The full ``[B, S, V]`` logits of a forward, in the batch's order (for comparing)."""
    logits = full_logits(fwd.logits.detach(), model, plan, active)
    return fwd.batch.gather(logits) if fwd.batch is not None else logits


def sync_gradients(model: Any, active: Any) -> None:
    """Sum every gradient over cp (each rank's holds its tokens' share); no-op without cp."""
    if _cp_active(active):
        from hpcodegen.runtime.cp import all_reduce_gradients

        all_reduce_gradients(model, [active.cp_group()])


__all__ = ["Forward", "forward_loss", "model_inputs", "sync_gradients", "whole_logits"]
