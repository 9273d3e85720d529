"""Parameters no rule names, and compute no rule splits (lazy torch: a meta model).

After the lift and the recipes, every trainable parameter still unplanned is replicated in
the deepest entry enclosing it (:func:`replicate_uncovered`); with ``--sp``, the
parameter-only entries that would run on a rank's slice of the sequence are found for
:func:`hpcodegen.generate.checks.validate.check_sequence_parallel` to refuse
(:func:`sequence_sharded_compute`). Split out of :mod:`hpcodegen.generate.layouts.lift`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hpcodegen.generate.layouts.entries import SEQ
from hpcodegen.generate.sources.globs import parent_of, relative_to
from hpcodegen.placement import REPLICATE
from hpcodegen.plan.draft import DraftPlan
from hpcodegen.plan.entry import fqn_depth, join_fqn
from hpcodegen.plan.frozen import EMPTY
from hpcodegen.plan.types import PlanEntry


def replicate_uncovered(model: Any, plan: DraftPlan, sp: bool) -> list[str]:
    """Plan every trainable parameter no rule names as replicated (``R``); returns them.

    The parameter joins the deepest entry enclosing its module, else a parameter-only entry
    of its own module. It is listed in ``partial_grad_params`` where its gradient is partial
    by :func:`hpcodegen.plan.partial_grads.verdict`, the rule verify checks metas by: inside
    an entry that splits compute over tp (every path to its output runs through sharded
    weights, as Apertus' xIELU ``alpha_p``/``alpha_n`` between ``up_proj`` and
    ``down_proj``), or, with ``sp``, on sequence slices (outside a region, or in one whose
    input is the rank's slice).

    Every name of a tied parameter counts (Zamba2's shared blocks tie each weight across
    the hybrid layers' distinct modules): the meta's ``tied_pairs`` name every alias, so
    each must be planned (:func:`hpcodegen.generate.layouts.tied.unify_tied_placements` then gives
    them one placement).
    """
    from hpcodegen.plan.coverage import uncovered
    from hpcodegen.plan.partial_grads import verdict

    # the rule reads the typed entries; the ones added below are parameter-only and
    # replicated, which changes no verdict (boundaries and their placements stay as typed)
    typed = plan.view()
    planned = {join_fqn(fqn, rel) for fqn, entry in typed.items() for rel in entry.params or ()}
    added: list[str] = []
    names = [n for n, p in model.named_parameters(remove_duplicate=False) if p.requires_grad]
    for name in uncovered(names, planned):
        owner = parent_of(name)
        enclosing = [fqn for fqn in plan if relative_to(owner, fqn) is not None]
        if enclosing:
            fqn = max(enclosing, key=fqn_depth)
            entry = plan[fqn]
        else:
            fqn = owner
            entry = plan.param_entry(fqn)
        rel = relative_to(name, fqn) or name
        entry.place("params", rel, {"tp": REPLICATE})
        if verdict(typed, fqn, rel, sp) != "full":  # the rule verify checks the meta by
            entry.add_names("partial_grad_params", (rel,))
        added.append(name)
    return added


def sequence_sharded_compute(typed: Mapping[str, PlanEntry]) -> list[str]:
    """With ``sp``: the parameter-only entries whose module runs on sequence-sharded
    activations (no enclosing boundary gathers the sequence first).

    Such a module's compute is replicated (no rule splits it) but sees only its rank's slice
    of the sequence; an attention, a convolution or a recurrence there mixes tokens and would
    be wrong, and nothing tells which modules are per-token. Norms and per-token embeddings
    are planned as boundaries of their own, so they are not listed.
    """
    from hpcodegen.plan.partial_grads import governing_boundary

    out = []
    for fqn, entry in typed.items():
        if entry.boundary or not entry.params:
            continue
        region = governing_boundary(typed, fqn)
        if region is None or _sequence_sharded_input(typed[region]):
            out.append(fqn)
    return sorted(out)


def _sequence_sharded_input(entry: PlanEntry) -> bool:
    return any(named.get("tp") == SEQ for named in (entry.in_dst or EMPTY).values())
