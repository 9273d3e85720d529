"""What a plan kept above Megatron's layout costs, for ``generate`` to say (lazy torch).

The Megatron layouts pass (:mod:`hpcodegen.generate.layouts.layouts`) leaves a module as
transformers planned it only for a reason; then ``generate`` prints a note naming the
modules, the reason and the cost: the plan's bytes per rank (forward and backward, as
inspect-plan counts them, traced at batch 1) and its parameter bytes per rank, each over
Megatron's first-principles layout (:mod:`hpcodegen.plan.megatron`). Both ratios do not
depend on the batch or the sequence length (every term scales with the tokens).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from hpcodegen.plan.types import Plan

#: how the note starts (bench/plan_quality.py recognises it)
ABOVE = "plan above Megatron's layout"


def _folded(kept: Mapping[str, str]) -> list[str]:
    """``model.layers.*.self_attn: reason`` once per pattern and reason."""
    seen: dict[tuple[str, str], None] = {}
    for fqn, why in kept.items():
        seen[(re.sub(r"\.\d+(?=\.|$)", ".*", fqn), why)] = None
    return [f"{pattern}: {why}" for pattern, why in seen]


def cost_note(model: Any, config: Mapping[str, Any], plan: Plan,
              kept: Mapping[str, str], tp: int, sp: bool, ep: int) -> str:
    """The note for a (frozen) plan with modules kept above Megatron's layout."""
    from hpcodegen.generate.layouts.megatron_shape import model_shape
    from hpcodegen.plan.megatron import comm_bytes, param_bytes, plan_param_bytes

    shape = model_shape(model, dict(config))
    seq = 16 * tp
    fwd, bwd = plan_bytes(plan, dict(config), 1, seq)
    ref_fwd, ref_bwd = comm_bytes(shape, tp, sp, ep, 1, seq, 2)
    numels = {name: p.numel() for name, p in model.named_parameters()}
    params = plan_param_bytes(plan.entries, numels, tp, ep, 2)
    ref_params = param_bytes(shape, tp, ep, 2)
    comm = (fwd + bwd) / (ref_fwd + ref_bwd) if ref_fwd + ref_bwd else float("nan")
    return (f"{ABOVE}: {comm:.2f}x its bytes per rank (forward and backward), "
            f"{params / ref_params:.2f}x its parameter bytes per rank; kept as transformers "
            f"plans it: {'; '.join(_folded(kept))}")


def plan_bytes(plan: Plan, config: dict[str, Any], batch: int, seq: int,
               dtype: str = "bf16") -> tuple[float, float]:
    """``(forward, backward)`` bytes per rank of a frozen plan on its mesh, as inspect-plan
    counts them, traced from a config dict."""
    from hpcodegen.inspect.run import classify_meta
    from hpcodegen.inspect.trace import trace_boundaries
    from hpcodegen.inspect.volume import boundary_volumes, trace_targets
    from hpcodegen.plan.moe import EP
    from hpcodegen.plan.volume import dtype_bytes

    result = classify_meta(plan, None)
    entries = plan.entries
    trace = trace_boundaries(config, trace_targets(result, entries), batch, seq)
    volumes = boundary_volumes(result, entries, trace, dtype_bytes(dtype), config,
                       max(plan.dims.size(EP), 1))
    return (sum(v.total("forward") for v in volumes.values()),
            sum(v.total("backward") for v in volumes.values()))
