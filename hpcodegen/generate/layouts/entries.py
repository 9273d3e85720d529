"""The transitions of one boundary entry, and the standalone entries that need no lifter
state: a split norm, a vocab-parallel embedding, written into a
:class:`~hpcodegen.plan.draft.DraftEntry` with placement objects (pure, except
:func:`not_lookup_only`, which reads a module's children).

Split out of :mod:`hpcodegen.generate.layouts.lift`.
"""

from __future__ import annotations

from typing import Any

from hpcodegen.errors import PlanError, error
from hpcodegen.generate.seeds.module_facts import direct_params, first_arg
from hpcodegen.placement import REPLICATE, Partial, Placement, Shard
from hpcodegen.plan.draft import DraftEntry

#: the sequence-sharded activation (``S(1)``), the last dim (``S(-1)``), the first (``S(0)``)
SEQ = Shard(1)
LAST = Shard(-1)
FIRST = Shard(0)
#: the partial sum a row-split compute leaves (``P(sum)``)
PARTIAL = Partial("sum")


def tp(placement: Placement) -> dict[str, Placement]:
    """``{"tp": placement}``: a placement on the tp axis alone."""
    return {"tp": placement}


def set_transitions(entry: DraftEntry, in_name: str, in_src: Placement, in_dst: Placement,
                    out_src: Placement, out_dst: Placement) -> None:
    """The in/out fields of one boundary with a single input and the output ``output``."""
    entry.set_placements("in_src", {in_name: tp(in_src)})
    entry.set_placements("in_dst", {in_name: tp(in_dst)})
    entry.set_placements("out_src", {"output": tp(out_src)})
    entry.set_placements("out_dst", {"output": tp(out_dst)})
    entry.set("out_names", ("output",))
    entry.set("is_boundary", True)


def sharded_norm_entry(entry: DraftEntry, module: Any) -> None:
    """A norm over a colwise projection's features, run on this rank's features (weight
    ``S(0)``, input and output ``S(-1)``); its injected compute sums the squares over tp
    (:mod:`hpcodegen.runtime.norms`)."""
    entry.set_placements("params", {p: tp(FIRST) for p in direct_params(module)})
    set_transitions(entry, first_arg(module), LAST, LAST, LAST, LAST)


def embedding_transitions(entry: DraftEntry, module: Any, sp: bool) -> None:
    """A vocab-parallel embedding boundary: token ids in replicated, the partial lookup
    reduced (with ``sp``: reduce-scattered onto the sequence).

    Raises:
        PlanError: the embedding's forward runs submodules after the lookup
            (:func:`not_lookup_only`): the reduction would come after them.
    """
    reason = not_lookup_only(module)
    if reason:
        raise PlanError([error("generate.embedding_not_lookup", type(module).__name__, reason,
                               hint="replicate the embedding with a recipe rule")])
    set_transitions(entry, first_arg(module), REPLICATE, REPLICATE, PARTIAL,
                    SEQ if sp else REPLICATE)


def not_lookup_only(module: Any) -> str:
    """Why a vocab-parallel split of this embedding is not exact, or "".

    The split makes each rank's output a partial sum (its vocabulary rows, zeros elsewhere)
    reduced after the module's forward; that is the unsharded output only when the forward
    is linear in the lookup. An embedding holding submodules runs them on the partial
    lookup (Inkling's ``embed_norm``: norm(a) + norm(b) is not norm(a + b))."""
    children = [name for name, _ in module.named_children()]
    if not children:
        return ""
    return (f"{type(module).__name__} runs its submodules ({', '.join(children)}) inside its "
            "forward after the lookup; a vocab-parallel split would reduce the partial "
            "lookups only after them, so the output would not be the unsharded one")


#: the rule name of a per-token embedding planned by :meth:`Lifter._defaults` under ``sp``
PER_TOKEN_EMBEDDING = "<per-token embedding>"
