"""Which replicated parameters have a partial gradient over tp: the one rule (pure).

decisions.md item 6: a parameter replicated on tp whose compute each rank runs on only part
of the data gets, on each rank, only that part's gradient; the runtime all-reduces it over
tp. Which parameters those are follows from the plan's placements:

* ``tp_rank0_params``: applied by tp rank 0 only: partial;
* ``deferred_bias_params``: added after the output transition: partial exactly when the
  first output leaves sharded on tp (:func:`~hpcodegen.plan.entry.partial_deferred_biases`);
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
from typing import Any, Literal

from hpcodegen.placement import Shard, StridedShard, parse_placement
from hpcodegen.plan.codec import entry_from_json
from hpcodegen.plan.entry import (
    fqn_depth,
    is_boundary,
    join_fqn,
    partial_deferred_biases,
    tp_rank0_params,
)

Verdict = Literal["partial", "full", "either", "sharded"]
TP = "tp"


def _tp(named: Any) -> Any:
    """The parsed tp placement of a named placement (None: replicated or unreadable)."""
    text = named.get(TP) if isinstance(named, Mapping) else None
    try:
        return parse_placement(text) if isinstance(text, str) else None
    except ValueError:
        return None


def tp_sharded(named: Any) -> bool:
    """The named placement splits the value over tp (``S(d)`` or ``SS(d,f)``)."""
    return isinstance(_tp(named), (Shard, StridedShard))


def _inside(fqn: str, ancestor: str) -> bool:
    return not ancestor or fqn == ancestor or fqn.startswith(ancestor + ".")


def governing_boundary(plan: Mapping[str, Mapping[str, Any]], fqn: str) -> str | None:
    """The deepest boundary entry of ``plan`` at or above module ``fqn`` (None: none)."""
    above = [f for f, e in plan.items()
             if isinstance(e, Mapping) and _inside(fqn, f) and is_boundary(e)]
    return max(above, key=fqn_depth) if above else None


def sharded_input(entry: Mapping[str, Any]) -> bool:
    """Some input the boundary computes on (``in_dst``) is sharded over tp."""
    ins = entry.get("in_dst")
    return isinstance(ins, Mapping) and any(tp_sharded(v) for v in ins.values())


def verdict(plan: Mapping[str, Mapping[str, Any]], fqn: str, rel: str,
            sequence_parallel: bool) -> Verdict:
    """Whether parameter ``rel`` of entry ``fqn`` has a partial gradient over tp (see the
    module docstring); ``sharded`` for a parameter split over tp (its gradient is its
    shard's: never summed)."""
    entry = plan[fqn]
    named = (entry.get("params") or {}).get(rel)
    if tp_sharded(named):
        return "sharded"
    if rel in tp_rank0_params(entry):
        return "partial"
    biases = entry.get("deferred_bias_params")
    if isinstance(biases, list) and rel in biases:
        return "partial" if rel in partial_deferred_biases(entry) else "full"
    boundary = governing_boundary(plan, fqn)
    if boundary is None:
        return "partial" if sequence_parallel else "full"
    governing = plan[boundary]
    if sharded_input(governing):
        return "partial"
    if entry_from_json(boundary, governing).splits_compute():
        owner = join_fqn(fqn, rel).rpartition(".")[0]
        return "either" if owner == boundary else "partial"
    return "full"


def sequence_parallel(meta: Mapping[str, Any]) -> bool:
    dims = meta.get("parallel_dims")
    return isinstance(dims, Mapping) and dims.get("sequence_parallel") is True
