"""The ``signature`` check: the artifact was made for the model described by ``--hf-config``.

The config is read as plain JSON (:func:`hpcodegen.hf.read_hf_config`, no transformers).
``source.architecture`` must equal ``architectures[0]`` and ``source.model_type`` the config's
``model_type``; each ``source.structure`` field that the config sets differently is named with
both values (a field the config sets under a transformers alias, such as ``num_experts`` saved
as ``num_local_experts``, is compared through the alias: ``hf.STRUCTURE_ALIASES``). A field of a
sub-config is recorded under its dotted path (``text_config.hidden_size``: composite models
keep their shapes there) and compared at that path with the same alias rules.
For metas hpcodegen wrote, the signature is recomputed with the config's source
(decisions.md item 5), sub-config fields included, and a mismatch names the differing fields;
other generators' signatures cannot be recomputed ("skipped: foreign generator", info). An
hpcodegen meta that records no sub-config field although the config has some was written
before they were recorded: its signature is recomputed over the top-level fields, with a
warning that the sub-configs' shapes went unchecked.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from hpcodegen.artifact.digest import is_hpcodegen_meta, meta_signature
from hpcodegen.checks.context import CheckContext, as_dict, pointer
from hpcodegen.checks.forms import signable
from hpcodegen.checks.result import CheckResult
from hpcodegen.errors import Finding, Severity, error, info, warning

_MISSING = object()


def _hf() -> Any:
    """:mod:`hpcodegen.hf`, imported when a config is compared (about 4 ms of start-up the
    gate without ``--hf-config`` never needs)."""
    import hpcodegen.hf

    return hpcodegen.hf


def _show(value: Any) -> str:
    return "absent" if value is _MISSING else json.dumps(value, sort_keys=True)


def _compare_identity(source: Mapping[str, Any], config: Mapping[str, Any],
                      file: str | None) -> Iterator[Finding]:
    arch, meta_arch = _hf().architecture_of(config), source.get("architecture")
    if arch is None:
        yield warning("signature.no_architecture", "/architectures/0", "the HF config has no "
                      "architectures[0] to compare with source.architecture", file=file)
    elif meta_arch is None:
        yield warning("signature.meta_architecture_missing", pointer("source", "architecture"),
                      f"the meta records no source.architecture (config: {arch})")
    elif meta_arch != arch:
        yield error("signature.architecture", pointer("source", "architecture"),
                    f"artifact made for {meta_arch}, config is {arch}", expected=arch,
                    hint="use the artifact generated for this model")
    mt, meta_mt = config.get("model_type"), source.get("model_type")
    if mt is not None and meta_mt is not None and mt != meta_mt:
        yield error("signature.model_type", pointer("source", "model_type"),
                    f"artifact made for model_type {meta_mt!r}, config has {mt!r}",
                    expected=repr(mt))


def other_model(ctx: CheckContext) -> list[Finding]:
    """The errors saying the artifact was made for another model than ``--hf-config``'s (its
    architecture or model type differ); empty when they agree or there is no config. The
    model check then has nothing left to say: every module it would compare is another
    model's (:func:`model_gate`)."""
    if ctx.hf_config is None:
        return []
    file = str(ctx.hf_config_path) if ctx.hf_config_path else None
    return [f for f in _compare_identity(as_dict(ctx.meta.get("source")), ctx.hf_config, file)
            if f.severity is Severity.ERROR]


def model_gate(ctx: CheckContext, names: Sequence[str]) -> CheckResult | None:
    """The ``model`` check's result when the artifact is another model's, without running
    it: skipped, saying why in one line, when ``signature`` runs too (it reports the
    mismatch); else one ``model.other_model`` error, so ``--only model`` still fails."""
    try:
        found = other_model(ctx)
    except Exception:  # a hostile meta the identity rule cannot read: the check runs and says
        return None
    if not found:
        return None
    why = "; ".join(f.message for f in found)
    if "signature" in names:
        return CheckResult("model", "skipped", reason=f"the artifact is another model's "
                           f"({why}): see signature")
    return CheckResult("model", "fail", [error(
        "model.other_model", found[0].where, f"the artifact is another model's ({why}): "
        "the model checks were skipped", expected=found[0].expected, file=ctx.meta_file,
        hint="use the artifact generated for this model")])


