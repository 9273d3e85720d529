"""What verify derives from a plan's placements and refuses to take on trust (pure).

A meta declares things the placements already decide. Declared otherwise, the plan
installs and runs, and only a parity check shows it wrong; so the ``plan`` check (which
``generate`` runs on what it freezes and the runtime runs before install) derives them by
the same rules the generator and the runtime use and refuses a disagreement:

* ``partial_grad_params``: :mod:`hpcodegen.plan.partial_grads` (a full gradient summed
  over tp is multiplied by tp; a partial one left alone is one rank's share; a shard's
  gradient is never summed);
* partial outputs: an output is ``P(...)`` on tp only where the boundary's compute is
  split over tp (a sharded parameter in it, a sharded input, or an opaque injected
  compute); from replicated weights every rank holds the whole value and the reduction
  would multiply it;
* ``tp_rank0_params``: replicated parameters of a boundary that splits its compute into a
  partial output, or whose injected compute reduces it (the expert dispatch under ``--sp``),
  else the other ranks would drop them; in such an entry every
  replicated parameter of the module itself is one of them (the generator's rule:
  applied to a partial output once per rank, it would be counted tp times);
* the output of hpcodegen's ep dispatch over tp (:func:`hpcodegen.plan.moe.
  dispatch_output_tp`): ``P(sum)`` where its experts are split over tp on whole rows, a
  shard where it gathers its rows over tp (``--sp``); declared whole, the experts' partial
  sums would never be reduced;
* ``ep_size``: expert placements (``ep: S(..)``) exactly when ``parallel_dims.ep_size`` > 1,
  each on a module whose dispatch injection names the same ``ep_size``;
* transitions the runtime cannot execute (a redistribution *to* ``Partial``), refused
  here instead of at install (the runtime's ``runtime.invalid_redistribute``);
* a sequence-sharded boundary nested in one that gathers the sequence
  (:mod:`hpcodegen.plan.sp_nesting`: generate's ``--sp`` rule): values wrong, shapes right.

In a meta of another generator (no hpcodegen stamp) what that system legitimately leaves
out is not an error: ``partial_grad_params`` (a key of ours) is noted (info), expert
placements at ep 1 (its runtime keeps them whole) are a warning.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from hpcodegen.errors import Finding, error, info, pointer, warning
from hpcodegen.placement import REPLICATE, Partial, Shard, is_shard
from hpcodegen.plan.frozen import EMPTY
from hpcodegen.plan.moe import dispatch_output_tp, is_ep_dispatch, output_agrees
from hpcodegen.plan.partial_grads import (
    Entries,
    runtime_summed,
    sharded_input,
    tp_sharded,
    verdict,
)
from hpcodegen.plan.sp_nesting import describe, nested_gathers
from hpcodegen.plan.types import EP, TP, NamedPlacement, Plan


def _partial_tp(named: NamedPlacement) -> bool:
    return isinstance(named.get(TP), Partial)


def grad_findings(plan: Plan, ours: bool) -> Iterator[Finding]:
    """``partial_grad_params`` against :func:`hpcodegen.plan.partial_grads.verdict`; what
    hpcodegen's runtime sums is :func:`~hpcodegen.plan.partial_grads.runtime_summed`."""
    entries, sp = plan.entries, plan.dims.sequence_parallel is True
    for fqn, entry in entries.items():
        if not entry.params:
            continue  # no parameter: nothing to sum (most boundaries of a generated plan)
        declared = set(entry.partial_grad_params or ())
        synced: set[str] | None = None  # built for the first partial parameter only
        for rel in entry.params or EMPTY:
            kind = verdict(entries, fqn, rel, sp)
            if kind == "partial" and synced is None:
                synced = set(entry.effective_partial_grad_params())
            if (kind == "sharded" and rel not in declared) or kind == "either" \
                    or (kind == "full" and rel not in declared) \
                    or (kind == "partial" and rel in (synced or ())):
                continue  # agrees with the rule: no finding (the common case, kept cheap)
            where = pointer("param_plan", fqn, "partial_grad_params")
            name = f"{fqn}.{rel}" if fqn else rel
            if kind == "sharded" and rel in declared:
                yield error("plan.partial_grad_sharded", where,
                            f"{name} is sharded over tp, yet listed as a partial gradient: "
                            "summing the ranks' gradients of different shards is garbage",
                            hint="drop it from partial_grad_params")
            elif kind == "full" and rel in declared:
                yield error("plan.partial_grad_full", where,
                            f"{name} is replicated and every rank computes with it on the "
                            "whole data, so its gradient is whole on every rank; listed as "
                            "partial it would be summed over tp (multiplied by tp_size)",
                            hint="drop it from partial_grad_params")
            elif kind == "partial" and rel not in runtime_summed(plan, fqn):
                make = error if ours else warning
                yield make("plan.partial_grad_missing", where,
                           f"{name} is replicated but computed on each rank's share of the "
                           "work (a split compute or a sharded input), so each rank holds a "
                           "partial gradient; unlisted it is never summed over tp: the "
                           "runtime would train it wrong silently",
                           expected=f"{rel!r} in partial_grad_params")
            elif kind == "partial" and rel not in (synced or ()):
                yield info("plan.partial_grad_derived", where,
                           f"{name}: its gradient is partial over tp and this meta does not "
                           "list it; hpcodegen's runtime sums it when it runs this plan (it "
                           "derives what a meta without partial_grad_params leaves out); the "
                           "existing system's runtime must all-reduce it over tp itself")


