"""Which replicated parameters have a partial gradient over tp: the one rule (pure).

decisions.md item 6: a parameter replicated on tp whose compute each rank runs on only part
of the data gets, on each rank, only that part's gradient; the runtime all-reduces it over
tp. Which parameters those are follows from the plan's placements:

* ``tp_rank0_params``: applied by tp rank 0 only: partial;
* ``deferred_bias_params``: added after the output transition: partial exactly when the
  first output leaves sharded on tp (:meth:`PlanEntry.partial_deferred_biases`);
* any other replicated parameter is governed by the deepest boundary at or above its entry
  (:func:`governing_boundary`):

  - a boundary whose input arrives sharded on tp (a sequence-parallel norm): partial, each
    rank sees its slice;
  - a boundary whose compute is split over tp (:meth:`PlanEntry.splits_compute`):
    partial for a parameter of a module *inside* it (a Qwen3 ``q_norm`` on this rank's
    heads, an activation's ``alpha``); for a parameter of the boundary module itself it
    depends on where the forward uses it (GPT-NeoX Japanese returns its ``dense_bias`` to
    be added after the reduction: full), so both are accepted;
  - any other boundary: every rank computes the whole value: full;
  - no boundary: partial exactly with sequence parallelism (the activations between
    boundaries are sequence slices).

``generate`` writes ``partial_grad_params`` by this rule (:func:`verdict`) and verify's
``plan`` check refuses a meta that disagrees with it (:mod:`hpcodegen.checks.plan_grads`),
so a hand-edited list cannot make the runtime sum a full gradient or leave a partial one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from hpcodegen.placement import is_shard
from hpcodegen.plan.entry import join_fqn
from hpcodegen.plan.frozen import EMPTY
from hpcodegen.plan.types import TP, NamedPlacement, Plan, PlanEntry

Verdict = Literal["partial", "full", "either", "sharded"]
#: the typed ``param_plan``: module FQN -> entry
Entries = Mapping[str, PlanEntry]


def tp_sharded(named: NamedPlacement | None) -> bool:
    """The named placement splits the value over tp (``S(d)`` or ``SS(d,f)``)."""
    return named is not None and TP in named and is_shard(named[TP])


def governing_boundary(entries: Entries, fqn: str) -> str | None:
    """The deepest boundary entry at or above module ``fqn`` (None: none): ``fqn`` itself,
    then each enclosing module up to the root ``""``."""
    parts = fqn.split(".") if fqn else []
    for depth in range(len(parts), -1, -1):
        at = ".".join(parts[:depth])
        entry = entries.get(at)
        if entry is not None and entry.boundary:
            return at
    return None


def sharded_input(entry: PlanEntry) -> bool:
    """Some input the boundary computes on (``in_dst``) is sharded over tp."""
    return any(tp_sharded(named) for named in (entry.in_dst or EMPTY).values())


def verdict(entries: Entries, fqn: str, rel: str, sequence_parallel: bool) -> Verdict:
    """Whether parameter ``rel`` of entry ``fqn`` has a partial gradient over tp (see the
    module docstring); ``sharded`` for a parameter split over tp (its gradient is its
    shard's: never summed). An entry ``entries`` lacks plans nothing else (a replicated
    parameter about to be added to a new parameter-only entry)."""
    entry = entries.get(fqn) or PlanEntry(fqn=fqn)
    if tp_sharded((entry.params or EMPTY).get(rel)):
        return "sharded"
    if rel in (entry.tp_rank0_params or ()):
        return "partial"
    if rel in (entry.deferred_bias_params or ()):
        return "partial" if rel in entry.partial_deferred_biases() else "full"
    boundary = governing_boundary(entries, fqn)
    if boundary is None:
        return "partial" if sequence_parallel else "full"
    governing = entries[boundary]
    if sharded_input(governing):
        return "partial"
    if governing.splits_compute():
        owner = join_fqn(fqn, rel).rpartition(".")[0]
        return "either" if owner == boundary else "partial"
    return "full"


def runtime_summed(plan: Plan, fqn: str) -> tuple[str, ...]:
    """The parameters of entry ``fqn`` whose gradient hpcodegen's runtime sums over tp: the
    entry's :meth:`~hpcodegen.plan.types.PlanEntry.effective_partial_grad_params`, and, in a
    meta of another generator whose entry has no ``partial_grad_params`` (a key of ours it
    never writes), every replicated parameter :func:`verdict` finds partial: that system's
    runtime decides these itself, so ours derives them rather than train them unsummed."""
    entry = plan.entries[fqn]
    summed = entry.effective_partial_grad_params()
    if plan.provenance.generator_name == "hpcodegen" or entry.partial_grad_params is not None:
        return summed
    sp = plan.dims.sequence_parallel is True
    derived = [rel for rel in entry.params or EMPTY
               if rel not in summed and verdict(plan.entries, fqn, rel, sp) == "partial"]
    return summed + tuple(derived)
