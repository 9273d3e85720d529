"""The transitions of one boundary entry, and the standalone entries that need no lifter
state: a split norm, a vocab-parallel embedding (pure: dicts in, dicts out, except
:func:`not_lookup_only`, which reads a module's children).

Split out of :mod:`hpcodegen.generate.layouts.lift`.
"""

from __future__ import annotations

from typing import Any

from hpcodegen.errors import PlanError, error
from hpcodegen.generate.seeds.module_facts import direct_params, first_arg

SEQ = "S(1)"


def _named(name: str, src: str, dst: str) -> tuple[dict, dict]:
    return {name: {"tp": src}}, {name: {"tp": dst}}


def transitions(in_name: str, in_src: str, in_dst: str, out_src: str, out_dst: str) -> dict:
    """The in/out fields of one boundary with a single input and the output ``output``."""
    in_s, in_d = _named(in_name, in_src, in_dst)
    out_s, out_d = _named("output", out_src, out_dst)
    return {"in_src": in_s, "in_dst": in_d, "out_src": out_s, "out_dst": out_d,
            "out_names": ["output"], "is_boundary": True}


def sharded_norm_entry(module: Any) -> dict[str, Any]:
    """A norm over a colwise projection's features, run on this rank's features (weight
    ``S(0)``, input and output ``S(-1)``); its injected compute sums the squares over tp
    (:mod:`hpcodegen.runtime.norms`)."""
    seq = "S(-1)"
    return {"params": {p: {"tp": "S(0)"} for p in direct_params(module)},
            **transitions(first_arg(module), seq, seq, seq, seq)}


def embedding_transitions(module: Any, sp: bool) -> dict[str, Any]:
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
    return transitions(first_arg(module), "R", "R", "P(sum)", SEQ if sp else "R")


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
