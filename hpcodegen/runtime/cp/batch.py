"""The data side of context parallelism: shard a batch for this rank, put outputs back, loss.

Every cp rank reads the same full batch and keeps its positions of the sequence (the
artifact's frozen layout, :func:`hpcodegen.plan.cp.rank_positions`)::

    from hpcodegen.runtime.cp import shard_batch

    batch = shard_batch(model, input_ids, labels=input_ids, attention_mask=mask)
    logits = model(**batch.inputs).logits            # this rank's tokens only
    loss = batch.loss(logits)                        # exact: global token count
    loss.backward()                                  # then sum gradients over dp x cp
    full = batch.gather(logits.detach())             # [B, S, V] in the original order

What :func:`shard_batch` does, on the full ``[B, S]`` batch:

1. labels: transformers' convention (``labels`` like ``input_ids``; the model would shift
   them) are shifted once on the whole sequence (position ``i`` predicts token ``i + 1``, the
   last ``ignore_index``); ``shift_labels`` are taken as already aligned per position.
2. padding to the layout's multiple (``2 cp`` chunks head-tail, ``cp`` contiguous, times tp
   under sequence parallelism): tokens appended at the end, which a causal model's real
   tokens never see (their position ids restart at 0, a document of their own, unless the
   batch has a mask); a bidirectional model gets them masked out (an ``attention_mask``
   with zeros there); their labels are ``ignore_index`` and :meth:`CPBatch.gather` drops
   them.
3. position ids: given ones are kept (packed documents restart them); absent, they are the
   tokens' global positions 0..S-1, passed explicitly (transformers' default; a model that
   derives its own from the padding mask, such as OPT, gets these unless you pass yours).
4. every per-token tensor is indexed by this rank's positions.

The model's root forward gathers the small per-token inputs (position ids or the padding
mask) over cp to build each mask row at global positions (:mod:`.context`).

**The loss** (:meth:`CPBatch.loss`) is the sum of this rank's token losses divided by the
number of valid labels of the whole batch: counted over cp, and over ``dp_group`` when the
data-parallel ranks hold different batches. Summing the gradients over those ranks (FSDP2
over ``dp x cp`` with its gradient divide factor set to 1, or
:func:`all_reduce_gradients`) then gives exactly the unsharded mean's gradient; a per-rank
mean would weigh ranks with fewer valid labels too much.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from hpcodegen.runtime.collectives.ops import gather
from hpcodegen.runtime.cp.context import cp_state
from hpcodegen.runtime.cp.state import CPState


@dataclass
class CPBatch:
    """One rank's share of a batch (see the module docstring).

    Attributes:
        inputs: keyword arguments for ``model(**inputs)``: this rank's ``input_ids`` (or
            ``inputs_embeds``), ``position_ids`` and ``attention_mask`` (when given).
        labels: this rank's pre-shifted labels (None without labels).
        seq: the batch's sequence length before padding.
        state: the model's cp state (None: the model runs without cp, nothing is sharded).
    """

    inputs: dict[str, torch.Tensor]
    labels: torch.Tensor | None
    seq: int
    state: CPState | None = None
    ignore_index: int = -100
    _order: torch.Tensor | None = field(default=None, repr=False)

    def gather(self, local: torch.Tensor) -> torch.Tensor:
        """Per-token outputs ``[B, S_local, ...]`` of every cp rank -> ``[B, S, ...]`` in the
        batch's original order, padding dropped (differentiable: the backward is this
        rank's slice)."""
        if self.state is None:
            return local[:, : self.seq]
        full = gather(local, 1, self.state.comm)
        return full.index_select(1, self._order)[:, : self.seq]

    def valid_labels(self, dp_group: Any = None) -> torch.Tensor:
        """How many labels of the whole batch count (over cp, and ``dp_group``)."""
        if self.labels is None:
            raise ValueError("this batch has no labels")
        count = (self.labels != self.ignore_index).sum().to(torch.float64)
        for group in self._groups(dp_group):
            dist.all_reduce(count, group=group)
        return count

    def loss(self, logits: torch.Tensor, *, vocab_group: Any = None,
             vocab_size: int | None = None, dp_group: Any = None) -> torch.Tensor:
        """Cross entropy of this rank's tokens, summed and divided by the global count of
        valid labels (:meth:`valid_labels`).

        Args:
            logits: this rank's ``[B, S_local, V]`` logits, or their vocabulary slice under
                loss parallelism (then pass ``vocab_group``, the tp group, and
                ``vocab_size``).
            dp_group: the data-parallel group when its ranks hold different batches.
        """
        if self.labels is None:
            raise ValueError("this batch has no labels")
        if vocab_group is not None:
            from hpcodegen.runtime.loss import vocab_parallel_token_losses

            total = vocab_parallel_token_losses(logits, self.labels, vocab_group,
                                                vocab_size=vocab_size,
                                                ignore_index=self.ignore_index).sum()
        else:
            flat = logits.flatten(0, 1)  # at least float32 (a float64 model keeps its own)
            flat = flat.to(torch.promote_types(flat.dtype, torch.float32))
            total = F.cross_entropy(flat, self.labels.flatten(), ignore_index=self.ignore_index,
                                    reduction="sum")
        count = self.valid_labels(dp_group).to(total.dtype)
        return total / count.clamp(min=1)

    def total(self, value: torch.Tensor, dp_group: Any = None) -> torch.Tensor:
        """The sum over cp (and ``dp_group``) of a per-rank share, e.g. :meth:`loss` for
        logging (detached: no gradient flows through it)."""
        value = value.detach().clone()
        for group in self._groups(dp_group):
            dist.all_reduce(value, group=group)
        return value

    def _groups(self, dp_group: Any) -> list[Any]:
        groups = [self.state.comm.group] if self.state is not None else []
        return groups + ([dp_group] if dp_group is not None else [])


