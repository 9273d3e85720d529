"""The collectives of the existing system's own injected factories, estimated (pure).

An artifact of the existing system (hyper_parallel's codegen) binds its own factories:
the Qwen3-MoE bundle's experts run ``hyper_parallel.models.qwen3_moe.adapter.distributed.
expert_parallel.qwen3moe_ep_compute_fn`` and its attentions are wrapped by ``...
context_parallel.qwen3_moe_flash_attention_cp_wrapper``. Their code is not ours and is never
imported, but what they communicate follows from the parallelism they implement, and it is
the largest traffic of such a plan, so leaving it out of inspect-plan's totals would
understate them most where it matters:

* an expert-parallel compute (a factory under the existing system's ``expert_parallel``
  package, with ``ep_size`` > 1) routes each token to the ranks holding its experts: the
  same three all_to_alls over ep as hpcodegen's own dispatch (:mod:`hpcodegen.plan.moe`:
  ``counts``, ``dispatch``, ``combine``; backward ``combine`` then ``dispatch``);
* a context-parallel attention wrapper (under its ``context_parallel`` package) gives each
  cp rank the whole sequence's keys and values: ``key``/``value`` ``S(2) -> R`` over cp,
  an all_gather forward and a reduce_scatter backward, as
  :func:`hpcodegen.plan.cp.kv_transitions` reads for an all-gather wrapper. A ring
  schedule moves the same bytes in ``cp - 1`` steps.

The prediction and the volume count them like hpcodegen's own, marked *estimated* with a
note naming the factory (the factory's real schedule may differ: the note says so).
"""

from __future__ import annotations

from hpcodegen.placement import REPLICATE, Shard
from hpcodegen.plan.cp import KV_NAMES, KV_SEQ_DIM, KVTransition
from hpcodegen.plan.moe import target_name
from hpcodegen.plan.types import Injection

#: the existing system's package: its factories' dotted paths start with it
FOREIGN_ROOT = "hyper_parallel."
#: a package part of a factory path -> the parallelism it implements
EXPERT_PARALLEL, CONTEXT_PARALLEL = "expert_parallel", "context_parallel"


def _kind(path: str | None) -> str | None:
    if not path or not path.startswith(FOREIGN_ROOT):
        return None
    parts = path.split(".")[:-1]  # packages, not the factory's own name
    for kind in (EXPERT_PARALLEL, CONTEXT_PARALLEL):
        if kind in parts:
            return kind
    return None


def estimated_dispatch(injection: Injection | None) -> str | None:
    """The factory path when ``injection``'s ``local_compute_fn`` is the existing system's
    expert-parallel compute with ``ep_size`` > 1 (its all_to_alls are estimated)."""
    if injection is None:
        return None
    path = target_name(injection.local_compute_fn)
    if _kind(path) != EXPERT_PARALLEL or not (injection.ep_size or 0) > 1:
        return None
    return path


def estimated_kv_wrapper(injection: Injection | None) -> str | None:
    """The factory path when ``injection``'s ``inner_wrapper`` is the existing system's
    context-parallel attention and declares no K/V transition of its own."""
    if injection is None or injection.inner_in_src is not None \
            or injection.inner_in_dst is not None:
        return None
    path = target_name(injection.inner_wrapper)
    return path if _kind(path) == CONTEXT_PARALLEL else None


def estimated_kv_transitions(injection: Injection | None) -> tuple[KVTransition, ...]:
    """``key``/``value`` ``S(2) -> R`` over cp for the existing system's context-parallel
    attention (:func:`estimated_kv_wrapper`); empty otherwise."""
    if estimated_kv_wrapper(injection) is None:
        return ()
    return tuple(KVTransition(n, Shard(KV_SEQ_DIM), REPLICATE, False) for n in KV_NAMES)


def estimate_note(kind: str, path: str) -> str:
    """The note a row shows for an estimated factory."""
    what = ("all_to_all over ep (counts, dispatch, combine), as hpcodegen's dispatch"
            if kind == EXPERT_PARALLEL else
            "key/value all_gather over cp (reduce_scatter backward)")
    return (f"estimated: {path} (the existing system's {kind.replace('_', ' ')} factory, "
            f"not read) is taken to run {what}")


__all__ = ["CONTEXT_PARALLEL", "EXPERT_PARALLEL", "FOREIGN_ROOT", "estimate_note",
           "estimated_dispatch", "estimated_kv_transitions", "estimated_kv_wrapper"]
