"""Bytes each rank sends per predicted collective, and an estimated time (pure).

The tensor a collective moves is the boundary's input or output as traced on the
*unsharded* model (:mod:`hpcodegen.inspect.trace`): ``full = numel x element size``. A collective on
mesh axis ``a`` of size ``n`` works on the part of that tensor one ``a``-group holds:
``group = full / prod(size(b) for every other axis b the current placement shards)``.
Each rank then sends, with ring algorithms (the usual NCCL/HCCL cost model):

=================  ==============================
all_gather         ``(n-1)/n * group``
reduce_scatter     ``(n-1)/n * group``
all_reduce         ``2(n-1)/n * group``
all_to_all         ``(n-1)/n * group / n``
chunk, identity    0 (local)
=================  ==============================

A multi-axis transition walks its steps in order, the placement of each axis becoming its
target once its step ran (as DTensor's redistribute does). The backward walks the
transition's ``grad_steps`` from the arriving gradient placements (``grad_placements``).
The time model (:func:`seconds`) is bandwidth plus a latency per collective:
``bytes * 8 / (link_gbps * 1e9) + collectives * link_latency_us * 1e-6``; no overlap with
compute, no contention.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from hpcodegen.errors import UsageError, error
from hpcodegen.placement import Placement, is_shard
from hpcodegen.plan.classify import Step, Transition, grad_placements
from hpcodegen.plan.types import PlanEntry

#: element size in bytes of ``--dtype`` spellings
DTYPE_BYTES: dict[str, int] = {
    "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "half": 2,
    "fp32": 4, "float32": 4, "float": 4, "fp64": 8, "float64": 8, "double": 8,
    "fp8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
}


def dtype_bytes(name: str) -> int:
    """Element size of a ``--dtype`` value; UsageError (exit 2) for an unknown name."""
    try:
        return DTYPE_BYTES[name.lower()]
    except KeyError:
        raise UsageError([error("inspect.bad_dtype", "--dtype", f"unknown dtype {name!r}",
                                expected=", ".join(DTYPE_BYTES))]) from None


def ring_factor(kind: str, n: int) -> float:
    """Fraction of the group tensor one rank sends (all_to_all: of its local shard)."""
    if n <= 1:
        return 0.0
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if kind == "all_reduce":
        return 2 * (n - 1) / n
    return 0.0


#: all-reduces of one fp32 value per token that the vocab-parallel cross entropy runs over
#: tp (:mod:`hpcodegen.runtime.loss`: row maximum, sum of exponentials, target logit)
LOSS_PARALLEL_REDUCES = 3


def loss_parallel_reduce_bytes(tokens: int, n: int) -> float:
    """Bytes one rank sends for the vocab-parallel cross entropy of ``tokens`` tokens over
    a tp group of ``n`` (in place of the logits' all_gather)."""
    return LOSS_PARALLEL_REDUCES * ring_factor("all_reduce", n) * tokens * 4.0


def step_bytes(step: Step, current: Sequence[Placement], axes: Sequence[str],
               sizes: Mapping[str, int], full_bytes: float) -> float:
    """Bytes one rank sends for ``step`` while the tensor has placements ``current``."""
    if not step.communicates:
        return 0.0
    others = math.prod(sizes.get(b, 1) for b, p in zip(axes, current, strict=False)
                       if b != step.axis and is_shard(p))
    n = sizes.get(step.axis, 1)
    group = full_bytes / others
    if step.kind == "all_to_all":
        group /= max(n, 1)
    return ring_factor(step.kind, n) * group


def walk_bytes(steps: Sequence[Step], start: Sequence[Placement], target: Sequence[Placement],
               axes: Sequence[str], sizes: Mapping[str, int], full_bytes: float) -> list[float]:
    """Bytes per step of a redistribution from ``start`` to ``target``, in step order."""
    current = list(start)
    out: list[float] = []
    for step in steps:
        out.append(step_bytes(step, current, axes, sizes, full_bytes))
        if step.axis in axes:
            i = list(axes).index(step.axis)
            current[i] = target[i]
    return out


@dataclass(frozen=True)
class OpVolume:
    """One collective's traffic on one boundary instance."""

    direction: str  # "forward" | "backward"
    side: str       # "in" | "out"
    name: str
    kind: str
    axis: str
    dim: int | None
    shape: tuple[int, ...] | None
    bytes: float | None
    #: why the op differs from the plan's (an uneven reduce_scatter), else ""
    detail: str = ""
    #: how the bytes were estimated where the tensor was not traced, else ""
    estimated: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"direction": self.direction, "side": self.side, "name": self.name,
                "kind": self.kind, "axis": self.axis, "dim": self.dim,
                "shape": list(self.shape) if self.shape is not None else None,
                "bytes": self.bytes, "detail": self.detail,
                "estimated": self.estimated or None}


