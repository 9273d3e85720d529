"""The per-model context-parallel state: the cp group, the layout, this forward's batch view.

One :class:`CPState` per parallelized model (``model._hp_cp_state``). The model's root
forward fills :attr:`CPState.batch` (:mod:`.context`) before transformers builds its masks;
the mask interface (:mod:`.attention`) reads it. Everything a rank needs to put its queries
and the gathered keys at their global positions is here:

* ``q_index``: the global position of each local token (``[S_local]``);
* ``kv_index``: the global position of each row of a cp all_gather (``[S]``, rank 0's
  tokens first), so K and V stay in gathered order and the mask columns follow them;
* ``rows``: the global position of each query row the kernel attends: ``q_index`` for the
  all-gather; after a Ulysses exchange the tokens of the rank's Ulysses group, in rank
  order (``[U S_local]``): the mask rows follow them;
* ``positions`` / ``documents`` / ``valid``: the batch's global position ids, packed
  document ids and padding flags, in original order ``[B, S]`` (None when not needed).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from hpcodegen.plan.cp import gathered_order, layout_chunks, query_order, rank_positions
from hpcodegen.runtime.collectives.comm import Comm


@dataclass
class BatchView:
    """What one forward's masks need, at global positions (see the module docstring)."""

    q_index: torch.Tensor
    kv_index: torch.Tensor
    #: None: ``q_index`` (the all-gather's rows)
    rows: torch.Tensor | None = None
    positions: torch.Tensor | None = None
    documents: torch.Tensor | None = None
    valid: torch.Tensor | None = None
    #: position ids were given but not ``[batch, seq]`` (multi-section rotary ids): packed
    #: documents cannot be found on the whole sequence
    unreadable_positions: bool = False

    def __post_init__(self) -> None:
        if self.rows is None:
            self.rows = self.q_index


@dataclass
class CPState:
    """The context-parallel execution state of one model.

    Attributes:
        comm: the cp group (:class:`~hpcodegen.runtime.collectives.comm.Comm`).
        size / rank: cp size and this rank's index on it.
        layout: ``contiguous`` or ``headtail`` (``parallel_dims.cp_layout``).
        seq_multiple: the local sequence must divide by this (tp under sequence parallelism).
        name: the attention-implementation name registered for this model.
        ulysses: cp ranks per Ulysses all-to-all (1: all-gather K/V only; ``size``: Ulysses;
            between: the hybrid, whose all-gather runs across the Ulysses groups).
    """

    comm: Comm
    size: int
    rank: int
    layout: str
    seq_multiple: int = 1
    ulysses: int = 1
    name: str = ""
    batch: BatchView | None = None
    #: the K/V gather over cp, or across the hybrid's Ulysses groups; None: pure Ulysses
    #: (:func:`hpcodegen.runtime.cp.attention.kv_gather`)
    kv: Any = None
    #: the Ulysses group's :class:`~hpcodegen.runtime.collectives.comm.Comm` (None: no
    #: all-to-all) and this rank's index in it
    a2a: Any = None
    a2a_rank: int = 0
    #: transformers asked for packed-document detection in the mask being built
    packed_requested: bool = False
    #: every cp attention of the model is causal (a query never sees later keys)
    causal: bool = True
    _index: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = field(
        default_factory=dict, repr=False)

    @property
    def multiple(self) -> int:
        """The global sequence length must divide by this (chunks x sequence parallel)."""
        return layout_chunks(self.layout, self.size) * self.seq_multiple

    def indices(self, seq: int, device: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """``(q_index [S_local], kv_index [S])`` for a global length ``seq`` (cached)."""
        return self._indices(seq, device)[:2]

    def query_rows(self, seq: int, device: Any) -> torch.Tensor:
        """The global position of each query row the kernel attends (``rows``)."""
        return self._indices(seq, device)[2]

    def _indices(self, seq: int, device: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        key = (seq, str(device))
        hit = self._index.get(key)
        if hit is None:
            def tensor(values: list[int]) -> torch.Tensor:
                return torch.tensor(values, dtype=torch.long, device=device)
            q = tensor(rank_positions(seq, self.size, self.rank, self.layout))
            kv = tensor(gathered_order(seq, self.size, self.layout))
            rows = q if self.ulysses <= 1 else tensor(
                query_order(seq, self.size, self.rank, self.layout, self.ulysses))
            hit = self._index[key] = (q, kv, rows)
        return hit

    def restore_order(self, seq: int, device: Any) -> torch.Tensor:
        """Index that puts gathered rows back in original order: ``gathered[:, order]``."""
        _, kv = self.indices(seq, device)
        return torch.argsort(kv)


__all__ = ["BatchView", "CPState"]
