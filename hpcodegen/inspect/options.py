"""What ``inspect-plan`` takes and what it produces: options, the result, ``--mesh``.

Its own module so the runner, the renderers and the volume estimate share these types
without importing one another (pure: no torch, no rich).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from hpcodegen.errors import Finding, UsageError, error
from hpcodegen.plan.fold import Row
from hpcodegen.plan.predict import BoundaryPrediction, Summary
from hpcodegen.plan.revalidate import FormChange

_MESH_ITEM = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=([0-9]+)$")


@dataclass(frozen=True, kw_only=True)
class InspectOptions:
    """The command line of ``inspect-plan``, parsed.

    Attributes:
        path: the artifact dir or its ``codegen_meta.json``.
        expand: one row per boundary instead of folded repeated layers.
        mesh: a live mesh ``"tp=4,cp=2"`` to re-validate against (None: the frozen mesh).
        as_json: print the documented JSON shape instead of tables.
        hf_config: a model dir or config.json; asks for the volume estimate.
        batch, seq: the traced ``input_ids`` shape (required with ``hf_config``).
        dtype: element type of floating activations (``bf16``, ``fp32``, ...).
        link_gbps: link bandwidth in gigabit/s for the time estimate.
        checks: run verify's schema, plan and targets checks first (``--no-checks`` skips them, for
            plans CI already verified: they dominate the time on very large plans).
        verbosity: -1 ``--quiet`` (findings only, no tables), 0, 1 ``-v`` (info findings).
    """

    path: str
    expand: bool = False
    mesh: str | None = None
    as_json: bool = False
    hf_config: str | None = None
    batch: int | None = None
    seq: int | None = None
    dtype: str = "bf16"
    link_gbps: float | None = None
    checks: bool = True
    verbosity: int = 0


@dataclass
class Inspection:
    """Everything the renderers show."""

    meta_path: str
    axes: tuple[str, ...]
    sizes: dict[str, int]
    preds: list[BoundaryPrediction]
    rows: list[Row]
    summary: Summary
    changes: list[FormChange] | None = None
    volume: dict[str, Any] | None = None
    findings: list[Finding] = field(default_factory=list)
    #: boundaries leaving vocab-sharded logits (loss parallel: no logits gather)
    loss_parallel_heads: list[str] = field(default_factory=list)


def parse_mesh(text: str) -> tuple[tuple[str, ...], dict[str, int]]:
    """``"tp=4,cp=2"`` -> ``(("tp", "cp"), {"tp": 4, "cp": 2})``; UsageError otherwise."""
    axes: list[str] = []
    sizes: dict[str, int] = {}
    from hpcodegen.bounds import MAX_RANKS

    for item in text.split(","):
        match = _MESH_ITEM.match(item.strip())
        if match is None or len(match[2]) > 12 or not 1 <= int(match[2]) <= MAX_RANKS \
                or match[1] in sizes:
            raise UsageError([error("inspect.bad_mesh", "--mesh", f"cannot read {item[:80]!r}",
                                    expected="axis=size pairs, e.g. tp=4,cp=2 "
                                             f"(each axis once, size 1 .. {MAX_RANKS})")])
        axes.append(match[1])
        sizes[match[1]] = int(match[2])
    return tuple(axes), sizes
