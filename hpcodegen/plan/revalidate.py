"""Install-time re-validation: which boundaries change form on a live mesh (pure).

A plan is frozen for one mesh (``mesh_dim_names``, ``parallel_dims``); it may be installed on
another. The runtime slices the live mesh to the plan's axes (kept in the live order; an axis
the live mesh lacks is dropped), classifies every boundary again over those axes and sizes
(a size-1 axis makes every transition on it identity), and then decides per form:

* frozen ``tp_collective``: the lowered ops are bound only when ``tp`` is a live axis and the
  live classification is ``tp_collective`` with the *same* ops; otherwise the generic engine
  replaces the forward (``effective_form == "generic"``);
* frozen ``generic`` / ``region``: the generic engine compiles the live transitions;
* frozen ``identity`` / ``params``: the forward is untouched whatever the live mesh says;
* no plan axis of size > 1 on the live mesh (:func:`active_plan_axes` is empty): nothing is
  installed, every forward runs as generated (effective ``identity``).

``inspect-plan --mesh`` shows this; the runtime calls :func:`revalidate` to decide the same.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hpcodegen.plan.classify import TP, BoundaryForm, classify_plan
from hpcodegen.plan.types import Plan


@dataclass(frozen=True)
class FormChange:
    """One boundary whose live classification differs from the frozen one.

    Attributes:
        fqn: the boundary's module FQN.
        frozen_form: the form the artifact was generated with.
        live_form: the classifier's form over the live axes and sizes.
        effective_form: what the runtime executes (``generic`` for a refused tp_collective).
        reason: one sentence, for people.
    """

    fqn: str
    frozen_form: str
    live_form: str
    effective_form: str
    reason: str

    def to_json(self) -> dict[str, str]:
        return {"fqn": self.fqn, "frozen_form": self.frozen_form, "live_form": self.live_form,
                "effective_form": self.effective_form, "reason": self.reason}


def live_plan_axes(plan: Plan, live_axes: Sequence[str]) -> tuple[str, ...]:
    """The live axes the plan resolves over: the plan's axes in the live order.

    A plan without ``mesh_dim_names`` (legacy: "use the full mesh") takes every live axis.
    """
    frozen = plan.mesh_dim_names
    if frozen is None:
        return tuple(live_axes)
    return tuple(axis for axis in live_axes if axis in frozen)


#: Axes owned by data parallelism / FSDP / pipelining: never axes a plan installs over.
FSDP_AXES = frozenset({"dp", "dp_replicate", "dp_shard", "pp", "fsdp_replicate", "fsdp_shard",
                       "edp", "edp_replicate", "edp_shard"})


def active_plan_axes(plan: Plan, live_axes: Sequence[str],
                     live_sizes: Mapping[str, int]) -> tuple[str, ...]:
    """The axes the runtime installs the plan over: plan axes, live order, size > 1.

    Empty means the install is an exact no-op (a tp=1 mesh, or none of the plan's axes).
    """
    return tuple(a for a in live_plan_axes(plan, live_axes)
                 if a not in FSDP_AXES and live_sizes.get(a, 1) > 1)


def _ops(bf: BoundaryForm) -> tuple[Any, ...]:
    return (bf.in_ops, bf.out_ops)


def decide(frozen: BoundaryForm, live: BoundaryForm,
           axes: Sequence[str]) -> tuple[str, FormChange | None]:
    """The effective form of one boundary on the live mesh, and the change if any."""
    fqn = frozen.fqn
    if frozen.form == "tp_collective":
        if live.form == "identity":  # e.g. a tp-1 plan on a live cp mesh: no-op collectives
            return "identity", FormChange(fqn, frozen.form, live.form, "identity",
                                          "every transition is identity on the live mesh: "
                                          "the generated forward's collectives stay no-ops")
        if TP not in axes:
            return "generic", FormChange(fqn, frozen.form, live.form, "generic",
                                         "tp is not a live axis: no lowerer, generic engine")
        if live.form != "tp_collective" or _ops(live) != _ops(frozen):
            why = (f"live form is {live.form}" if live.form != "tp_collective"
                   else "live ops differ from the frozen ops")
            return "generic", FormChange(fqn, frozen.form, live.form, "generic",
                                         f"{why}: the generic engine replaces the forward")
        return "tp_collective", None
    if frozen.form in ("identity", "params"):
        if live.form != frozen.form and frozen.form == "identity":
            return "identity", FormChange(
                fqn, frozen.form, live.form, "identity",
                "frozen as identity: the forward runs untouched although the live mesh "
                "would need transitions (regenerate for this mesh)")
        return frozen.form, None
    if live.form != frozen.form:
        return frozen.form, FormChange(fqn, frozen.form, live.form, frozen.form,
                                       f"live classification is {live.form}; the generic "
                                       "engine still runs the live transitions")
    return frozen.form, None


def revalidate_forms(frozen: Mapping[str, BoundaryForm], live: Mapping[str, BoundaryForm],
                     axes: Sequence[str], ep_live: bool = False
                     ) -> tuple[dict[str, str], list[FormChange]]:
    """Effective form per FQN and the changes, from two classifications of the same plan.

    ``ep_live``: the live mesh has an ``ep`` axis of size > 1 for an ``--ep`` plan; with no
    dense axis left the runtime then installs the regions only (the expert dispatch)."""
    effective: dict[str, str] = {}
    changes: list[FormChange] = []
    for fqn, bf in frozen.items():
        if fqn not in live:
            continue
        if not axes and ep_live and bf.form == "region":
            effective[fqn] = "region"
            continue
        if not axes:  # the runtime installs nothing: every forward runs as generated
            effective[fqn] = "identity" if bf.form != "params" else "params"
            if bf.form not in ("identity", "params"):
                changes.append(FormChange(fqn, bf.form, live[fqn].form, "identity",
                                          "no plan axis of size > 1 on the live mesh: "
                                          "the install is an exact no-op"))
            continue
        form, change = decide(bf, live[fqn], axes)
        effective[fqn] = form
        if change is not None:
            changes.append(change)
    return effective, changes


def revalidate(plan: Plan, live_axes: Sequence[str],
               live_sizes: Mapping[str, int]) -> list[FormChange]:
    """The boundaries whose form changes when the plan is installed on a live mesh.

    Args:
        plan: the artifact's typed plan.
        live_axes: the live mesh's axis names, in its order (e.g. ``("dp", "cp", "tp")``).
        live_sizes: the size of each live axis.

    Returns:
        One :class:`FormChange` per boundary that changes; empty when the plan fits as frozen.

    Example::

        changes = revalidate(plan, ("tp",), {"tp": 1})
        [c.fqn for c in changes if c.effective_form == "generic"]
    """
    axes = active_plan_axes(plan, live_axes, live_sizes)
    frozen = classify_plan(plan)
    live = classify_plan(plan, axes, live_sizes)
    return revalidate_forms(frozen, live, axes)[1]
