"""What the install refuses about the model itself: another class, parameters the plan
does not cover.

``Artifact.load(dir)`` without a config cannot compare the model's config with the
artifact's signature, so a Llama plan would install on a Qwen3 model and leave its
``q_norm`` unplanned (trained, but never summed where it must be). The model in hand
answers both questions: its class (and bases) must include the architecture the artifact
was made for, and every trainable parameter must be covered by a planned key (the rule
verify's model check and ``generate`` apply: :func:`hpcodegen.plan.coverage.uncovered`).
Plans that replace modules or stack experts (foreign code decides their parameters) are
only held to the class rule.
"""

from __future__ import annotations

from typing import Any

from hpcodegen.errors import Finding, error
from hpcodegen.plan.coverage import trainable_names, uncovered
from hpcodegen.plan.entry import join_fqn
from hpcodegen.plan.frozen import EMPTY
from hpcodegen.plan.types import Plan

#: at most this many uncovered parameters are named
MAX_LISTED = 5


def model_fit_findings(model: Any, plan: Plan) -> list[Finding]:
    """``runtime.model_class`` and ``runtime.uncovered_param`` errors (empty: it fits)."""
    out: list[Finding] = []
    wanted = plan.provenance.source.architecture if plan.provenance.source else None
    names = {c.__name__ for c in type(model).__mro__}
    if isinstance(wanted, str) and wanted and wanted not in names:
        out.append(error("runtime.model_class", "model",
                         f"the artifact was made for {wanted}, the model is a "
                         f"{type(model).__name__}", expected=wanted,
                         hint="build the model with Artifact.build_model, or use the "
                              "artifact made for this model"))
        return out
    stacked = any(i.ep_stack for i in plan.injections or ())
    if plan.module_overrides or stacked:
        return out
    planned = [join_fqn(fqn, rel) for fqn, e in plan.entries.items() for rel in e.params or EMPTY]
    missing = uncovered(trainable_names(model), planned)
    if missing:
        listed = ", ".join(missing[:MAX_LISTED]) + (
            f" and {len(missing) - MAX_LISTED} more" if len(missing) > MAX_LISTED else "")
        out.append(error("runtime.uncovered_param", missing[0],
                         f"trainable parameters the plan does not cover: {listed}; "
                         "installed, they would train unplanned",
                         hint="regenerate the artifact for this model"))
    return out
