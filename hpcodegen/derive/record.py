"""What one derivation found, as plain data (pure: no torch).

Placements are hpcodegen placement strings per live axis (``{"tp": "P(sum)"}``); an axis
of size 1 moves nothing and never appears. :mod:`hpcodegen.checks.derived` compares this
record with the meta; :mod:`hpcodegen.derive.propagate` fills it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hpcodegen.placement import Partial, Placement, Replicate, StridedShard

#: axis -> placement string, live axes only
Named = dict[str, str]


@dataclass(frozen=True)
class Step:
    """One mesh axis of one operand's redistribution."""

    axis: str
    src: Placement
    dst: Placement


@dataclass(frozen=True)
class Move:
    """How one operand of an op must be redistributed first: its steps (the axes whose
    placement changes; none: a layout change on no axis) and the parameter it is, if any."""

    steps: tuple[Step, ...]
    param: str | None = None
    #: a contract of hpcodegen's injected compute broken, said in words (no steps)
    note: str = ""

    def __str__(self) -> str:
        if self.note:
            return self.note
        moved = [f"{s.src} -> {s.dst} on {s.axis}" for s in self.steps]
        return ", ".join(moved or ["a layout change"]) + (
            f" (parameter {self.param})" if self.param else "")

    @property
    def from_strided(self) -> bool:
        """Its first moved axis starts from a strided shard (``SS(d,k)``)."""
        return bool(self.steps) and isinstance(self.steps[0].src, StridedShard)

    @property
    def gathers_strided(self) -> bool:
        """A strided shard made whole: DTensor had no strided rule for the op."""
        return self.from_strided and any(isinstance(s.dst, Replicate) for s in self.steps)

    @property
    def to_partial(self) -> bool:
        """A value is taken to a partial (a replicated one combined with a partial sum)."""
        return any(isinstance(s.dst, Partial) for s in self.steps)

    @property
    def from_partial(self) -> bool:
        """A partial sum is taken whole or resharded (it reached an op that needs it whole)."""
        return bool(self.steps) and isinstance(self.steps[0].src, Partial)

    def is_tp_sum(self, tp: str) -> bool:
        """Only a partial over ``tp`` taken whole: a split norm's own all_reduce."""
        return len(self.steps) == 1 and self.steps[0].axis == tp \
            and isinstance(self.steps[0].src, Partial) \
            and isinstance(self.steps[0].dst, Replicate)


@dataclass(frozen=True)
class ImplicitComm:
    """An op whose operands the local code would use as they are, but whose math needs them
    redistributed first (DTensor inserts the collective; the runtime's local code does not):
    a shape error or wrong values at run time."""

    boundary: str | None  #: the innermost boundary computing it (None: between boundaries)
    op: str  #: ``aten.add``
    moves: tuple[Move, ...]  #: per operand moved (``P(sum) -> R on tp (parameter x.bias)``)
    line: str  #: the model source line


@dataclass
class Derivation:
    """The derived facts of one plan at one set of mesh sizes."""

    sizes: dict[str, int]
    #: the axes derived over (live, not data axes) -> size
    axes: dict[str, int] = field(default_factory=dict)
    #: (boundary fqn, output name) -> derived placement of what the forward computed
    outputs: dict[tuple[str, str], Named] = field(default_factory=dict)
    #: (boundary fqn, input name) -> derived placement of what arrived
    inputs: dict[tuple[str, str], Named] = field(default_factory=dict)
    #: (entry fqn, rel param name) -> {axis: "partial" | "full" | "sharded" | "none"}
    grads: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)
    implicit: list[ImplicitComm] = field(default_factory=list)
    #: reductions DTensor inserted in backward (an op taking a partial gradient): a
    #: gradient derived whole may then be partial in the runtime's local backward
    backward_reductions: int = 0
    #: boundary fqn -> why it was not derived (opaque injected or data-dependent compute)
    opaque: dict[str, str] = field(default_factory=dict)
    #: the run stopped: why (then only what was reached is derived)
    failed: str | None = None
    #: nothing to derive: why (every axis has size 1, ...)
    skipped: str | None = None
