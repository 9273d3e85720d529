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
from hpcodegen.plan.frozen import EMPTY
from hpcodegen.plan.moe import target_name
from hpcodegen.plan.steps import Step, redistribute_steps
from hpcodegen.plan.types import Injection, Plan, Target

CP = "cp"
CONTIGUOUS = "contiguous"
HEADTAIL = "headtail"
LAYOUTS: tuple[str, ...] = (CONTIGUOUS, HEADTAIL)
#: the attention interface's K/V tensors ``[batch, kv_heads, seq, head_dim]``: seq is dim 2
KV_SEQ_DIM = 2
KV_NAMES: tuple[str, ...] = ("key", "value")
#: the attention interface's heads dim (``[batch, heads, seq, head_dim]``): Ulysses' target
HEADS_DIM = 1
#: the attention output as the kernel returns it, ``[batch, seq, heads, head_dim]``
OUT_SEQ_DIM, OUT_HEADS_DIM = 1, 2
QKV_NAMES: tuple[str, ...] = ("query", "key", "value")
OUT_NAME = "output"
#: context-parallel methods (docs/cp.md): K/V all-gather, Ulysses all-to-all, the hybrid
ALLGATHER, ULYSSES, HYBRID = "allgather", "ulysses", "hybrid"
METHODS: tuple[str, ...] = (ALLGATHER, ULYSSES, HYBRID)
#: the hybrid's two sub-groups of cp: the Ulysses all-to-all inside ``ulysses_degree``
#: consecutive cp ranks, the K/V all-gather across those groups
CP_ULYSSES, CP_ALLGATHER = "cp_ulysses", "cp_allgather"
CP_AXES: tuple[str, ...] = (CP, CP_ULYSSES, CP_ALLGATHER)
#: the hybrid wrapper's kwarg (the existing system's name)
ULYSSES_DEGREE = "ulysses_degree"
_OURS = ("sdpa_hf", "sdpa_qkv", "eager_hf")
_THEIRS = ("sdpa_hf", "sdpa_qkv")


def _names(suffix: str) -> frozenset[str]:
    return frozenset([*(f"{k}{suffix}" for k in _OURS),
                      *(f"hpcodegen.runtime.cp.wrappers.{k}{suffix}" for k in _OURS),
                      *(f"hyper_parallel.codegen.inner.{k}{suffix}" for k in _THEIRS)])


#: registry names of the CP attentions per method: hpcodegen's own and the existing
#: system's names for the same algorithms (``hpcodegen.targets`` maps them to ours):
#: ``sdpa_hf``/``sdpa_qkv`` all-gather K/V, ``*_ulysses`` all-to-all, ``*_hybrid`` both
WRAPPER_METHODS: dict[str, str] = {
    **dict.fromkeys(_names(""), ALLGATHER), **dict.fromkeys(_names("_ulysses"), ULYSSES),
    **dict.fromkeys(_names("_hybrid"), HYBRID)}
CP_WRAPPER_NAMES = frozenset(WRAPPER_METHODS)


def cp_size(plan: Plan) -> int:
    """The frozen ``parallel_dims.cp_size`` (1 when absent or unreadable)."""
    return max(plan.dims.size(CP), 1)


def cp_layout(plan: Plan) -> str:
    """``parallel_dims.cp_layout``; ``contiguous`` when absent (the existing system's)."""
    return plan.dims.cp_layout or CONTIGUOUS


def is_cp_wrapper(injection: Injection | None) -> bool:
    """The injection's ``inner_wrapper`` is a CP attention (ours or the existing system's
    name for the same algorithm), whatever its method."""
    return injection is not None and target_name(injection.inner_wrapper) in CP_WRAPPER_NAMES


def cp_method(injection: Injection | None) -> str | None:
    """``allgather``, ``ulysses`` or ``hybrid`` for a CP attention's wrapper; None else."""
    if injection is None:
        return None
    return WRAPPER_METHODS.get(target_name(injection.inner_wrapper) or "")