def _compare_structure(source: Mapping[str, Any], config: Mapping[str, Any]) -> Iterator[Finding]:
    for key, recorded in as_dict(source.get("structure")).items():
        found = _hf().structure_value(config, key)
        where = pointer("source", "structure", key)
        if found is None:
            yield warning("signature.structure_unset", where, f"{key}: the artifact recorded "
                          f"{_show(recorded)}, the config does not set it")
            continue
        field, actual = found
        if _show(actual) != _show(recorded):  # JSON equality: true is not 1, 2.0 not 2
            named = key if field == key else f"{key} (the config's {field})"
            yield error("signature.structure", where, f"{named}: artifact {_show(recorded)}, "
                        f"config {_show(actual)}", expected=_show(actual),
                        hint="the model's shape changed; regenerate the artifact")


def _differing_fields(meta_source: Mapping[str, Any], cfg_source: Mapping[str, Any]) -> list[str]:
    fields = [k for k in ("architecture", "model_type")
              if meta_source.get(k) != cfg_source.get(k)]
    ms, cs = as_dict(meta_source.get("structure")), as_dict(cfg_source.get("structure"))
    fields += [f"structure.{k}" for k in sorted(set(ms) | set(cs))
               if _show(ms.get(k, _MISSING)) != _show(cs.get(k, _MISSING))]
    return fields


def _top_level_source(meta_source: Mapping[str, Any], cfg_source: Mapping[str, Any]
                      ) -> dict[str, Any] | None:
    """The config's source with its top-level structure only, when the meta records no
    sub-config field but the config has some (a meta written before they were recorded)."""
    if any("." in key for key in as_dict(meta_source.get("structure"))):
        return None
    structure = cfg_source["structure"]
    if not any("." in key for key in structure):
        return None
    return {**cfg_source, "structure": {k: v for k, v in structure.items() if "." not in k}}


def _recompute(ctx: CheckContext, config: Mapping[str, Any]) -> Iterator[Finding]:
    meta = ctx.meta
    if not is_hpcodegen_meta(meta):
        yield info("signature.foreign", pointer("signature"), "skipped: foreign generator (the "
                   "signature is recomputable only for metas hpcodegen wrote); architecture and "
                   "structure were still compared")
        return
    if not signable(ctx):
        yield info("signature.not_recomputed", pointer("signature"), "the signature was not "
                   "recomputed: the fields it covers violate the schema (see the schema check)")
        return
    cfg_source = _hf().source_from_config(config)
    actual, stored = meta_signature(meta, source=cfg_source), meta.get("signature")
    if actual == stored:
        return
    legacy = _top_level_source(as_dict(meta.get("source")), cfg_source)
    if legacy is not None and meta_signature(meta, source=legacy) == stored:
        nested = sorted({k.split(".")[0] for k in cfg_source["structure"] if "." in k})
        yield warning("signature.top_level_only", pointer("source", "structure"),
                      "the signature matches this config over its top-level structure fields "
                      "only: the meta records no sub-config fields (written before hpcodegen "
                      f"recorded them), so the shapes in {', '.join(nested)} were not compared",
                      hint="regenerate the artifact to cover the sub-configs' shapes")
        return
    fields = _differing_fields(as_dict(meta.get("source")), cfg_source)
    detail = (f"differing fields: {', '.join(fields)}" if fields
              else "the config matches the recorded source, so the plan itself was edited")
    yield error("signature.mismatch", pointer("signature"), f"signature {stored} does not "
                f"match this config ({actual}); {detail}", expected=actual,
                hint="regenerate the artifact for this config")


def check_signature(ctx: CheckContext) -> Iterator[Finding]:
    """Architecture, model type and structure against the config; our signatures recomputed."""
    config = ctx.require_hf_config()
    file = str(ctx.hf_config_path) if ctx.hf_config_path else None
    source = as_dict(ctx.meta.get("source"))
    yield from _compare_identity(source, config, file)
    yield from _compare_structure(source, config)
    yield from _recompute(ctx, config)
