"""Context parallelism in a frozen plan: the cp axis, its layout, the attention K/V (pure).

The existing system's convention, kept: the plan's axes are ``["cp", "tp"]``; every
activation at every boundary is ``cp: S(1)`` on both sides (the sequence stays cut over cp
between modules: identity on cp), every parameter ``cp: R``; and each attention module
carries an ``inner_wrapper`` injection whose callable all-gathers K and V over cp. What
hpcodegen adds, so verify and inspect-plan can see and count that one transition:

* ``parallel_dims.cp_layout``: which positions a cp rank holds. ``contiguous`` (rank ``r``
  holds chunk ``r`` of ``cp``; what a meta without the key means, the existing system's
  layout) or ``headtail`` (the sequence is cut into ``2 cp`` chunks and rank ``r`` holds
  chunks ``r`` and ``2 cp - 1 - r``: every rank gets as many causal score entries,
  torchtitan's load-balanced sharding). Every tool reads the layout from here.
* on the attention's injection record, ``inner_in_src`` / ``inner_in_dst``: the K/V
  transition inside the wrapped attention, in the plan vocabulary, over the attention
  interface's ``[batch, kv_heads, seq, head_dim]`` tensors: ``{"key": {"cp": "S(2)"},
  "value": {"cp": "S(2)"}}`` -> ``{"key": {"cp": "R"}, ...}``. Forward an all_gather on cp
  (at the kv-head count), backward the gradient arrives partial over cp (each rank's queries
  saw every key) and is reduce-scattered back (:func:`kv_backward_steps`).

A foreign meta naming the existing system's all-gather wrapper (``sdpa_qkv``, ...) declares
no ``inner_in_*``: its K/V transition is the same one and is read as such
(:func:`kv_transitions`), so its collectives are predicted too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hpcodegen.placement import REPLICATE, Partial, Placement, Shard
from hpcodegen.plan.entry import axis_sizes
from hpcodegen.plan.frozen import EMPTY
from hpcodegen.plan.moe import target_name
from hpcodegen.plan.steps import Step, redistribute_steps
from hpcodegen.plan.types import Injection, Plan

CP = "cp"
CONTIGUOUS = "contiguous"
HEADTAIL = "headtail"
LAYOUTS: tuple[str, ...] = (CONTIGUOUS, HEADTAIL)
#: the attention interface's K/V tensors ``[batch, kv_heads, seq, head_dim]``: seq is dim 2
KV_SEQ_DIM = 2
KV_NAMES: tuple[str, ...] = ("key", "value")
#: registry names of attention wrappers that all-gather K/V over cp: hpcodegen's own and the
#: existing system's names for the same algorithm (``hpcodegen.targets`` maps them to ours)
CP_WRAPPER_NAMES = frozenset({
    "sdpa_hf", "sdpa_qkv", "eager_hf",
    "hpcodegen.runtime.cp.wrappers.sdpa_hf", "hpcodegen.runtime.cp.wrappers.sdpa_qkv",
    "hpcodegen.runtime.cp.wrappers.eager_hf",
    "hyper_parallel.codegen.inner.sdpa_qkv", "hyper_parallel.codegen.inner.sdpa_hf",
})


def cp_size(meta: Mapping[str, Any]) -> int:
    """The frozen ``parallel_dims.cp_size`` (1 when absent or unreadable)."""
    if not isinstance(meta.get("parallel_dims", {}), Mapping):
        return 1  # the schema check reports it
    return max(axis_sizes(meta).get(CP, 1), 1)


def cp_layout(plan: Plan) -> str:
    """``parallel_dims.cp_layout``; ``contiguous`` when absent (the existing system's)."""
    return plan.dims.cp_layout or CONTIGUOUS


def is_cp_wrapper(injection: Injection | None) -> bool:
    """The injection's ``inner_wrapper`` is an all-gather-K/V attention (ours or the
    existing system's name for it)."""
    return injection is not None and target_name(injection.inner_wrapper) in CP_WRAPPER_NAMES


@dataclass(frozen=True)
class KVTransition:
    """One K or V tensor's move over cp inside the wrapped attention."""

    name: str
    src: Placement
    dst: Placement
    #: declared in the record (``inner_in_src/dst``), or read from a known wrapper's name
    declared: bool


def kv_transitions(injection: Injection | None) -> tuple[KVTransition, ...]:
    """The K/V transitions over cp of one injection record (empty: none).

    Declared ``inner_in_src``/``inner_in_dst`` win (a missing axis or name reads ``R``);
    else a known all-gather wrapper (:func:`is_cp_wrapper`) implies ``key``/``value``
    ``S(2) -> R``.
    """
    if injection is None:
        return ()
    src, dst = injection.inner_in_src, injection.inner_in_dst
    if src is not None or dst is not None:
        src, dst = src or EMPTY, dst or EMPTY
        return tuple(KVTransition(n, src.get(n, EMPTY).get(CP, REPLICATE),
                                  dst.get(n, EMPTY).get(CP, REPLICATE), True)
                     for n in sorted(set(src) | set(dst)))
    if is_cp_wrapper(injection):
        return tuple(KVTransition(n, Shard(KV_SEQ_DIM), REPLICATE, False) for n in KV_NAMES)
    return ()


def kv_forward_steps(t: KVTransition) -> tuple[Step, ...]:
    """DTensor's steps for ``t`` on the cp axis (an all_gather for ``S(2) -> R``)."""
    return redistribute_steps((t.src,), (t.dst,), (CP,))


def kv_backward_steps(t: KVTransition) -> tuple[Step, ...]:
    """The gradient arrives partial over cp (every rank's queries used all of K/V) and
    goes back to ``t.src``: a reduce_scatter for ``S(2) -> R``."""
    grad = Partial("sum") if t.dst == REPLICATE else t.dst
    return redistribute_steps((grad,), (t.src,), (CP,))


def plan_cp_attention(plan: Plan) -> list[str]:
    """The module FQNs whose injection has a K/V transition over cp (sorted)."""
    return sorted(fqn for fqn, record in plan.injections_by_fqn().items()
                  if kv_transitions(record))


# ---------------------------------------------------------------------------------------
# layout: which global positions a cp rank holds (pure arithmetic; the runtime, the data
# helper and the benchmark share it)


def layout_chunks(layout: str, cp: int) -> int:
    """How many equal chunks the sequence is cut into: ``cp``, or ``2 cp`` head-tail."""
    return 2 * cp if layout == HEADTAIL else cp


def rank_ranges(seq: int, cp: int, rank: int, layout: str) -> list[tuple[int, int]]:
    """The ``[start, stop)`` ranges of global positions cp rank ``rank`` holds, in the order
    its local tensor holds them. ``seq`` must divide by :func:`layout_chunks`.

    Example::

        >>> rank_ranges(8, 2, 0, "headtail")
        [(0, 2), (6, 8)]
    """
    if layout not in LAYOUTS:
        raise ValueError(f"unknown cp layout {layout!r}; expected one of {', '.join(LAYOUTS)}")
    n = layout_chunks(layout, cp)
    if seq % n:
        raise ValueError(f"sequence length {seq} does not divide into {n} chunks ({layout} "
                         f"layout, cp={cp})")
    size = seq // n
    chunks = [rank] if layout == CONTIGUOUS else [rank, 2 * cp - 1 - rank]
    return [(c * size, (c + 1) * size) for c in chunks]


def rank_positions(seq: int, cp: int, rank: int, layout: str) -> list[int]:
    """Global positions of rank ``rank``'s tokens, in local order."""
    return [p for start, stop in rank_ranges(seq, cp, rank, layout) for p in range(start, stop)]


def gathered_order(seq: int, cp: int, layout: str) -> list[int]:
    """Global position of each row of a cp all_gather (rank 0's tokens, then rank 1's...)."""
    return [p for r in range(cp) for p in rank_positions(seq, cp, r, layout)]


def kv_gather_bytes(shape: tuple[int, ...], elem_bytes: int, cp: int, tp_split: int = 1
                    ) -> float:
    """Bytes one rank sends to all-gather one K or V over cp (ring model, as
    :mod:`hpcodegen.plan.volume`): ``shape`` is the unsharded ``[batch, kv_heads, seq,
    head_dim]`` the kernel gets (kv heads, never the expanded query heads), ``tp_split`` the
    tp size when the heads are split over tp. The backward's reduce_scatter moves as much."""
    if cp <= 1:
        return 0.0
    numel = 1
    for n in shape:
        numel *= n
    return (cp - 1) / cp * numel * elem_bytes / max(tp_split, 1)


def causal_work(seq: int, cp: int, layout: str) -> list[int]:
    """Unmasked causal score entries per cp rank (query ``i`` sees keys ``0..i``)."""
    return [sum(p + 1 for p in rank_positions(seq, cp, r, layout)) for r in range(cp)]


__all__ = ["CONTIGUOUS", "CP", "CP_WRAPPER_NAMES", "HEADTAIL", "KV_NAMES", "KV_SEQ_DIM",
           "LAYOUTS", "KVTransition", "causal_work", "cp_layout", "cp_size",
           "gathered_order", "is_cp_wrapper", "kv_backward_steps",
           "kv_forward_steps", "kv_gather_bytes", "kv_transitions", "layout_chunks",
           "plan_cp_attention", "rank_positions", "rank_ranges"]