def _split_modules(entries: Entries) -> set[str]:
    """The modules holding a tp-sharded parameter in their entry or in any entry inside them
    (each such entry and all its enclosing modules, the root ``""`` included)."""
    out: set[str] = set()
    for fqn, entry in entries.items():
        if any(tp_sharded(n) for n in (entry.params or EMPTY).values()):
            prefix = fqn
            while prefix not in out:  # a module in ``out`` has all its enclosing ones there
                out.add(prefix)
                if not prefix:
                    break
                prefix = prefix.rpartition(".")[0]
    return out


def output_findings(plan: Plan) -> Iterator[Finding]:
    """A ``P(...)`` output needs split compute; ``tp_rank0_params`` need a partial one."""
    entries = plan.entries
    opaque_fqns = _computed_elsewhere(plan)
    split_below = _split_modules(entries)
    for fqn, entry in entries.items():
        if not entry.boundary:
            continue
        partial = [n for n, v in (entry.out_src or EMPTY).items() if _partial_tp(v)]
        opaque = fqn in opaque_fqns
        split = fqn in split_below or sharded_input(entry) or opaque
        if partial and not split:
            yield error("plan.partial_output_unsplit",
                        pointer("param_plan", fqn, "out_src", partial[0], "tp"),
                        f"{fqn}: output {partial[0]!r} is declared partial over tp, but "
                        "nothing in the boundary is split over tp (no sharded parameter, no "
                        "sharded input): every rank computes the whole value, and the "
                        "reduction would multiply it by tp_size",
                        expected="R, or a boundary whose parameters or inputs are sharded")
    yield from _rank0_findings(entries, opaque_fqns, split_below)


def _computed_elsewhere(plan: Plan) -> set[str]:
    """Modules whose compute an injected ``local_compute_fn`` replaces (opaque here)."""
    return {fqn for record in plan.injections or () if record.local_compute_fn is not None
            for fqn in record.fqns}


def _rank0_findings(entries: Entries, opaque: set[str], split_below: set[str]
                    ) -> Iterator[Finding]:
    """``opaque``: boundaries whose compute an injection replaces (the expert dispatch
    reduces its tp-split compute itself, so its output need not be declared partial)."""
    for fqn, entry in entries.items():
        names = entry.tp_rank0_params or ()
        if not names:
            continue
        params = entry.params or EMPTY
        where = pointer("param_plan", fqn, "tp_rank0_params")
        sharded = [n for n in names if tp_sharded(params.get(n))]
        if sharded:
            yield error("plan.rank0_sharded", where,
                        f"{fqn}.{sharded[0]} is sharded over tp: each rank holds its own "
                        "slice, so it cannot be applied by tp rank 0 only",
                        hint="drop it from tp_rank0_params")
        reduced = entry.partial_output() or fqn in opaque
        if not (entry.boundary and reduced and fqn in split_below):
            yield error("plan.rank0_unsplit", where,
                        f"{fqn} lists tp_rank0_params but does not split its compute into a "
                        "partial output: every rank computes the whole output, and the "
                        "ranks other than 0 would drop these parameters",
                        hint="drop tp_rank0_params, or split the boundary over tp")
            continue
        whole = sorted(n for n, v in params.items() if "." not in n and not tp_sharded(v)
                       and n not in names)
        if whole:
            yield error("plan.rank0_incomplete", where,
                        f"{fqn} splits its compute into a partial output and lists "
                        f"tp_rank0_params, but its own replicated {', '.join(whole)} "
                        f"{'is' if len(whole) == 1 else 'are'} not among them: applied to "
                        "each rank's partial result, it would be counted tp_size times",
                        expected=f"{whole[0]!r} in tp_rank0_params")


def dispatch_findings(plan: Plan) -> Iterator[Finding]:
    """``plan.dispatch_output``: each ep dispatch region's declared ``out_src`` over tp
    against its contract (tp > 1 only)."""
    for record in plan.injections or ():
        if not is_ep_dispatch(record):
            continue
        for fqn in record.fqns:
            entry = plan.entries.get(fqn)
            kind = None if entry is None else dispatch_output_tp(entry)
            for name, named in ((entry.out_src or EMPTY).items() if kind else ()):
                if not output_agrees(kind, named):
                    want, why = ((str(Partial()), "a partial sum of whole rows")
                                 if kind == "partial" else
                                 (str(Shard(0)), "the partial rows reduce-scattered back"))
                    yield error("plan.dispatch_output",
                                pointer("param_plan", fqn, "out_src", name, TP),
                                f"{fqn}: the ep dispatch's experts are split over tp, so its "
                                f"output {name!r} is {want} over tp ({why}); declared "
                                f"{named.get(TP, REPLICATE)}, the runtime would not reduce it "
                                "as the math needs", expected=want)


