"""File digests and the artifact signature (decisions.md, item 5). Pure, stdlib only."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: Plan fields the signature covers, besides the generator, source and mesh.
SIGNED_PLAN_FIELDS: tuple[str, ...] = ("param_plan", "injections", "tied_pairs", "special_handlers")
#: Signed when present only, so the signatures of metas without them do not change.
SIGNED_OPTIONAL_FIELDS: tuple[str, ...] = ("pipeline",)


def bytes_digest(data: bytes) -> dict[str, Any]:
    """``{"sha256": hex, "lines": n}`` as recorded in ``meta.outputs``."""
    return {"sha256": hashlib.sha256(data).hexdigest(), "lines": len(data.splitlines())}


def file_digest(path: Path) -> dict[str, Any]:
    """:func:`bytes_digest` of a file's bytes."""
    return bytes_digest(path.read_bytes())


def canonical_json(value: Any, *, tree: bool = False) -> str:
    """Sorted keys, no spaces, ASCII: the form every hash in hpcodegen is taken over.

    ``tree``: ``value`` is known to hold no cycle (parsed JSON), so the encoder's cycle
    bookkeeping is skipped (a quarter of its time on a 10,000-entry plan; same text).
    """
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      check_circular=not tree)


def signature_payload(
    *,
    generator_version: str,
    source: Mapping[str, Any],
    parallel_dims: Mapping[str, Any],
    mesh_dim_names: Any,
    plan: Mapping[str, Any],
) -> dict[str, Any]:
    """What the signature of an hpcodegen artifact is taken over.

    ``source`` contributes only ``architecture``, ``model_type`` and ``structure`` (the HF
    config's shape fields, a sub-config's under its dotted path: ``text_config.hidden_size``),
    so ``verify --hf-config`` can recompute it from a config alone.
    """
    return {
        "generator": {"name": "hpcodegen", "version": generator_version},
        "source": {
            "architecture": source.get("architecture"),
            "model_type": source.get("model_type"),
            "structure": dict(source.get("structure") or {}),
        },
        "parallel_dims": dict(parallel_dims),
        "mesh_dim_names": mesh_dim_names,
        "plan": {**{key: plan.get(key) for key in SIGNED_PLAN_FIELDS},
                 **{key: plan[key] for key in SIGNED_OPTIONAL_FIELDS
                    if plan.get(key) is not None}},
    }


def compute_signature(payload: Mapping[str, Any]) -> str:
    """First 12 hex chars of sha256 over the canonical JSON of ``payload`` (a meta's parts
    and a config's: JSON trees, so no cycle)."""
    return hashlib.sha256(canonical_json(payload, tree=True).encode("utf-8")).hexdigest()[:12]


def meta_signature(meta: Mapping[str, Any], source: Mapping[str, Any] | None = None) -> str:
    """Recompute an hpcodegen meta's signature, optionally with another ``source``.

    Pass the source derived from an HF config to check the meta against that config.
    """
    generator = meta.get("generator") or {}
    return compute_signature(signature_payload(
        generator_version=str(generator.get("version", "")),
        source=source if source is not None else (meta.get("source") or {}),
        parallel_dims=meta.get("parallel_dims") or {},
        mesh_dim_names=meta.get("mesh_dim_names"),
        plan=meta,
    ))


def is_hpcodegen_meta(meta: Mapping[str, Any]) -> bool:
    """True for metas our generator wrote (their signature is recomputable)."""
    generator = meta.get("generator")
    return isinstance(generator, Mapping) and generator.get("name") == "hpcodegen"