def ulysses_degree(injection: Injection | None, cp: int) -> int:
    """How many cp ranks trade heads for sequence in one all-to-all: 1 all-gather, ``cp``
    Ulysses, the wrapper's ``ulysses_degree`` for the hybrid (0: missing or not an int)."""
    method = cp_method(injection)
    if method == ULYSSES:
        return cp
    if method != HYBRID:
        return 1
    wrapper = injection.inner_wrapper if injection is not None else None
    value = wrapper.kwargs.get(ULYSSES_DEGREE) if isinstance(wrapper, Target) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def method_transitions(method: str) -> dict[str, dict[str, dict[str, str]]]:
    """The inner transitions a method's record declares, as frozen JSON
    (``inner_in_src``/``inner_in_dst`` on ``[batch, heads, seq, head_dim]``,
    ``inner_out_src``/``inner_out_dst`` on the kernel's ``[batch, seq, heads, head_dim]``):

    * all-gather: key/value ``cp: S(2) -> R``;
    * Ulysses: query/key/value ``cp: S(2) -> S(1)`` (sequence shard for a head shard of the
      whole sequence), output ``cp: S(2) -> S(1)`` (heads back to the sequence);
    * hybrid: the Ulysses exchange on ``cp_ulysses``, then key/value ``S(2) -> R`` on
      ``cp_allgather``.
    """
    seq, heads, out_seq, out_heads = (str(Shard(d)) for d in (KV_SEQ_DIM, HEADS_DIM,
                                                              OUT_SEQ_DIM, OUT_HEADS_DIM))
    whole = str(REPLICATE)
    if method == ALLGATHER:
        return {"inner_in_src": {n: {CP: seq} for n in KV_NAMES},
                "inner_in_dst": {n: {CP: whole} for n in KV_NAMES}}
    a2a = CP if method == ULYSSES else CP_ULYSSES
    src = {n: {a2a: seq} for n in QKV_NAMES}
    dst = {n: {a2a: heads} for n in QKV_NAMES}
    if method == HYBRID:
        for n in KV_NAMES:
            src[n][CP_ALLGATHER], dst[n][CP_ALLGATHER] = seq, whole
    return {"inner_in_src": src, "inner_in_dst": dst,
            "inner_out_src": {OUT_NAME: {a2a: out_heads}},
            "inner_out_dst": {OUT_NAME: {a2a: out_seq}}}


@dataclass(frozen=True)
class KVTransition:
    """One tensor's move over (a sub-group of) cp inside the wrapped attention."""

    name: str
    src: Placement
    dst: Placement
    #: declared in the record (``inner_*_src/dst``), or read from a known wrapper's name
    declared: bool
    #: ``cp``, or the hybrid's ``cp_ulysses`` / ``cp_allgather``
    axis: str = CP
    #: ``in``: a kernel input (query, key, value); ``out``: the kernel's output
    side: str = "in"


def _placements(value: Any) -> dict[str, dict[str, Placement]]:
    """Named placements from a parsed record field or raw JSON (``inner_out_*`` stay JSON)."""
    from hpcodegen.placement import parse_placement

    out: dict[str, dict[str, Placement]] = {}
    for name, named in (value or {}).items() if isinstance(value, Mapping) else ():
        if not isinstance(named, Mapping):
            continue
        axes: dict[str, Placement] = {}
        for axis, text in named.items():
            try:
                axes[axis] = text if not isinstance(text, str) else parse_placement(text)
            except (ValueError, TypeError):
                continue  # the checks report a bad placement
        out[name] = axes
    return out


def _declared(src: Any, dst: Any, side: str) -> list[KVTransition]:
    a, b = _placements(src), _placements(dst)
    out = []
    for name in sorted(set(a) | set(b), key=lambda n: ((*QKV_NAMES, OUT_NAME)).index(n)
                       if n in (*QKV_NAMES, OUT_NAME) else 9):
        axes = set(a.get(name, {})) | set(b.get(name, {}))
        for axis in [x for x in CP_AXES if x in axes] + sorted(axes - set(CP_AXES)):
            out.append(KVTransition(name, a.get(name, {}).get(axis, REPLICATE),
                                    b.get(name, {}).get(axis, REPLICATE), True, axis, side))
    return out


