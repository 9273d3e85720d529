"""Read and check an artifact's meta for the runtime, and compare it with a model's config.

The checking half of :meth:`hpcodegen.runtime.artifact.Artifact.load`, pure (no torch):
verify's runtime checks on one read of the meta (schema, plan, injection targets, output
hashes), then, with a config, its architecture and verify's ``signature`` check on those
same loaded bytes. It lives apart from :mod:`hpcodegen.runtime.api` and
:mod:`hpcodegen.runtime.artifact` so both import it and neither imports the other back
(``api`` -> ``artifact`` -> ``checked``, one direction).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from hpcodegen.artifact.load import LoadedMeta, load_meta
from hpcodegen.errors import PlanError, error
from hpcodegen.hf import architecture_of
from hpcodegen.plan.types import Plan


def config_dict(hf_config: Any) -> dict[str, Any] | None:
    """A config given as a ``PretrainedConfig``, a dict or a path, as a dict (None: None)."""
    if hf_config is None or isinstance(hf_config, Mapping):
        return dict(hf_config) if hf_config is not None else None
    if hasattr(hf_config, "to_dict"):
        return hf_config.to_dict()
    if not isinstance(hf_config, (str, os.PathLike)):
        raise PlanError([error("runtime.bad_hf_config", "hf_config",
                               f"unusable hf_config of type {type(hf_config).__name__}",
                               expected="a PretrainedConfig, a dict, or a path to config.json "
                                        "or its directory")])
    from hpcodegen.hf import read_hf_config

    return read_hf_config(hf_config)[0]


def _recorded_view(config: dict[str, Any], plan: Plan) -> dict[str, Any]:
    """A ``PretrainedConfig.to_dict()`` narrowed to the structure fields the artifact recorded.

    ``to_dict`` adds every class default and attribute alias (``attention_bias``,
    ``num_local_experts`` for ``num_experts``) that the config.json the artifact was
    generated from never wrote; the signature covers the fields that file set, so those are
    the ones compared (as verify's structure check compares only recorded fields), in
    sub-configs too (``text_config.hidden_size``).
    """
    from hpcodegen.hf import structure_view

    source = plan.provenance.source
    recorded = source.structure if source is not None else None
    if recorded is None:
        return config
    return structure_view(config, recorded)


def load_verified_meta(artifact_dir: str | os.PathLike[str], hf_config: Any = None, *,
                       allowed_target_prefixes: tuple[str, ...] = ()) -> LoadedMeta:
    """Load the meta once and run verify's checks on it (schema, plan, targets, output
    hashes); the result holds the typed ``plan``.

    Injection targets must be in the registry (:mod:`hpcodegen.targets`) or under one of
    ``allowed_target_prefixes``, as ``verify --allow-target`` decides. With a config,
    :func:`check_config` runs on the same loaded bytes. Nothing is imported from the
    artifact.
    """
    from hpcodegen.verify import RUNTIME_CHECKS, check_meta

    loaded = check_meta(load_meta(artifact_dir), RUNTIME_CHECKS,
                        allowed_targets=allowed_target_prefixes)
    return check_config(loaded, hf_config)


def check_config(loaded: LoadedMeta, hf_config: Any) -> LoadedMeta:
    """``loaded`` (already checked) compared with a model's config; ``loaded`` again.

    Refuse another architecture (``architectures[0]`` vs ``source.architecture``), then run
    verify's ``signature`` check against the config (the same architecture in another
    shape is refused too). ``hf_config`` None: nothing to compare, ``loaded`` as is. The
    signature check reads the schema verdict the load's checks left in ``loaded.memo``
    (the same bytes), so a load with a config judges the schema once.

    Raises:
        PlanError: (exit 1) another model, naming the one the artifact expects.
        InputError: (exit 2) a config path that cannot be read.
    """
    from hpcodegen.verify import check_meta

    config = config_dict(hf_config)
    if config is None:
        return loaded
    if not isinstance(hf_config, (Mapping, str, os.PathLike)):
        config = _recorded_view(config, loaded.plan)
    _check_architecture(loaded, hf_config, config)
    return check_meta(loaded, ("signature",), hf_config=config)


def _check_architecture(loaded: LoadedMeta, hf_config: Any, config: dict[str, Any]) -> None:
    source = loaded.plan.provenance.source if loaded.plan is not None else None
    want = source.architecture if source is not None else None
    got = architecture_of(config)
    if got is None and not isinstance(hf_config, (Mapping, str, os.PathLike)):
        # a config object without ``architectures``: typically a composite model's text
        # sub-config (``model.config`` of Mllama's causal LM), which also lacks the
        # composite's shape fields the signature covers
        raise PlanError([error(
            "runtime.config_without_architecture", "hf_config",
            f"the config object {type(hf_config).__name__} (model_type "
            f"{config.get('model_type')!r}) names no architecture to compare with "
            f"{want!r} (the meta's /source/architecture)",
            expected=f"a config whose architectures[0] is {want!r}",
            hint="pass the model's config.json (its path or dict) or the full config "
                 "AutoConfig.from_pretrained(model_dir) gives, not a sub-config")])
    if want != got:
        raise PlanError([error("runtime.architecture", "/source/architecture",
                               f"the artifact was generated for {want!r}, the config is "
                               f"for {got!r}", expected=str(got), file=str(loaded.meta_path),
                               hint="generate an artifact for this model")])
