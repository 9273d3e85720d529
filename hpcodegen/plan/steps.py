"""What one transition lowers to, and what DTensor runs for it forward and backward (pure).

The per-transition algebra under :mod:`hpcodegen.plan.classify` (which decides boundary
*forms* from it):

* :func:`classify_transition`: ``src -> dst`` as at most one tp collective (:class:`TPOp`):
  ``S(d)->R`` all_gather(d), ``P(sum)->R`` all_reduce(sum), ``P(sum)->S(d)``
  reduce_scatter(d); None when it is not one (the boundary goes generic);
* :func:`redistribute_steps`: what ``DTensor.redistribute`` runs axis by axis (:class:`Step`);
* :func:`grad_placements` / :func:`grad_steps`: the backward of a transition, the one rule
  the runtime's autograd, the generic engine and inspect-plan's prediction share
  (docs/design.md, "Autograd of lowered collectives").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from hpcodegen.placement import (
    REPLICATE,
    Partial,
    Placement,
    Replicate,
    is_shard,
    shard_dim,
)

OpKind = Literal["identity", "all_gather", "all_reduce", "reduce_scatter"]
StepKind = Literal[
    "all_gather", "all_reduce", "reduce_scatter", "all_to_all", "chunk", "invalid"
]
TP = "tp"


@dataclass(frozen=True, slots=True)
class TPOp:
    """A transition lowered to (at most) one collective on the ``tp`` axis.

    ``kind == "identity"`` means no communication (the tensor is only unwrapped).
    ``dim`` is the tensor dim (src dim for all_gather, dst dim for reduce_scatter).
    """

    kind: OpKind
    dim: int | None = None
    reduce_op: str | None = None

    def __str__(self) -> str:
        if self.kind == "identity":
            return "identity"
        if self.kind == "all_reduce":
            return f"all_reduce({self.reduce_op})"
        return f"{self.kind}(dim={self.dim})"


@dataclass(frozen=True, slots=True)
class Step:
    """One per-axis step DTensor's redistribute would run (for predicting generic forms)."""

    axis: str
    kind: StepKind
    dim: int | None = None
    reduce_op: str | None = None
    detail: str = ""

    @property
    def communicates(self) -> bool:
        return self.kind not in ("chunk", "invalid")

    def __str__(self) -> str:
        if self.kind == "chunk":
            return f"chunk(dim={self.dim})"
        if self.kind == "all_reduce":
            return f"all_reduce({self.reduce_op})"
        if self.kind == "invalid":
            return f"invalid({self.detail})"
        return f"{self.kind}(dim={self.dim})"


def classify_transition(
    src: Sequence[Placement], dst: Sequence[Placement], axes: Sequence[str]
) -> TPOp | None:
    """Lower ``src -> dst`` over ``axes`` to one tp op, or None when it is not lowerable."""
    if tuple(src) == tuple(dst):
        return TPOp("identity")
    if TP not in axes:
        return None
    t = list(axes).index(TP)
    if any(s != d for i, (s, d) in enumerate(zip(src, dst, strict=False)) if i != t):
        return None
    s, d = src[t], dst[t]
    if is_shard(s) and isinstance(d, Replicate):
        return TPOp("all_gather", dim=shard_dim(s))
    if isinstance(s, Partial) and s.reduce_op == "sum":
        if isinstance(d, Replicate):
            return TPOp("all_reduce", reduce_op="sum")
        if is_shard(d):
            return TPOp("reduce_scatter", dim=shard_dim(d), reduce_op="sum")
    return None


def redistribute_steps(
    src: Sequence[Placement], dst: Sequence[Placement], axes: Sequence[str]
) -> tuple[Step, ...]:
    """What ``DTensor.redistribute`` runs, axis by axis, for ``src -> dst``.

    ``S(i)->S(j)`` is an all_to_all (a ``cpu``/gloo mesh runs it as all_gather + chunk);
    ``R->S`` is a local chunk; redistributing *to* Partial is refused by torch (invalid).
    """
    steps: list[Step] = []
    for axis, s, d in zip(axes, src, dst, strict=False):
        if s == d:
            continue
        if isinstance(d, Partial):
            steps.append(Step(axis, "invalid",
                              detail=f"{s} -> {d}: cannot redistribute to Partial"))
        elif isinstance(s, Partial):
            if is_shard(d):
                steps.append(Step(axis, "reduce_scatter", shard_dim(d), s.reduce_op))
            else:
                steps.append(Step(axis, "all_reduce", reduce_op=s.reduce_op))
        elif isinstance(s, Replicate):
            steps.append(Step(axis, "chunk", shard_dim(d)))
        elif isinstance(d, Replicate):
            steps.append(Step(axis, "all_gather", shard_dim(s)))
        else:
            steps.append(Step(axis, "all_to_all", shard_dim(d), detail=f"{s} -> {d}"))
    return tuple(steps)


def grad_steps(side: Literal["in", "out"], src: tuple[Placement, ...],
               dst: tuple[Placement, ...], axes: Sequence[str], split: bool,
               enclosed: bool = False) -> tuple[Step, ...]:
    """What the backward of ``src -> dst`` runs, with DTensor's autograd.

    The gradient arrives with the ``dst`` placements, except that an *input* replicated on tp
    inside a compute-splitting boundary has a ``P(sum)`` gradient, and so has an *output*
    replicated on tp of a boundary nested (``enclosed``) in a boundary whose output is
    partial over tp (every replicated value in there reaches the loss only through that
    partial sum: Mamba's x_proj all_reduce feeds the channel-split scan). It is redistributed
    back to ``src``, where a Partial target is kept as Replicate (as torch does). So an input
    all_gather backs off as reduce_scatter, an identity input as all_reduce, an output
    reduce_scatter as all_gather, an output all_reduce as nothing (enclosed: all_reduce).
    """
    grad, target = grad_placements(side, src, dst, axes, split, enclosed)
    return redistribute_steps(grad, target, axes)


def grad_placements(side: Literal["in", "out"], src: tuple[Placement, ...],
                    dst: tuple[Placement, ...], axes: Sequence[str],
                    split: bool, enclosed: bool = False
                    ) -> tuple[tuple[Placement, ...], tuple[Placement, ...]]:
    """``(arriving gradient placements, target placements)`` of the backward of ``src -> dst``.

    The one rule behind :func:`grad_steps`, exposed so volume prediction walks the same
    placements the backward walks. ``split``: the boundary splits compute over tp (its
    inputs' rule); ``enclosed``: it is nested in a boundary whose output is partial over tp
    (its outputs' rule).
    """
    grad = dst
    if (side == "in" and split) or (side == "out" and enclosed):
        grad = tuple(Partial("sum") if a == TP and isinstance(p, Replicate) else p
                     for a, p in zip(axes, dst, strict=False))
    target = tuple(REPLICATE if isinstance(p, Partial) else p for p in src)
    return grad, target
