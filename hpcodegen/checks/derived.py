"""Compare what the meta declares with what propagation derived (pure: no torch).

:func:`hpcodegen.derive.propagate.derive` ran the model's forward and backward on DTensors
of the plan's placements; this module turns each disagreement into a finding with the JSON
pointer of the declaration and the derived value:

* ``derive.output``: a boundary output declared (``out_src``) otherwise than computed;
* ``derive.input``: an input declared (``in_src``) otherwise than it arrives;
* ``derive.local_compute``: an op inside (or between) boundaries whose operands DTensor had
  to redistribute first: the runtime runs that code on local shards without the
  collective, so it fails on shapes or computes a wrong value (an output projection split
  on the wrong dim, a replicated bias added to a partial sum: ``tp_rank0_params`` missing,
  or listed where nothing is partial);
* ``derive.partial_grad``: a replicated parameter whose gradient is partial over tp but
  which the runtime does not sum (not in :meth:`~hpcodegen.plan.types.PlanEntry.
  effective_partial_grad_params`), or one it sums whose gradient is whole or sharded.
  In a meta of another generator the verdict says what hpcodegen's runtime does with it
  and what the other system's runtime must do; a gradient hpcodegen's runtime would leave
  partial is a warning there (it trains wrong silently), an error in ours.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from hpcodegen.derive.record import Derivation, ImplicitComm
from hpcodegen.errors import Finding, error, info, pointer, warning
from hpcodegen.placement import (
    REPLICATE,
    Placement,
    Shard,
    StridedShard,
    is_shard,
    parse_placement,
    with_dims_mod,
)
from hpcodegen.plan.entry import join_fqn
from hpcodegen.plan.frozen import EMPTY
from hpcodegen.plan.partial_grads import runtime_summed
from hpcodegen.plan.types import TP, Plan


def _norm(p: Placement, ndim: int) -> str:
    return str(with_dims_mod(p, ndim))


def _declared(named: Mapping[str, Placement] | None, axes: list[str], ndim: int
              ) -> dict[str, str]:
    return {a: _norm((named or EMPTY).get(a, REPLICATE), ndim) for a in axes}


def _show(named: Mapping[str, str]) -> str:
    return ", ".join(f"{a}: {p}" for a, p in named.items())


def placement_findings(plan: Plan, d: Derivation) -> Iterator[Finding]:
    """``derive.output`` and ``derive.input``.

    Where DTensor replicated an input that the declaration (and each rank's local code)
    keeps sharded, an op had no rule for the local layout (an MoE router's matmul and top-k
    over tokens flattened from a sequence shard gathers in the derivation, while each rank
    routes its own tokens): from that boundary on, in forward order, what the derivation
    says of placements no longer describes the local run, so those boundaries are left to
    the rules (``derive.input_unresolved``, one info) instead of being judged.
    """
    order: dict[str, int] = {}
    for fqn, _name in d.inputs:
        order.setdefault(fqn, len(order))
    gap: tuple[int, str] | None = None
    inputs: list[tuple[str, str, str, dict[str, str], dict[str, str]]] = []
    for (fqn, name), got in d.inputs.items():
        entry = plan.entries.get(fqn)
        if entry is None or name not in (entry.in_src or EMPTY):
            continue
        want = {a: str((entry.in_src or EMPTY)[name].get(a, REPLICATE)) for a in got}
        differ = [a for a in got if not _same(want[a], got[a])]
        if not differ:
            continue
        if gap is None and all(parse_placement(got[a]) == REPLICATE
                               and is_shard(parse_placement(want[a])) for a in differ):
            gap = (order[fqn], f"{fqn}: input {name!r} derived as {_show(got)} (DTensor "
                               f"gathered it upstream), declared {_show(want)}")
        inputs.append((fqn, name, differ[0], got, want))
    if gap is not None:
        yield info("derive.input_unresolved", pointer("param_plan"),
                   f"{gap[1]}: this boundary and those after it in forward order are left "
                   "to the rules")

    def judged(fqn: str) -> bool:
        return gap is None or order.get(fqn, -1) < gap[0]

    for (fqn, name), (got, ndim) in d.outputs.items():
        entry = plan.entries.get(fqn)
        if entry is None or fqn in d.opaque or not judged(fqn):
            continue
        want = _declared((entry.out_src or EMPTY).get(name), list(got), ndim)
        if want != got:
            axis = next(a for a in got if got[a] != want[a])
            yield error("derive.output", pointer("param_plan", fqn, "out_src", name, axis),
                        f"{fqn}: the forward computes output {name!r} as {_show(got)}, the "
                        f"plan declares {_show(want)}", expected=got[axis],
                        hint="regenerate the artifact; its placements contradict the math")
    for fqn, name, axis, got, want in inputs:
        if judged(fqn):
            yield error("derive.input", pointer("param_plan", fqn, "in_src", name, axis),
                        f"{fqn}: input {name!r} arrives as {_show(got)}, the plan declares "
                        f"{_show(want)}", expected=got[axis])


def _same(declared: str, derived: str) -> bool:
    """Equal placement strings; a negative declared dim matches any derived dim of the same
    kind (the input's rank is not recorded); and an input declared ``S(d)`` that arrives as
    ``SS(d,k)`` holds the same local rows: a sequence shard flattened into the token dim
    (``[b, s/tp, h] -> [b*s/tp, h]``, an MoE block's tokens under --sp) is interleaved
    across the batch, which row-wise compute does not see; a transition that gathers those
    rows is judged by the output it derives."""
    want, got = parse_placement(declared), parse_placement(derived)
    if want == got:
        return True
    if type(want) is Shard and type(got) is StridedShard:
        return want.dim == got.dim
    return type(want) is Shard and want.dim < 0 and type(got) is Shard


def comm_findings(plan: Plan, d: Derivation) -> Iterator[Finding]:
    """``derive.local_compute``, one per (boundary, op, source line)."""
    seen: set[tuple[str | None, str, str]] = set()
    for c in d.implicit:
        key = (c.boundary, c.op, c.line)
        if key in seen:
            continue
        seen.add(key)
        if _gathers_strided(c):
            # a strided shard (a sequence shard flattened into tokens) gathered because
            # DTensor has no strided rule for the op (top-k over the features of each
            # token): a gap of the derivation, not of the plan; row-wise local code runs
            # on its own rows
            yield info("derive.rule_gap", pointer("param_plan", c.boundary)
                       if c.boundary is not None else pointer("param_plan"),
                       f"{c.op} at {c.line or 'an unknown line'}: DTensor gathers "
                       f"{_moves(c)} (no rule for a strided shard); not judged")
            continue
        yield _comm_finding(plan, c)


def _comm_finding(plan: Plan, c: ImplicitComm) -> Finding:
    where = pointer("param_plan", c.boundary) if c.boundary is not None else \
        pointer("param_plan")
    inside = f"inside {c.boundary}" if c.boundary is not None else "between boundaries"
    entry = plan.entries.get(c.boundary or "")
    hint = "regenerate the artifact; its placements contradict the model's code"
    if entry is not None and any(m.to_partial for m in c.moves):
        hint = ("a replicated value is combined with a partial sum: list the parameter in "
                "tp_rank0_params (applied once) or deferred_bias_params, or declare the "
                "output whole")
    elif entry is not None and any(m.from_partial for m in c.moves):
        hint = ("a partial sum reaches an op that needs the whole value: tp_rank0_params or "
                "a partial output declared where nothing is split, or a missing reduction")
    return error("derive.local_compute", where,
                 f"{c.op} {inside} needs its operands redistributed first "
                 f"({_moves(c)}) at {c.line or 'an unknown line'}: the runtime runs "
                 "this code on its local shards without that collective, so it fails on "
                 "shapes or computes a wrong value", hint=hint)


def grad_findings(plan: Plan, d: Derivation, ours: bool) -> Iterator[Finding]:
    """``derive.partial_grad``: each parameter gradient's derived kind against what the
    runtime sums over tp."""
    for (fqn, rel), kinds in d.grads.items():
        kind = kinds.get(TP)
        entry = plan.entries.get(fqn)
        if kind in (None, "none") or entry is None or _in_opaque(fqn, d):
            continue
        summed = rel in runtime_summed(plan, fqn)
        declared = rel in entry.effective_partial_grad_params()
        name = join_fqn(fqn, rel)
        where = pointer("param_plan", fqn, "partial_grad_params")
        if kind == "partial" and not summed:
            owner = _listed_elsewhere(plan, fqn, rel)
            elsewhere = (f" ({owner} lists it, but an entry names only its own "
                         "parameters)" if owner else "")
            text = (f"{name}: its gradient is partial over tp (each rank holds its share), "
                    f"and the runtime does not sum it{elsewhere}")
            if ours:
                yield error("derive.partial_grad", where, text,
                            expected=f"{rel!r} in partial_grad_params")
            else:
                yield warning("derive.partial_grad", where, text + ": hpcodegen's runtime "
                              "would train it wrong silently, and the existing system's "
                              "runtime must all-reduce it over tp itself",
                              expected=f"{rel!r} in partial_grad_params")
        elif kind == "full" and d.backward_reductions:
            continue  # DTensor may have summed it in backward where the runtime does not
        elif kind != "partial" and summed and rel not in (entry.tp_rank0_params or ()):
            what = "whole on every rank" if kind == "full" else "its shard's"
            yield error("derive.partial_grad", where,
                        f"{name}: its gradient is {what}, yet the runtime sums it over tp "
                        f"({'multiplied by tp_size' if kind == 'full' else 'garbage'})",
                        hint="drop it from partial_grad_params")
        elif kind == "partial" and not ours and not declared:
            yield info("derive.partial_grad_summed", where,
                       f"{name}: its gradient is partial over tp and the meta does not list "
                       "it; hpcodegen's runtime sums it when it runs this plan (it derives "
                       "the partial_grad_params this meta leaves out); the existing system's "
                       "runtime must all-reduce it over tp itself")


def _in_opaque(fqn: str, d: Derivation) -> bool:
    return any(fqn == o or fqn.startswith(o + ".") or not o for o in d.opaque)


def _listed_elsewhere(plan: Plan, fqn: str, rel: str) -> str | None:
    """The entry (other than ``fqn``) whose ``partial_grad_params`` names this parameter by
    a path relative to it."""
    full = join_fqn(fqn, rel)
    for other, entry in plan.entries.items():
        if other != fqn and any(join_fqn(other, n) == full
                                for n in entry.partial_grad_params or ()):
            return other
    return None


def summary_findings(d: Derivation) -> Iterator[Finding]:
    """How the boundaries were derived (info), and why derivation stopped (warning)."""
    if d.skipped:
        yield info("derive.skipped", pointer("parallel_dims"), f"not derived: {d.skipped}")
        return
    if d.failed:
        yield info("derive.incomplete", pointer("param_plan"),
                   f"the symbolic run stopped: {d.failed}; what it reached was derived, "
                   "the rest is checked by the plan check's rules and the local shape run")
    derived = sorted({fqn for fqn, _ in d.outputs})
    opaque = sorted(d.opaque)
    text = f"{len(derived)} boundaries derived by propagation at " + ", ".join(
        f"{a}={n}" for a, n in d.axes.items())
    if opaque:
        text += (f"; {len(opaque)} checked by rules only (opaque compute: "
                 f"{', '.join(opaque[:3])}{', ...' if len(opaque) > 3 else ''})")
    yield info("derive.summary", pointer("param_plan"), text)


def _rule_gap(d: Derivation) -> ImplicitComm | None:
    """The first op DTensor could only run by gathering a strided shard (a sequence shard
    flattened into tokens meets an op with no strided rule, e.g. an MoE router's top-k):
    the local code runs that op on its own rows, so from there the derived placements no
    longer describe the run."""
    return next((c for c in d.implicit if _gathers_strided(c)), None)


def _gathers_strided(c: ImplicitComm) -> bool:
    return bool(c.moves) and all(m.gathers_strided for m in c.moves)


def _moves(c: ImplicitComm) -> str:
    return "; ".join(str(m) for m in c.moves)


def derived_findings(plan: Plan, d: Derivation, ours: bool) -> list[Finding]:
    """Every comparison of the module docstring; where the derivation met a rule gap
    (:func:`_rule_gap`), none of them: the plan is left to the rules, as without a config,
    and one info says where and why."""
    gap = _rule_gap(d)
    if gap is not None:
        where = (pointer("param_plan", gap.boundary) if gap.boundary is not None
                 else pointer("param_plan"))
        return [*summary_findings(d), info(
            "derive.rule_gap", where,
            f"{gap.op} at {gap.line or 'an unknown line'}: DTensor gathers "
            f"{'; '.join(gap.moves)} (no propagation rule for a strided shard), while the "
            "local code runs it on each rank's own rows; the derived placements after it "
            "do not describe the run, so this plan is judged by the rules only")]
    return [*summary_findings(d), *placement_findings(plan, d), *comm_findings(plan, d),
            *grad_findings(plan, d, ours)]