def _shift(labels: torch.Tensor, ignore_index: int) -> torch.Tensor:
    tail = torch.full_like(labels[:, :1], ignore_index)
    return torch.cat([labels[:, 1:], tail], dim=1)


def _pad(x: torch.Tensor | None, pad: int, value: Any) -> torch.Tensor | None:
    if x is None or pad == 0:
        return x
    shape = (x.shape[0], pad, *x.shape[2:])
    return torch.cat([x, torch.full(shape, value, dtype=x.dtype, device=x.device)], dim=1)


def _pad_positions(positions: torch.Tensor, pad: int, restart: bool) -> torch.Tensor:
    if pad == 0:
        return positions
    tail = torch.arange(pad, device=positions.device).expand(positions.shape[0], -1)
    if not restart:
        tail = tail + positions[:, -1:] + 1
    return torch.cat([positions, tail.to(positions.dtype)], dim=1)


def shard_batch(model: nn.Module, input_ids: torch.Tensor | None = None, *,
                labels: torch.Tensor | None = None, shift_labels: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None,
                inputs_embeds: torch.Tensor | None = None, pad_token_id: int = 0,
                ignore_index: int = -100) -> CPBatch:
    """This rank's share of a full ``[B, S]`` batch (see the module docstring).

    Args:
        model: the parallelized model (its cp state says the layout and this rank).
        input_ids / inputs_embeds: the full batch's tokens (one of them).
        labels: targets in transformers' convention (like ``input_ids``), shifted here.
        shift_labels: targets already aligned per position (instead of ``labels``).
        attention_mask: ``[B, S]`` padding mask (1 = token).
        position_ids: ``[B, S]`` (or ``[1, S]``) position ids; packed documents restart them.

    Returns:
        A :class:`CPBatch`.

    Example::

        batch = shard_batch(model, ids, labels=ids)
        loss = batch.loss(model(**batch.inputs).logits)
    """
    tokens = input_ids if input_ids is not None else inputs_embeds
    if tokens is None or tokens.dim() < 2:
        raise ValueError("shard_batch needs input_ids or inputs_embeds of shape [B, S, ...]")
    if labels is not None and shift_labels is not None:
        raise ValueError("pass labels or shift_labels, not both")
    batch, seq = tokens.shape[:2]
    target = _shift(labels, ignore_index) if labels is not None else shift_labels
    state = cp_state(model)
    if state is None:
        inputs = {k: v for k, v in (("input_ids", input_ids), ("inputs_embeds", inputs_embeds),
                                    ("attention_mask", attention_mask),
                                    ("position_ids", position_ids)) if v is not None}
        return CPBatch(inputs, target, seq, None, ignore_index)
    pad = (-seq) % state.multiple
    if pad and attention_mask is None and not state.causal:
        attention_mask = torch.ones(tokens.shape[:2], dtype=torch.long, device=tokens.device)
    if position_ids is None:
        position_ids = torch.arange(seq, device=tokens.device).expand(batch, -1)
    position_ids = _pad_positions(position_ids.expand(batch, -1), pad,
                                  restart=attention_mask is None)
    padded = {"input_ids": _pad(input_ids, pad, pad_token_id),
              "inputs_embeds": _pad(inputs_embeds, pad, 0),
              "attention_mask": _pad(attention_mask, pad, 0),
              "position_ids": position_ids}
    target = _pad(target, pad, ignore_index)
    q_index, _ = state.indices(seq + pad, tokens.device)
    inputs = {k: v.index_select(1, q_index) for k, v in padded.items() if v is not None}
    local = target.index_select(1, q_index) if target is not None else None
    return CPBatch(inputs, local, seq, state, ignore_index,
                   state.restore_order(seq + pad, tokens.device))


def all_reduce_gradients(model: nn.Module, groups: Iterable[Any]) -> None:
    """Sum every gradient over each group (what FSDP2 or DDP over ``dp x cp`` does with a
    divide factor of 1), for scripts that do not wrap the model: each cp rank's gradient
    holds its own tokens' share of :meth:`CPBatch.loss`."""
    from hpcodegen.runtime.shards import local_grad

    groups = [g for g in groups if g is not None]
    for param in model.parameters():
        grad = local_grad(param)  # a DTensor gradient's local shard, summed in place
        if grad is not None:
            for group in groups:
                dist.all_reduce(grad, group=group)


__all__ = ["CPBatch", "all_reduce_gradients", "shard_batch"]
