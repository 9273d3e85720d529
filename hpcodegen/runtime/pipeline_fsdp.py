"""FSDP2 over the data-parallel ranks of a pipeline stage, exact (torch).

A ``pp x dp x tp`` mesh: the ``dp`` ranks of a stage hold the same stage, each fed its own
rows of the global batch. :func:`shard_stage` ``fully_shard``\\ s each unit the stage owns
(a layer, the embedding, the final norm, the head) over ``mesh["dp"]`` and then the stage
module itself (FSDP's root: torch's pipelining runtime recognises an FSDP stage by it).

Why it is exact:

* gradient reduction over dp happens **once per step**, after the stage's last microbatch:
  the runtime turns gradient sync off for every microbatch's backward (gradients accumulate
  unsharded) and runs FSDP's post-backward (the reduce-scatter) at a ``REDUCE_GRAD``
  action, which :func:`with_fsdp_actions` adds to the frozen list after the stage's last
  backward, with an ``UNSHARD`` before its first action and a ``RESHARD`` after;
* the reduction **sums** (gradient divide factor 1): each microbatch's loss is already its
  token-loss sum over the global count of valid labels (the whole batch, every dp rank),
  so the dp sum of the per-rank gradients is the unsharded mean loss's gradient.

The frozen list itself is unchanged (verify checks it); the FSDP actions are added on the
rank, not frozen, as they depend only on the list and which stages are sharded.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from torch import nn


def shard_stage(stage: nn.Module, units: Iterable[nn.Module], dp_mesh: Any) -> None:
    """``fully_shard`` each owned unit over ``dp_mesh``, then ``stage`` as the root; the
    gradient reduction sums over dp (see the module docstring)."""
    from torch.distributed.fsdp import fully_shard

    for module in (*units, stage):
        fully_shard(module, mesh=dp_mesh)
        # a plain SUM reduce-scatter (no divide; PREMUL_SUM, which a factor alone picks,
        # is NCCL-only); set per FSDP module: the setting does not recurse
        module.set_gradient_divide_factor(1.0)  # type: ignore[operator]
        module.set_force_sum_reduction_for_comms(True)  # type: ignore[operator]


def with_fsdp_actions(actions: list[Any], n_microbatches: int) -> list[Any]:
    """One rank's frozen action list with FSDP's ``UNSHARD`` (before each stage's first
    action), ``REDUCE_GRAD`` (after its last backward) and ``RESHARD`` (right after)."""
    from torch.distributed.pipelining.schedules import (
        REDUCE_GRAD,
        RESHARD,
        UNSHARD,
        _Action,
        _add_reduce_grad,
    )

    stages = list(dict.fromkeys(a.stage_index for a in actions))
    out: list[Any] = [_Action(s, UNSHARD, None) for s in stages]
    for action in _add_reduce_grad(actions, n_microbatches):
        out.append(action)
        if action is not None and action.computation_type == REDUCE_GRAD:
            out.append(_Action(action.stage_index, RESHARD, None))
    return out


def dp_rows(rows: int, dp_size: int, dp_rank: int) -> slice:
    """The rows of a ``rows``-row global batch that data-parallel rank ``dp_rank`` runs:
    every ``dp_size``-th from ``dp_rank`` (a batch of a few rows repeated, as launch's
    smoke batch is, still gives each dp rank different rows)."""
    if rows % dp_size:
        raise ValueError(f"{rows} rows do not split over dp={dp_size}")
    return slice(dp_rank, None, dp_size)


@contextmanager
def count_reduce_scatters() -> Iterator[Counter]:
    """``with count_reduce_scatters() as seen:`` ``seen["reduce_scatter"]``: FSDP's gradient
    reduce-scatters posted inside (one per sharded unit per step when the reduction waits
    for the last microbatch; one per microbatch and unit if it did not)."""
    import torch.distributed as dist

    seen: Counter = Counter()
    real = dist.reduce_scatter_single

    def counting(*args: Any, **kwargs: Any) -> Any:
        seen["reduce_scatter"] += 1
        return real(*args, **kwargs)

    dist.reduce_scatter_single = counting
    try:
        yield seen
    finally:
        dist.reduce_scatter_single = real