def _ep_sharded(named: NamedPlacement) -> bool:
    return EP in named and is_shard(named[EP])


def ep_findings(plan: Plan, ours: bool) -> Iterator[Finding]:
    """Expert placements, dispatch injections and ``parallel_dims.ep_size`` agree."""
    ep = plan.dims.sizes.get(EP, 1)
    experts = {fqn for fqn, e in plan.entries.items()
               if any(_ep_sharded(n) for n in (e.params or EMPTY).values())}
    dispatch = {}
    for i, record in enumerate(plan.injections or ()):
        size = record.ep_size
        for fqn in record.fqns:
            if is_ep_dispatch(record):
                dispatch[fqn] = i
            if size is not None and size > 1 and size != ep:
                yield error("plan.ep_size_mismatch", pointer("injections", i, "ep_size"),
                            f"{fqn}: the injection dispatches over ep_size {size}, but "
                            f"parallel_dims.ep_size is {ep}: the mesh the runtime builds "
                            "has no such expert group", expected=f"ep_size {ep}")
    if experts and ep <= 1:
        first = sorted(experts)[0]
        make = error if ours else warning
        yield make("plan.ep_placement_without_ep", pointer("param_plan", first, "params"),
                   f"{first} (and {len(experts) - 1} more) place experts over ep, but "
                   f"parallel_dims.ep_size is {ep}: no expert group exists, the placement "
                   "is not what runs", expected="ep_size > 1, or no ep placement")
    if not ours:
        return
    if ep > 1 and not experts:
        yield error("plan.ep_without_experts", pointer("parallel_dims", "ep_size"),
                    f"parallel_dims.ep_size is {ep} but no parameter is placed over ep",
                    expected="ep_size 1")
    for fqn in sorted(experts ^ set(dispatch)):
        yield error("plan.ep_dispatch_mismatch", pointer("param_plan", fqn),
                    f"{fqn}: expert placements and the ep dispatch injection must come "
                    "together (one without the other splits the experts without routing "
                    "tokens to them, or routes to experts every rank holds whole)")


def transition_findings(forms: Mapping[str, Any] | None) -> Iterator[Finding]:
    """Transitions the runtime cannot execute: a redistribution to ``Partial``."""
    for fqn, form in (forms or {}).items():
        for t in form.transitions:
            bad = [s for s in t.steps if s.kind == "invalid"]
            if bad:
                yield error("plan.invalid_redistribute",
                            pointer("param_plan", fqn, f"{t.side}_dst", t.name),
                            f"{fqn}: {t.side}put {t.name!r}: {bad[0].detail}; the runtime "
                            "cannot execute this transition",
                            expected="a destination that is not Partial")


def _declared_outputs(plan: Plan) -> Iterator[tuple[str, str, str, NamedPlacement]]:
    """``(fqn, side, name, placement)`` of every declared output placement."""
    for fqn, entry in plan.entries.items():
        for side in ("out_src", "out_dst"):
            for name, named in (getattr(entry, side, None) or {}).items():
                yield fqn, side, name, named


def derived_findings(plan: Plan, forms: Mapping[str, Any] | None, ours: bool
                     ) -> Iterator[Finding]:
    """Every rule of the module docstring; ``ours``: hpcodegen wrote the meta. Over a tp
    axis of one rank a placement moves nothing (a ``P(sum)`` of one term is the value, a
    gradient summed over one rank is itself): the tp rules apply only where tp > 1."""
    if plan.dims.size(TP) > 1:
        yield from grad_findings(plan, ours)
        yield from output_findings(plan)
        yield from dispatch_findings(plan)
    elif not ours and any(isinstance(named.get(TP), Partial) for _f, _s, _n, named
                          in _declared_outputs(plan)):
        yield info("plan.tp_one_grads_whole", pointer("parallel_dims", "tp_size"),
                   "tp_size is 1: the declared P(sum) outputs over tp are sums of one term "
                   "and no gradient is partial over tp; every gradient is whole on its rank "
                   "before the data-parallel reduction, in hpcodegen's runtime and in the "
                   "existing system's alike (nothing to sum over tp)")
    yield from ep_findings(plan, ours)
    yield from transition_findings(forms)
    yield from nesting_findings(plan)


def nesting_findings(plan: Plan) -> Iterator[Finding]:
    """``plan.sp_nested_gather`` per sequence-gathering boundary with a sequence-sharded
    one inside (pointer: the inner entry)."""
    for parent, inner in nested_gathers(plan.entries):
        yield error("plan.sp_nested_gather", pointer("param_plan", inner[0]),
                    describe(parent, inner),
                    expected=f"{inner[0]} without sequence-sharded transitions (its parent "
                    "runs the whole sequence), or the parent without the gather")


__all__ = ["derived_findings"]
