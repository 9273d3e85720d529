"""Phase D: tied weights share one local shard again after Phase A split them.

Phase A replaces each planned parameter by a new ``nn.Parameter``; a tied pair (an embedding
and an lm_head) then holds two tensors. For each pair ``[a, b]`` the owner of ``b`` gets
``a``'s parameter object back, on the same rank (no communication: both sides hold the same
shard when their placements agree, which is checked). With no explicit pairs, the pairs are
the names the live model holds as one tensor before Phase A: exactly what the unsharded model
ties. (The reference system instead ties ``*embed_tokens.weight`` and ``*lm_head.weight``
whenever the config says ``tie_word_embeddings``; a model whose class never ties them, such as
BigBird-Pegasus' causal LM, would then compute its logits with the embedding as LM head.)
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import nn

from hpcodegen.errors import PlanError, error
from hpcodegen.plan.types import Plan
from hpcodegen.runtime.params import param_owner


def tied_pairs(model: nn.Module, plan: Plan) -> list[tuple[str, str]]:
    """Explicit ``tied_pairs``, else ``(first name, alias)`` for every parameter the live
    model holds under several names; call it before Phase A replaces the parameters."""
    if plan.tied_pairs:
        return list(plan.tied_pairs)
    by_id: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(param), []).append(name)
    return [(names[0], alias) for names in by_id.values() for alias in names[1:]]


def tie_weights(model: nn.Module, pairs: list[tuple[str, str]],
                placements: Mapping[str, tuple]) -> None:
    """Make side B of every pair the same parameter object as side A."""
    for a, b in pairs:
        owner_a, name_a = param_owner(model, a, "tied_pairs")
        owner_b, name_b = param_owner(model, b, "tied_pairs")
        pa, pb = owner_a._parameters[name_a], owner_b._parameters[name_b]
        where = f"{a} <-> {b}"
        if a in placements and b in placements and placements[a] != placements[b]:
            raise PlanError([error("runtime.tied_placements", where,
                                   f"tied parameters have different placements "
                                   f"{placements[a]} vs {placements[b]}")])
        if pa.shape != pb.shape:
            raise PlanError([error("runtime.tied_shapes", where,
                                   f"local shapes differ: {tuple(pa.shape)} vs {tuple(pb.shape)}")])
        owner_b._parameters[name_b] = pa