def _uneven(step: Step, shape: tuple[int, ...] | None, sizes: Mapping[str, int]) -> str:
    """The runtime runs a reduce_scatter whose dim does not divide as all_reduce + chunk."""
    n = sizes.get(step.axis, 1)
    if step.kind != "reduce_scatter" or not shape or step.dim is None or n <= 1:
        return ""
    if not -len(shape) <= step.dim < len(shape) or shape[step.dim] % n == 0:
        return ""
    return (f"dim {step.dim} of size {shape[step.dim]} does not divide by {n}: "
            "runs as all_reduce + chunk")


def _op(direction: str, t: Transition, step: Step, shape: tuple[int, ...] | None,
        nbytes: float | None, sizes: Mapping[str, int]) -> OpVolume:
    detail = _uneven(step, shape, sizes)
    if detail:
        return OpVolume(direction, t.side, t.name, "all_reduce", step.axis, None, shape,
                        None if nbytes is None else 2 * nbytes, detail)
    return OpVolume(direction, t.side, t.name, step.kind, step.axis, step.dim, shape, nbytes)


@dataclass
class BoundaryVolume:
    """All collectives of one boundary instance with their bytes."""

    fqn: str
    ops: list[OpVolume] = field(default_factory=list)

    def total(self, direction: str) -> float:
        return sum(op.bytes or 0.0 for op in self.ops if op.direction == direction)


#: traced tensor facts: ``(shape, itemsize or None for a floating tensor)``
TensorInfo = tuple[tuple[int, ...], int | None]


def transition_volume(t: Transition, entry: PlanEntry, axes: Sequence[str],
                      sizes: Mapping[str, int], info: TensorInfo | None,
                      float_bytes: int, backward: bool = True,
                      estimated: str = "") -> list[OpVolume]:
    """Forward and backward collectives of one executed transition, with bytes.

    ``backward=False`` (or an integer tensor) leaves the backward out: no gradient flows.
    ``estimated``: ``info`` is an estimate (the tensor was not traced), said so on each op.
    """
    shape = info[0] if info else None
    full = None
    if info is not None:
        full = float(math.prod(info[0]) * (info[1] or float_bytes))
    grad, grad_target = grad_placements(t.side, t.src, t.dst, axes, entry.splits_compute(),
                                       t.enclosed)
    passes = [("forward", t.steps, t.src, t.dst)]
    if backward and not (info is not None and info[1] is not None):  # integers: no gradient
        passes.append(("backward", t.grad_steps, grad, grad_target))
    out: list[OpVolume] = []
    for direction, steps, start, target in passes:
        amounts = (walk_bytes(steps, start, target, axes, sizes, full) if full is not None
                   else [None] * len(steps))
        ops = (_op(direction, t, s, shape, b, sizes)
               for s, b in zip(steps, amounts, strict=True) if s.communicates)
        out.extend(replace(op, estimated=estimated) if estimated else op for op in ops)
    return out


#: the latency added per collective when ``--link-latency-us`` is not given: a few
#: microseconds, the order of one small NCCL collective within a node (a cross-node one
#: is slower: pass the measured figure)
DEFAULT_LINK_LATENCY_US = 5.0


def seconds(nbytes: float, link_gbps: float | None, collectives: int = 0,
            latency_us: float | None = None) -> float | None:
    """The time model: ``nbytes`` over a ``link_gbps`` (gigabit per second) link, plus
    ``latency_us`` microseconds for each of ``collectives`` (default
    :data:`DEFAULT_LINK_LATENCY_US`). No overlap with compute, no contention."""
    if not link_gbps:
        return None
    latency = DEFAULT_LINK_LATENCY_US if latency_us is None else latency_us
    return nbytes * 8 / (link_gbps * 1e9) + collectives * latency * 1e-6
