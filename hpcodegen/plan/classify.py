"""The one boundary classifier: forms and the collectives each transition lowers to (pure).

Used by ``inspect-plan``, by ``generate`` (to choose each class's generated forward) and by
the runtime's install-time re-validation; nothing else decides a form.

A *transition* is one named input or output moving from its ``*_src`` to its ``*_dst``
placement over the plan's mesh axes. Per decisions.md ("Forms"):

* identity: src == dst on every axis (or the axis has size 1);
* a **tp collective** when only the ``tp`` axis changes and the change is
  ``S(d)->R`` all_gather(d), ``P(sum)->R`` all_reduce(sum) or ``P(sum)->S(d)``
  reduce_scatter(d);
* anything else is **generic** (executed by ``DTensor.redistribute``); for prediction each
  generic transition also lists what DTensor would run per axis (:func:`redistribute_steps`).

The per-transition rules (:func:`classify_transition`, :func:`redistribute_steps`,
:func:`grad_steps`) are in :mod:`hpcodegen.plan.steps`; this module combines them per entry.

A boundary's form is ``region`` (a ``local_compute_fn`` injection), ``generic`` (an
``inner_wrapper`` injection, or any generic transition), ``identity`` (nothing to do) or
``tp_collective``. Entries with ``is_boundary: false`` are parameter-only (form ``params``).
An identity boundary that must still all-reduce its input gradient is promoted to
``tp_collective`` (:func:`promote_reducing_identities`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from hpcodegen.placement import REPLICATE, Placement, resolve_placements
from hpcodegen.plan.steps import (
    TP,
    OpKind,
    Step,
    StepKind,
    TPOp,
    classify_transition,
    grad_placements,
    grad_steps,
    redistribute_steps,
)
from hpcodegen.plan.types import EP, Injection, NamedPlacement, Plan, PlanEntry, Side

__all__ = [  # the step algebra lives in plan/steps.py; re-exported for existing importers
    "TP", "BoundaryForm", "Form", "OpKind", "Step", "StepKind", "TPOp", "Transition",
    "classify_boundary", "classify_memo", "classify_plan",
    "classify_transition", "enclosed_in_partial", "grad_placements", "grad_steps",
    "outputs_not_first",
    "redistribute_steps",
]

Form = Literal["region", "generic", "identity", "tp_collective", "params"]


@dataclass(frozen=True)
class Transition:
    """One named input or output of a boundary."""

    side: Literal["in", "out"]
    name: str
    src: tuple[Placement, ...]
    dst: tuple[Placement, ...]
    #: the lowered op, or None when the transition is not one tp collective (generic)
    op: TPOp | None
    #: what DTensor would run per axis (empty for identity)
    steps: tuple[Step, ...]
    #: ``"hidden_states: tp S(1) -> R ==> all_gather(dim=1)"``; "" when nothing changes
    note: str
    #: what the backward runs per axis for this transition's gradient (see ``grad_steps``)
    grad_steps: tuple[Step, ...] = ()
    #: an output of a boundary nested in one whose output is partial over tp: its
    #: replicated gradient arrives partial (``grad_placements``' ``enclosed``)
    enclosed: bool = False

    @property
    def is_identity(self) -> bool:
        return self.op is not None and self.op.kind == "identity"


@dataclass(frozen=True)
class BoundaryForm:
    """The classification of one ``param_plan`` entry."""

    fqn: str
    form: Form
    inputs: tuple[Transition, ...] = ()
    outputs: tuple[Transition, ...] = ()
    out_names: tuple[str, ...] = ()
    #: why the form is generic/region (empty otherwise)
    reasons: tuple[str, ...] = ()
    #: the injection record that applies, if any (communication inside it is opaque)
    injection: Injection | None = field(default=None, compare=False)

    @property
    def transitions(self) -> tuple[Transition, ...]:
        return self.inputs + self.outputs

    @property
    def in_ops(self) -> tuple[tuple[str, TPOp], ...]:
        """Lowered input ops, identity ones included (they unwrap)."""
        return tuple((t.name, t.op) for t in self.inputs if t.op is not None)

    @property
    def out_ops(self) -> tuple[tuple[str, TPOp], ...]:
        """Lowered output ops; identity outputs are dropped (nothing to do)."""
        return tuple(
            (t.name, t.op) for t in self.outputs if t.op is not None and not t.is_identity
        )


def outputs_not_first(form: BoundaryForm) -> tuple[str, ...]:
    """Lowered outputs that are not the forward's first return value (tuple position > 0).

    A generated tp_collective forward only transforms ``outputs[0]`` (or the single return),
    so ``generate`` emits such a boundary generic and verify's ``source`` check expects it
    generic: both ask here.
    """
    names = form.out_names
    return tuple(name for name, _ in form.out_ops if name in names and names.index(name) != 0)


def _note(name: str, src: NamedPlacement, dst: NamedPlacement, what: str) -> str:
    """Render the axes whose placements differ (a missing axis reads ``R``)."""
    parts = [f"{axis} {src.get(axis, REPLICATE)} -> {dst.get(axis, REPLICATE)}"
             for axis in sorted(set(src) | set(dst))
             if src.get(axis, REPLICATE) != dst.get(axis, REPLICATE)]
    return f"{name}: {', '.join(parts)} ==> {what}" if parts else ""


def size_one_axis(axes: Sequence[str], sizes: Mapping[str, int] | None) -> bool:
    """Some axis of ``axes`` has size 1 in ``sizes``: only then does classifying with
    ``sizes`` differ from classifying without (:func:`_degenerate`)."""
    return sizes is not None and any(sizes.get(a, 2) == 1 for a in axes)


def _degenerate(placements: tuple[Placement, ...], axes: Sequence[str],
                sizes: Mapping[str, int] | None) -> tuple[Placement, ...]:
    """On a size-1 axis every placement is Replicate (DTensor's shortcut)."""
    if not sizes:
        return placements
    return tuple(REPLICATE if sizes.get(a, 2) == 1 else p
                 for a, p in zip(axes, placements, strict=False))


def enclosed_in_partial(fqn: str, entries: Mapping[str, PlanEntry],
                        memo: dict[str, bool] | None = None) -> bool:
    """True when a module enclosing ``fqn`` (not ``fqn`` itself) is a boundary whose output
    is partial over tp: every replicated value inside it then has a partial gradient.

    ``memo`` (module FQN -> whether it or a module enclosing it is such a boundary), shared
    by the calls over one plan, makes each call walk up only to the first module seen."""
    if not fqn:
        return False
    memo = {} if memo is None else memo
    prefix, walked = fqn.rpartition(".")[0], []
    while True:  # the enclosing modules, innermost first, up to the root ""
        hit = memo.get(prefix)
        if hit is None:
            outer = entries.get(prefix)
            if outer is not None and outer.boundary and outer.partial_output():
                hit = True
            elif not prefix:
                hit = False
        if hit is not None:
            break
        walked.append(prefix)
        prefix = prefix.rpartition(".")[0]
    memo[prefix] = hit
    memo.update(dict.fromkeys(walked, hit))
    return hit


def _transitions(entry: PlanEntry, side: Side, axes: Sequence[str],
                 sizes: Mapping[str, int] | None, enclosed: bool = False
                 ) -> tuple[Transition, ...]:
    split = entry.splits_compute()
    enclosed = enclosed and side == "out"
    out: list[Transition] = []
    for planned in entry.transitions(side):
        src = _degenerate(resolve_placements(planned.src, axes), axes, sizes)
        dst = _degenerate(resolve_placements(planned.dst, axes), axes, sizes)
        op = classify_transition(src, dst, axes)
        identity = op is not None and op.kind == "identity"
        steps = () if identity else redistribute_steps(src, dst, axes)
        what = str(op) if op is not None else "dtensor redistribute"
        note = "" if identity else _note(planned.name, planned.src, planned.dst, what)
        grad, target = grad_placements(side, src, dst, axes, split, enclosed)
        back = redistribute_steps(_degenerate(grad, axes, sizes), target, axes)
        out.append(Transition(side, planned.name, src, dst, op, steps, note, back, enclosed))
    return tuple(out)


def _ep_changes(entry: PlanEntry) -> bool:
    """True when an ``ep`` placement changes between src and dst on either side."""
    return any(t.src.get(EP, REPLICATE) != t.dst.get(EP, REPLICATE)
               for side in ("in", "out") for t in entry.transitions(side))


def classify_boundary(
    fqn: str,
    entry: PlanEntry,
    axes: Sequence[str] | None,
    injection: Injection | None = None,
    sizes: Mapping[str, int] | None = None,
    enclosed: bool = False,
) -> BoundaryForm:
    """Classify one ``param_plan`` entry over the mesh ``axes``.

    Args:
        fqn: the entry's module FQN (for the result only).
        entry: the typed ``param_plan`` entry.
        axes: the ordered active mesh axes (the plan's ``mesh_dim_names`` or a live mesh).
        injection: the entry's injection record (:meth:`Plan.injections_by_fqn`), if any.
        sizes: axis sizes; an axis of size 1 makes every transition on it identity.
        enclosed: the entry is nested in a boundary whose output is partial over tp
            (:func:`enclosed_in_partial`): its replicated outputs get partial gradients.

    Returns:
        The form, each transition with its lowered op (or None) and its DTensor steps.
    """
    names = entry.output_names
    if not entry.boundary:
        return BoundaryForm(fqn, "params", out_names=names, injection=injection)
    axes = tuple(axes or ())
    if injection is not None and injection.local_compute_fn is not None:
        inputs = _transitions(entry, "in", axes, sizes)
        outputs = _transitions(entry, "out", axes, sizes, enclosed)
        return BoundaryForm(fqn, "region", inputs, outputs, names,
                            ("local_compute_fn injection",), injection)
    reasons: list[str] = []
    if injection is not None and injection.inner_wrapper:
        reasons.append("inner_wrapper injection")
    if not axes:
        if _ep_changes(entry):
            reasons.append("ep placement changes")
        form: Form = "generic" if reasons else "identity"
        return BoundaryForm(fqn, form, (), (), names, tuple(reasons), injection)
    inputs = _transitions(entry, "in", axes, sizes)
    outputs = _transitions(entry, "out", axes, sizes, enclosed)
    for t in inputs + outputs:
        if t.op is None:
            reasons.append(f"{t.side}put {t.name!r} is not one tp collective")
    if reasons:
        form = "generic"
    elif all(t.is_identity for t in inputs + outputs):
        form = "identity"
    else:
        form = "tp_collective"
    return BoundaryForm(fqn, form, inputs, outputs, names, tuple(reasons), injection)


def classify_plan(
    plan: Plan,
    axes: Sequence[str] | None = None,
    sizes: Mapping[str, int] | None = None,
) -> dict[str, BoundaryForm]:
    """Classify every ``param_plan`` entry of a plan (its own axes unless ``axes`` is given).

    Example::

        forms = classify_plan(load_checked_meta("examples/llama_tp2").plan)
        forms["model.layers.0.self_attn"].form          # "tp_collective"
    """
    use_axes = tuple(axes) if axes is not None else plan.axes
    injections = plan.injections_by_fqn()
    entries = plan.entries
    memo: dict[tuple[object, ...], BoundaryForm] = {}
    enclosed: dict[str, bool] = {}
    return promote_reducing_identities({
        fqn: classify_memo(memo, fqn, entry, use_axes, injections.get(fqn), sizes,
                           enclosed_in_partial(fqn, entries, enclosed))
        for fqn, entry in entries.items()
    }, entries)


def _reduces_input_grad(form: BoundaryForm) -> bool:
    return any(s.communicates for t in form.inputs for s in t.grad_steps)


def promote_reducing_identities(forms: dict[str, BoundaryForm],
                                entries: Mapping[str, PlanEntry]) -> dict[str, BoundaryForm]:
    """An ``identity`` boundary whose input gradient must still be all-reduced becomes a
    ``tp_collective`` (in place; returns ``forms``).

    That is a boundary splitting compute over tp with a replicated input and outputs that
    stay as they are: a column-parallel LM head keeping its logits vocab-sharded (loss
    parallel). Forward it does nothing, but the input's gradient is partial. It is left
    ``identity`` when an enclosing boundary that runs (not identity) splits compute too: that
    one reduces the gradient of its own input, and reducing twice would double it.
    """
    def runs_and_splits(fqn: str) -> bool:
        f = forms.get(fqn)
        return f is not None and f.form in ("tp_collective", "generic", "region") \
            and fqn in entries and entries[fqn].splits_compute()

    for fqn in sorted(forms, key=lambda f: (f.count(".") + bool(f), f)):
        f = forms[fqn]
        if f.form != "identity" or not _reduces_input_grad(f):
            continue
        parts = fqn.split(".")
        ancestors = [""] + [".".join(parts[:i]) for i in range(1, len(parts))] if fqn else []
        if any(runs_and_splits(a) for a in ancestors):
            continue
        forms[fqn] = BoundaryForm(fqn, "tp_collective", f.inputs, f.outputs, f.out_names,
                                  f.reasons, f.injection)
    return forms


def _memo_key(entry: PlanEntry, injection: Injection | None,
              enclosed: bool) -> tuple[object, ...]:
    """Everything the form depends on, the entry's FQN and the record's ``match`` aside:
    repeated layers share one key."""
    record = None if injection is None else (
        injection.inner_wrapper, injection.inner_target, injection.inner_out_src,
        injection.inner_in_src, injection.inner_in_dst, injection.inner_out_dst,
        injection.cp_heads, injection.local_compute_fn,
        injection.ep_stack, injection.ep_size, injection.extra)
    return (entry.params, entry.in_src, entry.in_dst, entry.out_src, entry.out_dst,
            entry.out_names, entry.is_boundary, record, enclosed)


def classify_memo(
    memo: dict[tuple[object, ...], BoundaryForm],
    fqn: str,
    entry: PlanEntry,
    axes: Sequence[str],
    injection: Injection | None = None,
    sizes: Mapping[str, int] | None = None,
    enclosed: bool = False,
) -> BoundaryForm:
    """:func:`classify_boundary` with a per-plan memo: repeated layers are classified once.

    The form depends on the FQN only through the field it is stored in, so entries with the
    same content (every layer of a model) share one classification. ``memo`` must only be
    reused for the same ``axes`` and ``sizes``.
    """
    key = _memo_key(entry, injection, enclosed)
    hit = memo.get(key)
    if hit is None:
        hit = memo[key] = classify_boundary(fqn, entry, axes, injection, sizes, enclosed)
    if hit.fqn == fqn:
        return hit
    return BoundaryForm(fqn, hit.form, hit.inputs, hit.outputs, hit.out_names, hit.reasons,
                        hit.injection)
