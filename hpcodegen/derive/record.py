"""What one derivation found, as plain data (pure: no torch).

Placements are hpcodegen placement strings per live axis (``{"tp": "P(sum)"}``); an axis
of size 1 moves nothing and never appears. :mod:`hpcodegen.checks.derived` compares this
record with the meta; :mod:`hpcodegen.derive.propagate` fills it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: axis -> placement string, live axes only
Named = dict[str, str]


@dataclass(frozen=True)
class ImplicitComm:
    """An op whose operands the local code would use as they are, but whose math needs them
    redistributed first (DTensor inserts the collective; the runtime's local code does not):
    a shape error or wrong values at run time."""

    boundary: str | None  #: the innermost boundary computing it (None: between boundaries)
    op: str  #: ``aten.add``
    moves: tuple[str, ...]  #: ``"P(sum) -> R on tp of model.x.bias"`` per operand moved
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
