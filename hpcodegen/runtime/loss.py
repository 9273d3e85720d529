"""Cross entropy on vocab-sharded logits (loss parallelism): no gather of the logits.

An artifact generated with ``--loss-parallel`` leaves the LM head's output as this rank's
slice of the vocabulary (``S(-1)`` on tp). :func:`vocab_parallel_cross_entropy` computes
``F.cross_entropy`` of the full logits from the slices, as torch's ``loss_parallel`` does,
with three all_reduces of ``(tokens,)`` fp32 values instead of an all_gather of
``(tokens, vocab)``:

1. the row maximum (``MAX``; a constant shift, so no gradient flows through it),
2. the sum of ``exp(logit - max)`` over the vocabulary (``SUM``),
3. the target's shifted logit, which only the rank holding the target row contributes.

``loss = log(sum) - target`` per token, then the mean over tokens whose label is not
``ignore_index``. The two sums use :func:`hpcodegen.runtime.collectives.ops.reduce`, whose
backward is the identity (DTensor's ``Partial -> Replicate``), so autograd gives each rank
``softmax - one_hot`` on its own slice: the gradient of the unsharded loss, sharded. The
loss is a plain replicated tensor: call ``loss.backward()`` anywhere (torch's
``loss_parallel`` needs the backward inside its context manager and DTensor inputs).

In a user script (``hpcodegen launch ARTIFACT -- train.py``)::

    logits = model(input_ids=ids).logits            # (batch, seq, vocab / tp)
    loss = vocab_parallel_cross_entropy(logits, labels, mesh["tp"].get_group(),
                                        vocab_size=config.vocab_size)
    loss.backward()

Do not pass ``labels=`` to the model: transformers' own loss would treat the slice as the
whole vocabulary.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from hpcodegen.runtime.collectives.comm import Comm
from hpcodegen.runtime.collectives.local import compiling
from hpcodegen.runtime.collectives.ops import reduce


def _all_reduce_max(x: torch.Tensor, comm: Comm) -> torch.Tensor:
    if compiling():
        group, _, _ = comm.traced()
        return torch.distributed._functional_collectives.all_reduce(x, "max", group)
    out = x.clone(memory_format=torch.contiguous_format)
    opts = dist.distributed_c10d.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.MAX
    comm.resolve().allreduce([out], opts).wait()
    return out


def vocab_parallel_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, group: Any = None,
                                 *, vocab_size: int | None = None,
                                 ignore_index: int = -100) -> torch.Tensor:
    """Mean cross entropy of the full logits from this rank's vocabulary slice.

    Args:
        logits: ``(..., local_vocab)``, this rank's slice (``torch.chunk`` order, as
            DTensor's ``Shard(-1)``); a DTensor is taken as its local shard.
        labels: ``(...)`` global token ids (``ignore_index`` entries are left out).
        group: the tp process group (None: the default group).
        vocab_size: the full vocabulary; needed when it does not divide by the group size
            (the slices are then uneven), else taken as ``local_vocab * group size``.
        ignore_index: label value that contributes nothing.

    Returns:
        The scalar mean loss (fp32), equal on every rank.
    """
    losses = vocab_parallel_token_losses(logits, labels, group, vocab_size=vocab_size,
                                         ignore_index=ignore_index)
    return losses.sum() / (labels.flatten() != ignore_index).sum()


def vocab_parallel_token_losses(logits: torch.Tensor, labels: torch.Tensor, group: Any = None,
                                *, vocab_size: int | None = None,
                                ignore_index: int = -100) -> torch.Tensor:
    """Per-token cross entropy (flattened, 0 where the label is ``ignore_index``) of the
    full logits from this rank's vocabulary slice; arguments as
    :func:`vocab_parallel_cross_entropy`, which is their mean over the kept labels."""
    if hasattr(logits, "to_local") and hasattr(logits, "placements"):
        logits = logits.to_local()
    comm = Comm(group)
    n, rank = comm.size_rank()
    local = logits.float().flatten(0, -2)
    target = labels.flatten()
    rows = local.shape[-1]
    chunk = -(-vocab_size // n) if vocab_size else rows
    start = rank * chunk
    shift = _all_reduce_max(local.detach().amax(-1), comm)
    z = local - shift.unsqueeze(-1)
    sum_exp = reduce(z.exp().sum(-1), comm)
    in_slice = (target >= start) & (target < start + rows)
    index = (target - start).clamp(0, max(rows - 1, 0)).unsqueeze(-1)
    mine = z.gather(-1, index).squeeze(-1) * in_slice
    target_z = reduce(mine, comm)
    losses = sum_exp.log() - target_z
    return losses * (target != ignore_index)
