"""What a norm split over tp communicates (pure, no torch).

A norm over the whole width of a colwise projection (OLMo-2's ``q_norm``/``k_norm`` on
``num_heads * head_dim`` features) runs on each rank's features with the registered local
compute :func:`hpcodegen.runtime.norms.sharded_rms_norm`: the per-token sum of squares is
all-reduced over tp (one fp32 value per token), forward and backward, instead of
all-gathering the projection.
"""

from __future__ import annotations

from hpcodegen.plan.moe import target_name
from hpcodegen.plan.types import Injection

TP = "tp"
#: the names (registry name, dotted path) of the split norm's factory
SHARDED_NORM_TARGETS = frozenset({"sharded_rms_norm",
                                  "hpcodegen.runtime.norms.sharded_rms_norm"})
SHARDED_NORM_TARGET = "hpcodegen.runtime.norms.sharded_rms_norm"
#: bytes of the all-reduced value per token (fp32)
SUM_BYTES = 4


def is_sharded_norm(injection: Injection | None) -> bool:
    """The injection binds the split RMS norm as the region's local compute."""
    return injection is not None and \
        target_name(injection.local_compute_fn) in SHARDED_NORM_TARGETS


def norm_bytes(tokens: int, tp: int) -> float:
    """Per-rank bytes of the sum-of-squares all_reduce of one call (ring all_reduce)."""
    return 2 * (tp - 1) / tp * tokens * SUM_BYTES if tp > 1 else 0.0
