"""What hpcodegen's expert-parallel dispatch communicates, per MoE layer (pure, no torch).

The region form of an ``experts`` module whose ``local_compute_fn`` is the registered
``ep_dispatch`` (:mod:`hpcodegen.runtime.moe`) runs, per forward, in this order:

* ``counts``: all_to_all (ep) of the per-expert slot counts (``E`` int64 per rank);
* ``dispatch``: all_to_all (ep) of the hidden state of every (token, k) slot to its
  expert's rank;
* with sequence parallelism and experts split over tp (:func:`gathers_over_tp`):
  ``tp_counts``, an all_gather (tp) of the received counts, ``tp_gather``, the rows every
  tp peer received (an uneven all_gather, run as an all_to_all), then after the experts
  ``tp_scatter``, the partial results summed back onto their rank (an uneven
  reduce-scatter, run as an all_to_all);
* ``combine``: all_to_all (ep) of the expert outputs back;

and per backward the reverse of ``combine``, ``tp_scatter``, ``tp_gather`` and ``dispatch``
(the counts carry no gradient). Without an ep group (a region run on a mesh without ``ep``)
only the tp steps run.

Bytes are what leaves a rank, the convention of every collective inspect-plan counts. The
exchange is dropless: a rank sends its ``tokens x top_k`` rows, and under balanced routing
``(ep-1)/ep`` of them leave it; a rank receives ``tokens x top_k`` rows on average, which
the tp gather sends to its ``tp-1`` peers. :func:`dispatch_volume` is the one formula.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hpcodegen.placement import Partial, is_shard
from hpcodegen.plan.frozen import EMPTY
from hpcodegen.plan.types import Injection, NamedPlacements, PlanEntry, Target

EP = "ep"
TP = "tp"
#: the names (registry name, dotted path) of hpcodegen's dispatch factory
EP_DISPATCH_TARGETS = frozenset({"ep_dispatch", "hpcodegen.runtime.moe.ep_dispatch"})


@dataclass(frozen=True)
class DispatchOp:
    """One collective of the dispatch: its name (a key of :class:`DispatchVolume`), kind,
    axis, and whether it runs before the experts (``in``) or after (``out``)."""

    name: str
    kind: str
    axis: str
    side: str


_COUNTS = DispatchOp("counts", "all_to_all", EP, "in")
_DISPATCH = DispatchOp("dispatch", "all_to_all", EP, "in")
_TP_COUNTS = DispatchOp("tp_counts", "all_gather", TP, "in")
_TP_GATHER = DispatchOp("tp_gather", "all_to_all", TP, "in")
_TP_SCATTER = DispatchOp("tp_scatter", "all_to_all", TP, "out")
_COMBINE = DispatchOp("combine", "all_to_all", EP, "out")


#: the names of the dispatch's collectives (the fields of :class:`DispatchVolume`)
DISPATCH_NAMES = frozenset(op.name for op in (_COUNTS, _DISPATCH, _TP_COUNTS, _TP_GATHER,
                                              _TP_SCATTER, _COMBINE))


def dispatch_ops(ep_live: bool, tp_gather: bool
                 ) -> tuple[tuple[DispatchOp, ...], tuple[DispatchOp, ...]]:
    """``(forward, backward)`` collectives of one dispatching region, in execution order."""
    forward = [op for op in (_COUNTS, _DISPATCH) if ep_live]
    backward = [op for op in (_COMBINE,) if ep_live]
    if tp_gather:
        forward += [_TP_COUNTS, _TP_GATHER, _TP_SCATTER]
        backward += [_TP_SCATTER, _TP_GATHER]
    forward += [_COMBINE] if ep_live else []
    backward += [_DISPATCH] if ep_live else []
    return tuple(forward), tuple(backward)


def target_name(value: Target | str | None) -> str | None:
    """The name an injected callable is bound by: a :class:`Target`'s path or a bare name."""
    return value.path if isinstance(value, Target) else value


