"""Phase D: tied weights share one local shard again after Phase A split them.

Phase A replaces each planned parameter by a new ``nn.Parameter``; a tied pair (an embedding
and an lm_head) then holds two tensors. For each pair ``[a, b]`` the owner of ``b`` gets
``a``'s parameter object back, on the same rank (no communication: both sides hold the same
shard when their placements agree, which is checked). With no explicit pairs, a config with
``tie_word_embeddings`` ties ``*embed_tokens.weight`` and ``*lm_head.weight``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from hpcodegen.errors import PlanError, error
from hpcodegen.runtime.params import param_owner


def tied_pairs(model: nn.Module, meta: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Explicit ``tied_pairs``, else the auto-detected embedding/lm_head pair."""
    pairs = [tuple(p) for p in meta.get("tied_pairs") or () if len(p) == 2]
    if pairs:
        return pairs  # type: ignore[return-value]
    config = getattr(model, "config", None)
    if not getattr(config, "tie_word_embeddings", False):
        return []
    names = [n for n, _ in model.named_parameters(remove_duplicate=False)]
    embed = [n for n in names if n.endswith("embed_tokens.weight")]
    head = [n for n in names if n.endswith("lm_head.weight")]
    return [(embed[0], head[0])] if len(embed) == 1 and len(head) == 1 else []


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