def kv_transitions(injection: Injection | None) -> tuple[KVTransition, ...]:
    """The transitions over cp of one injection record (empty: none), in run order: the
    inputs (per tensor, the Ulysses exchange before the hybrid's gather), then the output.

    Declared ``inner_in_src``/``inner_in_dst`` (and ``inner_out_*``) win (a missing axis or
    name reads ``R``); else a known CP wrapper implies its method's transitions
    (:func:`method_transitions`).
    """
    if injection is None:
        return ()
    src, dst = injection.inner_in_src, injection.inner_in_dst
    if src is not None or dst is not None:
        return tuple(_declared(src or EMPTY, dst or EMPTY, "in")
                     + _declared(injection.inner_out_src, injection.inner_out_dst, "out"))
    method = cp_method(injection)
    if method is None:
        return ()
    implied = method_transitions(method)
    return tuple(
        KVTransition(t.name, t.src, t.dst, False, t.axis, t.side)
        for t in _declared(implied["inner_in_src"], implied["inner_in_dst"], "in")
        + _declared(implied.get("inner_out_src"), implied.get("inner_out_dst"), "out"))


def kv_forward_steps(t: KVTransition) -> tuple[Step, ...]:
    """DTensor's steps for ``t`` on its axis (all_gather for ``S(2) -> R``, all_to_all for
    ``S(2) -> S(1)``)."""
    return redistribute_steps((t.src,), (t.dst,), (t.axis,))


def kv_backward_steps(t: KVTransition) -> tuple[Step, ...]:
    """The gradient's way back to ``t.src``: partial over cp after a gather (every rank's
    queries used all of K/V), so a reduce_scatter; the reverse all_to_all after one."""
    grad = Partial("sum") if t.dst == REPLICATE else t.dst
    return redistribute_steps((grad,), (t.src,), (t.axis,))


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


def query_order(seq: int, cp: int, rank: int, layout: str, ulysses: int = 1) -> list[int]:
    """Global position of each query row cp rank ``rank`` attends: its own tokens
    (all-gather), or after a Ulysses exchange over ``ulysses`` consecutive cp ranks, the
    tokens of its group in rank order (a head shard of them)."""
    first = rank // ulysses * ulysses
    return [p for r in range(first, first + ulysses)
            for p in rank_positions(seq, cp, r, layout)]


def kv_replicas(kv_heads: int, ulysses: int) -> int:
    """How many copies of each kv head a Ulysses exchange over ``ulysses`` ranks sends:
    1 when the kv heads divide, ``ulysses // kv_heads`` when they divide ``ulysses`` (each
    rank takes its copy of the kv head its query heads use); 0: no exact grouping."""
    if ulysses <= 1 or kv_heads % ulysses == 0:
        return 1
    return ulysses // kv_heads if kv_heads > 0 and ulysses % kv_heads == 0 else 0


def heads_problem(q_heads: int, kv_heads: int, tp: int, ulysses: int) -> str | None:
    """Why ``q_heads`` / ``kv_heads`` cannot be cut over ``tp x ulysses`` exactly (None: they
    can): query heads must divide by ``tp*U``; kv heads by ``tp``, then by ``U`` or into it
    (replicated, :func:`kv_replicas`)."""
    if ulysses <= 1:
        return None
    heads = f"{q_heads} query heads / {kv_heads} kv heads at tp {tp} x ulysses {ulysses}"
    if q_heads % (tp * ulysses):
        return f"{heads}: the query heads do not divide over {tp * ulysses} ranks"
    if kv_heads % tp:
        return f"{heads}: the kv heads do not divide over tp = {tp}"
    local = kv_heads // tp
    if not kv_replicas(local, ulysses):
        return (f"{heads}: the {local} kv heads per tp rank neither divide over the "
                f"{ulysses} Ulysses ranks nor divide them (one replica per rank): no exact "
                "grouping of the query heads")
    return None


def ulysses_bytes(shape: tuple[int, ...], elem_bytes: int, cp: int, ulysses: int,
                  tp_split: int = 1, replicas: int = 1) -> float:
    """Bytes one rank sends in one Ulysses all_to_all of a tensor whose unsharded shape is
    ``shape`` (query/key/value ``[batch, heads, seq, head_dim]`` or the output): its local
    shard is ``1/(cp tp)`` of it (times the kv replicas), and it keeps ``1/U``."""
    if ulysses <= 1:
        return 0.0
    numel = 1
    for n in shape:
        numel *= n
    return (ulysses - 1) / ulysses * numel * elem_bytes * replicas / (cp * max(tp_split, 1))


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