def is_ep_dispatch(injection: Injection | None) -> bool:
    """The injection binds hpcodegen's dispatch as the region's local compute."""
    return injection is not None and \
        target_name(injection.local_compute_fn) in EP_DISPATCH_TARGETS


def ep_dispatch_size(injection: Injection | None) -> int:
    """The ep size of a region whose compute is hpcodegen's dispatch; 0 when it is not one."""
    if injection is None or not is_ep_dispatch(injection):
        return 0
    size = injection.ep_size
    return size if size is not None and size > 1 else 0


@dataclass(frozen=True)
class DispatchVolume:
    """Bytes one rank sends per collective of one MoE layer (see the module docstring)."""

    counts: float
    dispatch: float
    combine: float
    tp_counts: float = 0.0
    tp_gather: float = 0.0
    tp_scatter: float = 0.0

    def of_name(self, name: str) -> float:
        return float(getattr(self, name))


def dispatch_volume(tokens: int, top_k: int, hidden: int, num_experts: int,
                    elem_bytes: int, ep: int, tp_gather: int = 1) -> DispatchVolume:
    """Per-rank bytes of one layer: ``tokens`` local tokens (this rank's slice under
    sequence parallelism), each routed to ``top_k`` experts, ``hidden`` elements of
    ``elem_bytes`` each; counts are int64. ``tp_gather``: the tp size the dispatch gathers
    its rows over (1: no gather)."""
    rows = tokens * top_k * hidden * elem_bytes
    leave = (ep - 1) / ep if ep > 1 else 0.0
    peers = max(tp_gather - 1, 0)
    return DispatchVolume(counts=num_experts * 8 * leave, dispatch=rows * leave,
                          combine=rows * leave, tp_counts=peers * num_experts * 8.0,
                          tp_gather=peers * rows, tp_scatter=peers * rows)


#: config fields naming the routed expert count, by family
EXPERT_COUNT_FIELDS: tuple[str, ...] = ("num_experts", "num_local_experts", "n_routed_experts")


def expert_count(config: Mapping[str, Any]) -> int:
    """The routed expert count of an HF config (``text_config`` too); 0 when absent."""
    for source in (config, config.get("text_config") or {}):
        for key in EXPERT_COUNT_FIELDS:
            value = source.get(key) if isinstance(source, Mapping) else None
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return 0


def gathers_over_tp(entry: PlanEntry | None) -> bool:
    """The dispatch of this ``experts`` region gathers its rows over tp: its inputs stay
    sharded on tp (sequence parallelism: each tp rank routed its own slice of the tokens)
    while its experts are split over tp, so the rows a rank receives are gathered from its
    tp peers before the experts run, and the partial results reduce-scattered back."""
    if entry is None:
        return False
    return _any_tp_sharded(entry.in_dst) and _any_tp_sharded(entry.params)


def _any_tp_sharded(named_map: NamedPlacements | None) -> bool:
    return any(TP in named and is_shard(named[TP]) for named in (named_map or EMPTY).values())


def dispatch_output_tp(entry: PlanEntry) -> str | None:
    """What the ep dispatch's output is over tp, by its contract (the derivation shows the
    same by propagation): ``"shard"`` when it gathers its rows over tp
    (:func:`gathers_over_tp`: the partial results are reduce-scattered back onto the rows
    each rank routed), ``"partial"`` when its experts are split over tp and every rank
    holds the whole rows (the down projection's row-parallel matmul leaves a sum to be
    all-reduced), ``None`` otherwise (experts whole over tp: the rows' own layout)."""
    if gathers_over_tp(entry):
        return "shard"
    return "partial" if _any_tp_sharded(entry.params) else None


def output_agrees(kind: str | None, named: Any) -> bool:
    """A declared output placement (``{axis: placement}``) fits :func:`dispatch_output_tp`."""
    got = (named or EMPTY).get(TP)
    if kind == "shard":
        return got is not None and is_shard(got)
    if kind == "partial":
        return isinstance(got, Partial)
    return True
