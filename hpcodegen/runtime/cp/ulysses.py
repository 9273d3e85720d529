"""Ulysses context parallelism: trade a sequence shard of Q, K, V for a head shard of the
whole sequence, attend, trade the output back (all_to_all both ways; :mod:`hpcodegen.plan.cp`
declares it as ``cp: S(2) -> S(1)`` on the kernel's ``[batch, heads, seq, head_dim]``).

Within a Ulysses group of ``U`` cp ranks (all of cp for ``ulysses``, ``ulysses_degree``
consecutive ranks for the hybrid) rank ``j`` keeps heads ``j H/U .. (j+1) H/U`` of every
rank's tokens, concatenated in rank order: exactly the rows the mask function builds
(:func:`hpcodegen.plan.cp.query_order`). Key/value heads that do not divide over ``U`` but
divide it are repeated first (``repeat_interleave``: each rank receives the copy of the kv
head its query heads use; the gradient of the copies sums back), so the kernel sees
``H_q/U`` query heads over ``H_kv r/U`` kv heads and the module's own
``num_key_value_groups`` no longer holds: the kernel gets a view of the module with the
local ratio (and, for a model with attention sinks, this rank's sinks). Anything else is
refused naming the heads (:func:`hpcodegen.plan.cp.heads_problem`).

Every exchange is ``all_to_all_single`` with autograd (its backward is the reverse exchange).
"""

from __future__ import annotations

from typing import Any

import torch

from hpcodegen.errors import PlanError, error
from hpcodegen.plan.cp import heads_problem, kv_replicas
from hpcodegen.runtime.collectives.comm import Comm


def _a2a(x: torch.Tensor, comm: Comm) -> torch.Tensor:
    """Equal-split ``all_to_all_single`` on dim 0, differentiable."""
    from torch.distributed._functional_collectives import all_to_all_single_autograd, wait_tensor

    group, _, _ = comm.traced()
    return wait_tensor(all_to_all_single_autograd(x.contiguous(), None, None, group))


def seq_to_heads(x: torch.Tensor, comm: Comm, degree: int) -> torch.Tensor:
    """``[B, H, s, D]`` (this rank's tokens, all heads) -> ``[B, H/U, U s, D]`` (its head
    shard of the group's tokens, rank order)."""
    b, h, s, d = x.shape
    parts = x.reshape(b, degree, h // degree, s, d).permute(1, 0, 2, 3, 4)
    got = _a2a(parts, comm)  # [U (source rank), B, H/U, s, D]
    return got.permute(1, 2, 0, 3, 4).reshape(b, h // degree, degree * s, d)


def heads_to_seq(x: torch.Tensor, comm: Comm, degree: int) -> torch.Tensor:
    """``[B, U s, H/U, D]`` (the kernel's output on this rank's heads) -> ``[B, s, H, D]``."""
    b, n, h, d = x.shape
    parts = x.reshape(b, degree, n // degree, h, d).permute(1, 0, 2, 3, 4)
    got = _a2a(parts, comm)  # [U (source rank: its heads), B, s, H/U, D]
    return got.permute(1, 2, 0, 3, 4).reshape(b, n // degree, degree * h, d)


class HeadShard:
    """The attention module as the kernel sees it on a head shard: every attribute the
    module's, but ``num_key_value_groups`` the local ratio and ``sinks`` this rank's."""

    def __init__(self, module: Any, groups: int, sinks: torch.Tensor | None) -> None:
        object.__setattr__(self, "_module", module)
        object.__setattr__(self, "num_key_value_groups", groups)
        if sinks is not None:
            object.__setattr__(self, "sinks", sinks)

    def __getattr__(self, name: str) -> Any:
        return getattr(object.__getattribute__(self, "_module"), name)


class UlyssesExchange:
    """One CP attention's Ulysses exchange over its group (``comm``, ``degree`` ranks, this
    rank ``index`` in it)."""

    def __init__(self, comm: Comm, degree: int, index: int, tp: int = 1) -> None:
        self.comm = comm
        self.degree = degree
        self.index = index
        self.tp = tp

    def _check(self, module: Any, q_heads: int, kv_heads: int) -> int:
        why = heads_problem(q_heads * self.tp, kv_heads * self.tp, self.tp, self.degree)
        if why is not None:
            raise PlanError([error(
                "runtime.cp_ulysses_heads", type(module).__name__,
                f"Ulysses over {self.degree} cp ranks: {why} ({q_heads} query / {kv_heads} kv "
                "heads reach this rank's kernel)",
                hint="generate with --cp-method allgather, or a --ulysses degree the heads "
                     "allow")])
        return kv_replicas(kv_heads, self.degree)

    def to_heads(self, module: Any, query: torch.Tensor, key: torch.Tensor,
                 value: torch.Tensor) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The kernel's view of the module and Q, K, V on this rank's head shard."""
        q_heads, kv_heads = query.shape[1], key.shape[1]
        replicas = self._check(module, q_heads, kv_heads)
        if replicas > 1:
            key = key.repeat_interleave(replicas, dim=1)
            value = value.repeat_interleave(replicas, dim=1)
        query = seq_to_heads(query, self.comm, self.degree)
        key = seq_to_heads(key, self.comm, self.degree)
        value = seq_to_heads(value, self.comm, self.degree)
        local_q = q_heads // self.degree
        sinks = getattr(module, "sinks", None)
        if isinstance(sinks, torch.Tensor) and sinks.dim() >= 1 and sinks.shape[0] == q_heads:
            sinks = sinks[self.index * local_q:(self.index + 1) * local_q]
        else:
            sinks = None
        return HeadShard(module, local_q // key.shape[1], sinks), query, key, value

    def to_sequence(self, output: torch.Tensor) -> torch.Tensor:
        """The kernel's ``[B, U s, H/U, D]`` output back to ``[B, s, H, D]``."""
        return heads_to_seq(output, self.comm, self.degree)


def ulysses_groups(group: Any, degree: int) -> tuple[Any, Any, int]:
    """``(Ulysses group, all-gather group, index in the Ulysses group)`` of this rank for a
    hybrid cut of the cp ``group``: consecutive ``degree`` cp ranks exchange heads, the ranks
    at the same index of every Ulysses group gather K/V. Only members create each group
    (``use_local_synchronization``), so meshes with several cp groups need no global order.
    """
    import torch.distributed as dist

    ranks = dist.get_process_group_ranks(group)
    me = dist.get_rank(group)
    first = me // degree * degree
    a2a = dist.new_group(ranks[first:first + degree], use_local_synchronization=True)
    index = me % degree
    gather = dist.new_group(ranks[index::degree], use_local_synchronization=True)
    return a2a, gather, index


__all__ = ["HeadShard", "UlyssesExchange", "heads_to_seq", "seq_to_heads", "ulysses_groups"]