def cp_op_bytes(name: str, kind: str, shape: tuple[int, ...], elem_bytes: int, cp: int,
                ulysses: int = 1, tp_split: int = 1, kv_heads: int = 0) -> float:
    """Bytes one rank sends in one op of a CP attention (forward or backward, the same):
    ``shape`` the unsharded tensor the kernel gets (``[batch, heads, seq, head_dim]``; the
    output ``[batch, seq, heads, head_dim]``), ``kv_heads`` the unsharded kv-head count (for
    the Ulysses replicas of key/value). An all_to_all is the Ulysses exchange over
    ``ulysses`` ranks; an all_gather / reduce_scatter gathers K/V over ``cp / ulysses``
    ranks, after the exchange when ``ulysses > 1`` (hybrid)."""
    split = max(tp_split, 1)
    replicas = kv_replicas(kv_heads // split, ulysses) if name in KV_NAMES and kv_heads else 1
    if kind == "all_to_all":
        return ulysses_bytes(shape, elem_bytes, cp, ulysses, split, replicas or 1)
    group = cp // max(ulysses, 1)
    return kv_gather_bytes(shape, elem_bytes, group, split * ulysses / (replicas or 1))


def layer_bytes(method: str, ulysses: int, query: tuple[int, ...], key: tuple[int, ...],
                elem_bytes: int, cp: int, tp: int = 1, value_dim: int | None = None) -> float:
    """Bytes one rank sends for one CP attention layer, forward and backward, by
    ``method`` (:func:`method_transitions`, :func:`cp_op_bytes`): ``query`` and ``key`` the
    unsharded ``[batch, heads, seq, head_dim]`` the kernel gets (value like key, with
    ``value_dim``). Per rank, all-gather / Ulysses = ``cp / (g + 1)`` with ``g`` query
    heads per kv head (no replicas, ``tp`` 1)."""
    b, hq, seq, _ = query
    value = (*key[:3], value_dim or key[3])
    shapes = {"query": query, "key": key, "value": value, "output": (b, seq, hq, value[3])}
    degree = {ALLGATHER: 1, ULYSSES: cp}.get(method, ulysses)
    total = 0.0
    for t in _declared(*(method_transitions(method).get(k) for k in ("inner_in_src",
                                                                   "inner_in_dst")), "in") \
            + _declared(*(method_transitions(method).get(k) for k in ("inner_out_src",
                                                                    "inner_out_dst")), "out"):
        for step in (*kv_forward_steps(t), *kv_backward_steps(t)):
            total += cp_op_bytes(t.name, step.kind, shapes[t.name], elem_bytes, cp, degree, tp,
                                 key[1])
    return total


def causal_work(seq: int, cp: int, layout: str) -> list[int]:
    """Unmasked causal score entries per cp rank (query ``i`` sees keys ``0..i``)."""
    return [sum(p + 1 for p in rank_positions(seq, cp, r, layout)) for r in range(cp)]


__all__ = [
    "ALLGATHER",
    "CONTIGUOUS",
    "CP",
    "CP_ALLGATHER",
    "CP_AXES",
    "CP_ULYSSES",
    "CP_WRAPPER_NAMES",
    "HEADS_DIM",
    "HEADTAIL",
    "HYBRID",
    "KV_NAMES",
    "KV_SEQ_DIM",
    "LAYOUTS",
    "METHODS",
    "OUT_HEADS_DIM",
    "OUT_NAME",
    "OUT_SEQ_DIM",
    "QKV_NAMES",
    "ULYSSES",
    "ULYSSES_DEGREE",
    "WRAPPER_METHODS",
    "KVTransition",
    "causal_work",
    "cp_layout",
    "cp_method",
    "cp_op_bytes",
    "cp_size",
    "gathered_order",
    "heads_problem",
    "is_cp_wrapper",
    "kv_backward_steps",
    "kv_forward_steps",
    "kv_gather_bytes",
    "kv_replicas",
    "kv_transitions",
    "layer_bytes",
    "layout_chunks",
    "method_transitions",
    "plan_cp_attention",
    "query_order",
    "rank_positions",
    "rank_ranges",
    "ulysses_bytes",
    "ulysses_degree",
]
