"""What hpcodegen's expert-parallel dispatch communicates, per MoE layer (pure, no torch).

The region form of an ``experts`` module whose ``local_compute_fn`` is the registered
``ep_dispatch`` (:mod:`hpcodegen.runtime.moe`) runs, on the ep group, per forward:

* ``counts``: all_to_all of the per-expert slot counts (``E`` int64 per rank);
* ``dispatch``: all_to_all of the hidden state of every (token, k) slot to its expert's rank;
* ``combine``: all_to_all of the expert outputs back;

and per backward the reverse of ``combine`` and of ``dispatch`` (the counts carry no
gradient). The exchange is dropless: a rank sends exactly ``tokens x top_k`` rows of
``hidden`` elements in each payload collective (rows to itself included, as
``all_to_all_single`` moves its whole input buffer), whatever the routing. Bytes per rank are
therefore known before any run; :func:`dispatch_volume` is the one formula.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

EP = "ep"
#: the names (registry name, dotted path) of hpcodegen's dispatch factory
EP_DISPATCH_TARGETS = frozenset({"ep_dispatch", "hpcodegen.runtime.moe.ep_dispatch"})
#: forward and backward collectives of one dispatching region, in execution order
FORWARD_OPS: tuple[str, ...] = ("counts", "dispatch", "combine")
BACKWARD_OPS: tuple[str, ...] = ("combine", "dispatch")


def target_name(value: Any) -> str | None:
    """The ``_target_`` of an injection value (a Target dict or a bare name)."""
    if isinstance(value, Mapping):
        value = value.get("_target_")
    return value if isinstance(value, str) else None


def ep_dispatch_size(injection: Mapping[str, Any] | None) -> int:
    """The ep size of a region whose compute is hpcodegen's dispatch; 0 when it is not one."""
    if not isinstance(injection, Mapping):
        return 0
    if target_name(injection.get("local_compute_fn")) not in EP_DISPATCH_TARGETS:
        return 0
    size = injection.get("ep_size")
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 1 else 0


@dataclass(frozen=True)
class DispatchVolume:
    """Bytes one rank sends per collective of one MoE layer (``all_to_all_single`` input)."""

    counts: int
    dispatch: int
    combine: int

    @property
    def forward(self) -> int:
        return self.counts + self.dispatch + self.combine

    @property
    def backward(self) -> int:
        return self.combine + self.dispatch  # the reverse exchanges of the two payloads


def dispatch_volume(tokens: int, top_k: int, hidden: int, num_experts: int,
                    elem_bytes: int) -> DispatchVolume:
    """Per-rank bytes of one layer: ``tokens`` local tokens (batch x sequence), each routed
    to ``top_k`` experts, ``hidden`` elements of ``elem_bytes`` each; counts are int64."""
    rows = tokens * top_k * hidden * elem_bytes
    return DispatchVolume(counts=num_experts * 8, dispatch=rows, combine=rows)


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
