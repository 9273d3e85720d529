"""Predict every collective a frozen plan runs, per boundary, forward and backward (pure).

``inspect-plan`` shows this; the runtime's comm-count tests compare against it. The rules
follow what the runtime executes, form by form (design.md, decisions.md "Forms"):

* ``tp_collective``: one lowered op per transition (identity inputs only unwrap; identity
  outputs are dropped);
* ``generic`` / ``region``: DTensor's redistribute steps per transition
  (:func:`~hpcodegen.plan.classify.redistribute_steps`); communication *inside* an
  injected callable (``local_compute_fn``, ``inner_wrapper``) is opaque and only listed;
* ``identity`` / ``params``: the forward is untouched, nothing runs.

The backward of each executed transition is its ``Transition.grad_steps`` (the one rule the
runtime's autograd uses). A ``chunk`` is local (no communication) and is not counted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hpcodegen.errors import Finding, warning
from hpcodegen.placement import REPLICATE
from hpcodegen.plan.classify import TP, BoundaryForm, Step, Transition, classify_plan
from hpcodegen.plan.cp import (
    CP,
    CP_WRAPPER_NAMES,
    kv_backward_steps,
    kv_forward_steps,
    kv_transitions,
)
from hpcodegen.plan.entry import INJECTED_CALLABLES, takes_token_ids
from hpcodegen.plan.estimated import (
    CONTEXT_PARALLEL,
    EXPERT_PARALLEL,
    estimate_note,
    estimated_dispatch,
    estimated_kv_transitions,
    estimated_kv_wrapper,
)
from hpcodegen.plan.frozen import EMPTY
from hpcodegen.plan.moe import (
    dispatch_ops,
    ep_dispatch_size,
    gathers_over_tp,
    is_ep_dispatch,
    target_name,
)
from hpcodegen.plan.norms import is_sharded_norm
from hpcodegen.plan.types import Injection, Plan

#: forms whose forward the runtime rewrites (identity and params run untouched)
EXECUTED_FORMS = ("tp_collective", "generic", "region")


@dataclass(frozen=True, slots=True)
class PredOp:
    """One predicted operation on one named input or output.

    ``kind`` is ``identity`` (unwrap only), ``chunk`` (local split), ``invalid`` (torch
    refuses it) or a collective: ``all_gather``, ``all_reduce``, ``reduce_scatter``,
    ``all_to_all``. ``axis`` is the mesh axis it runs on (None for identity).
    """

    name: str
    kind: str
    dim: int | None = None
    axis: str | None = None
    reduce_op: str | None = None

    @property
    def communicates(self) -> bool:
        return self.kind not in ("identity", "chunk", "invalid")

    def label(self) -> str:
        """``hidden_states: all_gather(tp, dim=1)``."""
        if self.kind == "identity":
            return f"{self.name}: to_local"
        args = [a for a in (self.axis, None if self.dim is None else f"dim={self.dim}",
                            self.reduce_op if self.kind == "all_reduce" else None) if a]
        return f"{self.name}: {self.kind}({', '.join(args)})"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "dim": self.dim, "axis": self.axis,
                "reduce_op": self.reduce_op}


@dataclass(frozen=True)
class BoundaryPrediction:
    """What one ``param_plan`` entry runs: forward ops per side, backward ops, notes."""

    fqn: str
    cls: str | None
    form: str
    in_ops: tuple[PredOp, ...] = ()
    out_ops: tuple[PredOp, ...] = ()
    grad_ops: tuple[PredOp, ...] = ()
    notes: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()
    #: ``(kind, target)`` of an injected callable whose communication is opaque
    opaque: tuple[tuple[str, str], ...] = ()
    #: ``partial_grad_params``: replicated parameters whose gradient the runtime all-reduces
    #: over tp after the backward (decisions.md item 6), one all_reduce each
    grad_sync: tuple[str, ...] = ()
    #: the executed transitions (for the volume estimate)
    transitions: tuple[Transition, ...] = field(default=(), compare=False)
    #: ``(kind, note)`` of the collectives counted by estimate: the existing system's own
    #: factories (:mod:`hpcodegen.plan.estimated`), whose code is not read
    estimated: tuple[tuple[str, str], ...] = ()

    def signature(self) -> tuple[Any, ...]:
        """Everything a folded row shows; equal signatures fold together."""
        return (self.cls, self.form, self.in_ops, self.out_ops, self.grad_ops, self.notes,
                self.reasons, self.opaque, self.grad_sync)


def _step_op(name: str, step: Step) -> PredOp:
    return PredOp(name, step.kind, step.dim, step.axis, step.reduce_op)


def _forward_ops(bf: BoundaryForm, form: str) -> tuple[tuple[PredOp, ...], tuple[PredOp, ...]]:
    if form not in EXECUTED_FORMS:
        return (), ()
    ins: list[PredOp] = []
    outs: list[PredOp] = []
    for t in bf.transitions:
        target = ins if t.side == "in" else outs
        if form == "tp_collective" and t.op is not None:
            if t.is_identity:
                if t.side == "in":
                    ins.append(PredOp(t.name, "identity"))
                continue
            target.append(PredOp(t.name, t.op.kind, t.op.dim, TP, t.op.reduce_op))
        elif not t.steps:
            if t.side == "in":
                ins.append(PredOp(t.name, "identity"))
        else:
            target.extend(_step_op(t.name, s) for s in t.steps)
    return tuple(ins), tuple(outs)


def executed_transitions(bf: BoundaryForm, form: str) -> tuple[Transition, ...]:
    """The transitions the runtime executes: every input, the non-identity outputs."""
    if form not in EXECUTED_FORMS:
        return ()
    return tuple(t for t in bf.transitions
                 if t.side == "in" or (t.steps if t.op is None else not t.is_identity))


def _opaque(injection: Injection | None, cp_live: bool = False
            ) -> tuple[tuple[str, str], ...]:
    if injection is None:
        return ()
    out = []
    for key in INJECTED_CALLABLES:
        name = target_name(getattr(injection, key))
        if key == "local_compute_fn" and (is_ep_dispatch(injection)
                                          or is_sharded_norm(injection)):
            continue  # hpcodegen's own dispatch: its collectives are predicted (plan.moe)
        if key == "inner_wrapper" and name in CP_WRAPPER_NAMES and \
                (cp_live or not kv_transitions(injection)):
            continue  # hpcodegen's CP attention: its K/V gathers are predicted (plan.cp)
        if (key == "local_compute_fn" and estimated_dispatch(injection)) or \
                (key == "inner_wrapper" and cp_live and estimated_kv_wrapper(injection)):
            continue  # the existing system's factories: estimated (plan.estimated)
        if name:
            out.append((key, name))
    return tuple(out)


def _cp_ops(injection: Injection | None
            ) -> tuple[tuple[PredOp, ...], tuple[PredOp, ...], tuple[PredOp, ...]]:
    """The transitions over cp inside a CP attention (:mod:`hpcodegen.plan.cp`): forward
    the kernel inputs' ops (K/V all_gathers; Ulysses' Q/K/V all_to_alls), then the output's
    (Ulysses' all_to_all back), and backward their mirrors, one per tensor and (sub-)axis.
    The hybrid's sub-groups are groups of the cp axis: the ops are on ``cp``. The existing
    system's own context-parallel factory is taken to gather K/V (plan.estimated)."""
    ins, outs, bwd = [], [], []
    for t in kv_transitions(injection) or estimated_kv_transitions(injection):
        fwd = [PredOp(t.name, s.kind, s.dim, CP, s.reduce_op) for s in kv_forward_steps(t)]
        (outs if t.side == "out" else ins).extend(fwd)
        bwd.extend(PredOp(t.name, s.kind, s.dim, CP, s.reduce_op) for s in kv_backward_steps(t))
    return tuple(ins), tuple(outs), tuple(bwd)


def predict_boundary(bf: BoundaryForm, cls: str | None = None,
                     form: str | None = None,
                     grad_sync: Sequence[str] = (),
                     no_grad: Sequence[str] = (),
                     dispatch: tuple[bool, bool, bool] = (True, False, True),
                     cp_live: bool = False) -> BoundaryPrediction:
    """Predict one classified boundary; ``form`` overrides the executed form (re-validation).

    ``grad_sync`` are the entry's ``effective_partial_grad_params`` when tp is live (size > 1);
    ``no_grad`` its ``no_grad_inputs`` (integer inputs: no backward op); ``dispatch``, for an
    expert-parallel region, ``(ep live, gathers over tp)`` (:func:`~hpcodegen.plan.moe.
    dispatch_ops`), then whether tp is live (a split norm's all_reduces); ``cp_live``: cp
    is a live axis, so a CP attention's K/V gathers run (in any form: the wrapper runs
    inside the module's own forward).
    """
    form = form or bf.form
    ins, outs = _forward_ops(bf, form)
    executed = executed_transitions(bf, form)
    # token ids and expert indices carry no gradient: no backward op for those inputs
    grads = tuple(_step_op(t.name, s) for t in executed for s in t.grad_steps
                  if not (t.side == "in" and (takes_token_ids(cls) or t.name in no_grad)))
    if form == "region" and is_ep_dispatch(bf.injection):
        # the dispatch runs between the input and output transitions (plan.moe)
        forward, backward = dispatch_ops(*dispatch[:2])
        ins += tuple(PredOp(o.name, o.kind, None, o.axis) for o in forward if o.side == "in")
        outs = tuple(PredOp(o.name, o.kind, None, o.axis) for o in forward
                     if o.side == "out") + outs
        grads = tuple(PredOp(o.name, o.kind, None, o.axis) for o in backward) + grads
    foreign = estimated_dispatch(bf.injection)
    estimates: tuple[tuple[str, str], ...] = ()
    if foreign and dispatch[0]:
        # the existing system's expert compute, in any form: its all_to_alls, estimated
        forward, backward = dispatch_ops(True, False)
        ins += tuple(PredOp(o.name, o.kind, None, o.axis) for o in forward if o.side == "in")
        outs = tuple(PredOp(o.name, o.kind, None, o.axis) for o in forward
                     if o.side == "out") + outs
        grads = tuple(PredOp(o.name, o.kind, None, o.axis) for o in backward) + grads
        estimates += ((EXPERT_PARALLEL, estimate_note(EXPERT_PARALLEL, foreign)),)
    if form == "region" and is_sharded_norm(bf.injection) and dispatch[2]:
        # the split norm sums each token's squares over tp, forward and backward (plan.norms)
        ins += (PredOp("sum_of_squares", "all_reduce", None, TP, "sum"),)
        grads = (PredOp("sum_of_squares", "all_reduce", None, TP, "sum"), *grads)
    notes = tuple(t.note for t in bf.transitions if t.note)
    if cp_live:
        kv_in, kv_out, kv_bwd = _cp_ops(bf.injection)
        ins, outs, grads = ins + kv_in, kv_out + outs, kv_bwd + grads
        notes += tuple(f"{t.name}: {t.axis} {t.src} -> {t.dst} inside the attention ==> "
                       + ", ".join(str(s) for s in kv_forward_steps(t))
                       for t in kv_transitions(bf.injection))
        wrapper = estimated_kv_wrapper(bf.injection)
        if wrapper and kv_in:
            estimates += ((CONTEXT_PARALLEL, estimate_note(CONTEXT_PARALLEL, wrapper)),)
    return BoundaryPrediction(bf.fqn, cls, form, ins, outs, grads,
                              notes + tuple(note for _, note in estimates),
                              bf.reasons, _opaque(bf.injection, cp_live), tuple(grad_sync),
                              executed, estimates)


def predict_forms(plan: Plan, forms: Mapping[str, BoundaryForm],
                  effective: Mapping[str, str] | None = None,
                  tp_live: bool = True, ep_live: bool | None = None,
                  cp_live: bool | None = None
                  ) -> list[BoundaryPrediction]:
    """Predictions for classified entries, in plan order.

    ``tp_live``: tp is a mesh axis of size > 1, so the ``effective_partial_grad_params`` (the
    declared ``partial_grad_params`` and the partial deferred biases) are synced.
    ``ep_live``: an ep axis of size > 1 runs the expert dispatch's all_to_alls (None: the
    frozen ``ep_size`` of each dispatch injection says).
    ``cp_live``: cp is a mesh axis of size > 1 (default: as frozen), so every CP attention
    gathers K/V and the model's forward gathers the batch's per-token inputs once
    (:func:`cp_batch_prediction`).
    """
    if cp_live is None:
        cp_live = plan.dims.size(CP) > 1 and CP in plan.axes
    classes = plan.boundary_classes or EMPTY
    effective = effective or {}
    entries = plan.entries
    memo: dict[tuple[Any, ...], BoundaryPrediction] = {}
    #: gathers_over_tp by the identity of the fields it reads: entries of equal content
    #: share them (the codec parses each distinct entry once), and the plan holds them
    gathers: dict[tuple[int, int], bool] = {}
    out: list[BoundaryPrediction] = []
    for fqn, bf in forms.items():
        cls, form, entry = classes.get(fqn), effective.get(fqn), entries.get(fqn)
        sync = entry.effective_partial_grad_params() if tp_live and entry is not None else ()
        no_grad = (entry.no_grad_inputs or ()) if entry is not None else ()
        ep = ep_live if ep_live is not None else (
            ep_dispatch_size(bf.injection) > 1 or estimated_dispatch(bf.injection) is not None)
        gather = False
        if tp_live and entry is not None:
            seen = (id(entry.in_dst), id(entry.params))
            gather = gathers.get(seen)
            if gather is None:
                gather = gathers[seen] = gathers_over_tp(entry)
        dispatch = (ep, gather, tp_live)
        # memo classifications share their transition tuples: repeated layers predict once
        key = (id(bf.inputs), id(bf.outputs), id(bf.injection), bf.form, bf.reasons, cls, form,
               sync, no_grad, dispatch)
        hit = memo.get(key)
        if hit is None:
            hit = memo[key] = predict_boundary(bf, cls, form, sync, no_grad, dispatch,
                                               cp_live)
        out.append(hit if hit.fqn == fqn else _renamed(hit, fqn))
    if cp_live and any(kv_transitions(bf.injection) for bf in forms.values()):
        out.append(cp_batch_prediction(plan))
    return out


def cp_batch_prediction(plan: Plan) -> BoundaryPrediction:
    """The model's root forward under cp: the batch's position ids (or its padding mask,
    when one is passed) all-gathered once per forward over cp, for the masks
    (:mod:`hpcodegen.runtime.cp.context`); no backward (integers)."""
    return BoundaryPrediction(
        "", plan.provenance.model_class, "cp_batch",
        (PredOp("position_ids|attention_mask", "all_gather", 1, CP),),
        notes=("the batch's position ids, or its padding mask when one is passed, gathered "
               "over cp once per forward to build the mask rows at global positions",))


def _renamed(p: BoundaryPrediction, fqn: str) -> BoundaryPrediction:
    return BoundaryPrediction(fqn, p.cls, p.form, p.in_ops, p.out_ops, p.grad_ops, p.notes,
                              p.reasons, p.opaque, p.grad_sync, p.transitions, p.estimated)


@dataclass(frozen=True)
class Summary:
    """Boundaries per form, collectives per forward/backward, opaque injected callables."""

    forms: dict[str, int]
    per_forward: dict[tuple[str, str, int | None], int]
    per_backward: dict[tuple[str, str, int | None], int]
    #: ``(kind, target) -> [fqn]``
    opaque: dict[tuple[str, str], list[str]]
    #: gradient all-reduces of ``partial_grad_params`` per backward (not boundary
    #: transitions): one flattened all_reduce on tp for all of them (one per parameter dtype
    #: at run time; a model in one dtype has one), :mod:`hpcodegen.runtime.grad_buckets`
    grad_sync: dict[tuple[str, str, int | None], int] = field(default_factory=dict)
    #: how many parameter instances that all_reduce sums
    grad_sync_params: int = 0
    #: ops torch would refuse (redistribute to Partial), as warnings
    problems: tuple[Finding, ...] = ()
    #: ``note -> [fqn]``: collectives counted by estimate (:mod:`hpcodegen.plan.estimated`)
    estimated: dict[str, list[str]] = field(default_factory=dict)


def _count(ops: Iterable[PredOp], into: Counter[tuple[str, str, int | None]]) -> None:
    for op in ops:
        if op.communicates:
            into[(op.kind, op.axis or "", op.dim)] += 1


def summarize(preds: Sequence[BoundaryPrediction]) -> Summary:
    """Count per form and per (kind, axis, dim); every boundary instance counts once."""
    forms: Counter[str] = Counter()
    fwd: Counter[tuple[str, str, int | None]] = Counter()
    bwd: Counter[tuple[str, str, int | None]] = Counter()
    opaque: dict[tuple[str, str], list[str]] = {}
    estimated: dict[str, list[str]] = {}
    problems: list[Finding] = []
    sync = sum(len(p.grad_sync) for p in preds)
    for p in preds:
        forms[p.form] += 1
        _count(p.in_ops + p.out_ops, fwd)
        _count(p.grad_ops, bwd)
        for key in p.opaque:
            opaque.setdefault(key, []).append(p.fqn)
        for _, note in p.estimated:
            estimated.setdefault(note, []).append(p.fqn)
        problems.extend(
            warning("inspect.invalid_redistribute", p.fqn,
                    f"{op.name}: torch refuses this redistribution ({op.axis})")
            for op in p.in_ops + p.out_ops if op.kind == "invalid")
    return Summary(forms=dict(forms), per_forward=_sorted(fwd), per_backward=_sorted(bwd),
                   opaque=opaque, problems=tuple(problems),
                   grad_sync={("all_reduce", TP, None): 1} if sync else {},
                   grad_sync_params=sync, estimated=estimated)


def _sorted(counts: Counter[tuple[str, str, int | None]]) -> dict[tuple[str, str, int | None], int]:
    return dict(sorted(counts.items(), key=lambda kv: (kv[0][0], kv[0][1],
                                                       -1 if kv[0][2] is None else kv[0][2])))


def frozen_sizes(plan: Plan) -> dict[str, int] | None:
    """The frozen axis sizes when some plan axis is larger than 1 (a size-1 axis of such a
    plan is live nowhere: cp 2 x tp 1 runs no tp collective); None when every axis is 1
    (then the prediction shows what a larger live mesh runs, as inspect-plan says)."""
    sizes = dict(plan.dims.sizes)
    return sizes if any(sizes.get(a, 1) > 1 for a in plan.axes) else None


def predict_plan(plan: Plan) -> list[BoundaryPrediction]:
    """Predict a plan as frozen (its own axes and sizes, :func:`frozen_sizes`).

    Example::

        summarize(predict_plan(load_checked_meta("examples/llama_tp2").plan)).per_forward
    """
    sizes = frozen_sizes(plan)
    tp_live = sizes is None or sizes.get(TP, 1) > 1
    return predict_forms(plan, classify_plan(plan, sizes=sizes), tp_live=tp_live)


def _ancestors(fqn: str) -> list[str]:
    """Enclosing module FQNs, nearest first, the root ``""`` last (``fqn`` itself excluded)."""
    parts = fqn.split(".")
    return [".".join(parts[:i]) for i in range(len(parts) - 1, -1, -1)]


def unreduced_grad_findings(plan: Plan, preds: Sequence[BoundaryPrediction],
                            tp_live: bool) -> list[Finding]:
    """Warn where a backward would silently lose the tp sum of an input gradient.

    A boundary that splits compute over tp (tp-sharded parameter or tp-Partial output) gets a
    *partial* gradient for every input it takes replicated on tp. A ``tp_collective`` or
    generic boundary all-reduces it (its input's ``grad_steps``); an ``identity`` boundary
    runs untouched, so unless an enclosing executed boundary splits compute too, nothing
    reduces it and every gradient upstream is wrong by the other ranks' share. One warning
    per class and input name.
    """
    if not tp_live:
        return []
    entries = plan.entries
    executed = {p.fqn for p in preds if p.form in EXECUTED_FORMS}
    hits: dict[tuple[str | None, str], list[str]] = {}
    for p in preds:
        entry = entries.get(p.fqn)
        if p.form != "identity" or takes_token_ids(p.cls) or entry is None:
            continue
        names = [name for name, named in (entry.in_dst or EMPTY).items()
                 if named.get(TP, REPLICATE) == REPLICATE]
        if not names or not entry.splits_compute():
            continue
        if any(a in executed and a in entries and entries[a].splits_compute()
               for a in _ancestors(p.fqn)):
            continue
        for name in names:
            hits.setdefault((p.cls, name), []).append(p.fqn)
    return [warning("inspect.unreduced_input_grad", fqns[0],
                    f"identity boundary splits compute over tp, so the gradient of its "
                    f"replicated input {name!r} is partial and nothing all-reduces it "
                    f"({len(fqns)} instance(s){f' of {cls}' if cls else ''})",
                    hint="declare a transition on this boundary (e.g. an output all_gather) "
                         "so it is executed, or make an enclosing boundary split compute")
            for (cls, name), fqns in hits.items()]
