"""The classifier's verdict on a meta, computed once per artifact and only when it can be.

:func:`hpcodegen.plan.classify.classify_plan` reads the typed Plan (``ctx.plan``); this
wrapper returns None (with the reason) when the meta fields it reads are not schema-valid
(the Plan then lacks what the codec refused), so the ``plan`` and ``source`` checks never
crash on bad input nor classify half a plan.
"""

from __future__ import annotations

from hpcodegen.checks.context import CheckContext
from hpcodegen.checks.schema import subtree_valid
from hpcodegen.plan.classify import BoundaryForm, classify_plan

#: The meta fields the classifier reads.
CLASSIFIER_INPUTS: tuple[str, ...] = ("param_plan", "injections", "mesh_dim_names",
                                      "parallel_dims")


def classified(ctx: CheckContext) -> dict[str, BoundaryForm] | None:
    """Every entry's form, or None when the classifier's inputs violate the schema."""
    if "forms" not in ctx.cache:
        forms = None
        if subtree_valid(ctx, *CLASSIFIER_INPUTS):
            forms = classify_plan(ctx.plan)
        ctx.cache["forms"] = forms
    return ctx.cache["forms"]


#: The meta fields the signature is computed over (decisions.md item 5).
SIGNED_INPUTS: tuple[str, ...] = ("generator", "source", "parallel_dims", "mesh_dim_names",
                                  "param_plan", "injections", "tied_pairs", "special_handlers")


def signable(ctx: CheckContext) -> bool:
    """True when the signed fields are schema-valid, so the signature can be recomputed."""
    return subtree_valid(ctx, *SIGNED_INPUTS)


UNCLASSIFIABLE = ("the plan cannot be classified: param_plan, injections, mesh_dim_names or "
                  "parallel_dims violate the schema (see the schema check)")
