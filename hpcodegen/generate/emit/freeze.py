"""Freezing a lifted plan into ``codegen_meta.json`` fields (pure).

Everything here is a function of the generation inputs, so the same inputs give the same
meta: no timestamps, no absolute paths, sorted lists. The signature is the one
``hpcodegen.artifact.digest.meta_signature`` recomputes in ``verify``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

from hpcodegen import GENERATOR_NAME, __version__
from hpcodegen.artifact.digest import canonical_json, meta_signature
from hpcodegen.generate.emit.source import ModelingSource
from hpcodegen.placement import REPLICATE
from hpcodegen.plan.draft import entries_to_json
from hpcodegen.plan.entry import ENTRYPOINTS, join_fqn
from hpcodegen.plan.types import PlanEntry

CODEGEN_VERSION = "0.1.1"
NOT_COVERED: tuple[str, ...] = ("mesh", "fsdp2", "pp", "activation_checkpoint", "compile")


def model_name_of(model_type: str) -> str:
    """``qwen3_moe`` -> ``Qwen3_Moe`` (the reference's file-name token)."""
    parts = [p for p in model_type.replace("-", "_").split("_") if p]
    return "_".join(p[:1].upper() + p[1:] for p in parts) or "Model"


def modeling_file_name(model_name: str) -> str:
    """``modeling_<name lower>_gen_npu.py``, unsafe characters replaced by ``_``."""
    return f"modeling_{re.sub(r'[^0-9A-Za-z_]', '_', model_name.lower())}_gen_npu.py"


def parallel_dims(tp: int, sp: bool, ep: int = 1, loss_parallel: bool = False,
                  cp: int = 1, cp_layout: str | None = None) -> dict[str, Any]:
    """All seven keys; dp is decided at launch, so it is frozen as 1. With ``cp > 1`` also
    ``cp_layout`` (which positions a cp rank holds, :mod:`hpcodegen.plan.cp`)."""
    dims = {"dp_size": 1, "tp_size": tp, "cp_size": cp, "ep_size": ep, "pp_size": 1,
            "sequence_parallel": sp, "loss_parallel": loss_parallel}
    if cp > 1 and cp_layout is not None:
        dims["cp_layout"] = cp_layout
    return dims


def inputs_digest(config: Mapping[str, Any], tp: int, sp: bool, recipe: Any,
                  ep: int = 1, loss_parallel: bool = False, cp: int = 1,
                  cp_layout: str | None = None, cp_method: str | None = None,
                  pipeline: Any = None) -> str:
    """``yaml_sha256``: sha256 of the canonical JSON of every generation input (``ep``,
    ``loss_parallel``, ``cp``, a cp method other than the all-gather and the pipeline only
    when set, so artifacts without them keep their digest)."""
    payload = {"config": config, "tp": tp, "sp": sp, "recipe": recipe,
               **({"ep": ep} if ep > 1 else {}),
               **({"loss_parallel": True} if loss_parallel else {}),
               **({"cp": cp, "cp_layout": cp_layout} if cp > 1 else {}),
               **({"cp_method": cp_method} if cp > 1 and cp_method not in (None, "allgather")
                  else {}),
               **({"pipeline": pipeline} if pipeline is not None else {})}
    return hashlib.sha256(canonical_json(payload).encode("utf-8")).hexdigest()


def frozen_sharded_params(entries: Mapping[str, PlanEntry]) -> list[str]:
    """Sorted unique ``<entry>.<param>`` FQNs with a non-``R`` placement on some axis."""
    return sorted({
        join_fqn(fqn, rel)
        for fqn, entry in entries.items()
        for rel, named in (entry.params or {}).items()
        if any(p != REPLICATE for p in named.values())
    })


def source_record(config: Mapping[str, Any], src: ModelingSource,
                  base: Mapping[str, Any]) -> dict[str, Any]:
    """``meta.source``: architecture/type/structure from the config plus the file identity."""
    return {**base, "module_name": src.module_name, "file_path": src.file_path,
            "sha256": src.sha256, "line_count": src.line_count,
            "transformers_version": src.transformers_version}


def build_meta(*, config: Mapping[str, Any], tp: int, sp: bool,
               entries: Mapping[str, PlanEntry],
               classes: Mapping[str, str], injections: list[dict[str, Any]],
               tied_pairs: list[list[str]], source: dict[str, Any], recipe: Any,
               ep: int = 1, loss_parallel: bool = False, cp: int = 1,
               cp_layout: str | None = None, cp_method: str | None = None,
               inputs: Mapping[str, Any] | None = None,
               pipeline: dict[str, Any] | None = None) -> dict[str, Any]:
    """The whole meta except ``outputs`` (the bundle writer adds them), its ``param_plan``
    written by the codec from the frozen draft's ``entries``; ``cp_method`` (as
    given, ``auto`` included, with the hybrid's degree) only enters the inputs digest;
    ``inputs`` is the generation record (:mod:`hpcodegen.generate.sources.recorded`), kept under
    ``generator``; with a ``pipeline`` section (:mod:`hpcodegen.generate.layouts.pipeline`) also
    ``pp_size`` and pp dropped from ``not_covered``."""
    model_name = model_name_of(str(config.get("model_type") or "model"))
    meta: dict[str, Any] = {
        "codegen_version": CODEGEN_VERSION,
        "generator": {"name": GENERATOR_NAME, "version": __version__,
                      **({"inputs": dict(inputs)} if inputs else {})},
        "yaml_path": "",
        "yaml_sha256": inputs_digest(config, tp, sp, recipe, ep, loss_parallel, cp, cp_layout,
                                     cp_method, pipeline),
        "source": source,
        "parallel_dims": parallel_dims(tp, sp, ep, loss_parallel, cp, cp_layout),
        "model_name": model_name,
        "model_class": source.get("architecture"),
        "param_plan": entries_to_json(entries),
        "injections": injections,
        "tied_pairs": tied_pairs,
        "special_handlers": {},
        "frozen_sharded_params": frozen_sharded_params(entries),
        "boundary_classes": {f: classes[f] for f in sorted(entries) if entries[f].boundary},
        "entrypoints": {"parallelize": ENTRYPOINTS[0]},
        "module_overrides": [],
        "skipped_overrides": [],
        "covered": {"sharding_plan": True, "module_overrides": False, "axes": []},
        "not_covered": list(NOT_COVERED),
        "mesh_dim_names": ["cp", "tp"] if cp > 1 else ["tp"],
    }
    if pipeline is not None:
        meta["pipeline"] = pipeline
        meta["parallel_dims"]["pp_size"] = pipeline["pp_size"]
        meta["not_covered"] = [n for n in NOT_COVERED if n != "pp"]
    meta["signature"] = meta_signature(meta)
    return meta
