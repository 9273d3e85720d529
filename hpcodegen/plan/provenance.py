"""Where a plan came from and how its files are pinned: the meta's bookkeeping (pure).

Part of the typed plan (:mod:`hpcodegen.plan.types`): ``Plan.provenance`` holds the keys
that say what the artifact was generated from and fix its files (signature, source, output
digests, the reference generator's records), apart from what the plan shards.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hpcodegen.plan.frozen import EMPTY, FrozenMap


@dataclass(frozen=True, kw_only=True, slots=True)
class Source:
    """``source``: where the generated modeling module came from."""

    module_name: str | None = None
    """``module_name``, e.g. ``"transformers.models.llama.modeling_llama"``."""
    architecture: str | None = None
    """``architecture``: the HF model class (``architectures[0]``), e.g. ``"LlamaForCausalLM"``."""
    model_type: str | None = None
    """``model_type``: the HF config's, e.g. ``"llama"``."""
    structure: FrozenMap[str, Any] | None = None
    """``structure``: the config's shape fields (frozen JSON), e.g. ``{"hidden_size": 64}``;
    sub-config fields under dotted paths (``text_config.hidden_size``)."""
    extra: FrozenMap[str, Any] = EMPTY
    """The other keys (``file_path``, ``sha256``, ``transformers_version`` ...), verbatim."""


@dataclass(frozen=True, kw_only=True, slots=True)
class OutputDigest:
    """One ``outputs`` record: a generated file's digest."""

    sha256: str
    """sha256 of the file's bytes (64 hex digits)."""
    lines: int
    """The file's line count."""
    extra: FrozenMap[str, Any] = EMPTY
    """Keys no field models, verbatim."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Provenance:
    """Where a plan came from and how its files are pinned (not what it shards)."""

    codegen_version: str | None = None
    """``codegen_version``, e.g. ``"0.1.1"``."""
    signature: str | None = None
    """``signature``: 12 hex digits over architecture, structure and plan."""
    yaml_path: str | None = None
    """``yaml_path``: the YAML the reference generator froze from (``""`` for hpcodegen)."""
    yaml_sha256: str | None = None
    """``yaml_sha256``: its sha256 (``""`` when unknown)."""
    source: Source | None = None
    """``source``: the transformers module, architecture and structure."""
    outputs: FrozenMap[str, OutputDigest] | None = None
    """``outputs``: generated file by role (``modeling``, ``diff``, ``init``) -> digest."""
    generator: FrozenMap[str, Any] | None = None
    """``generator`` (hpcodegen's metas): ``{"name": "hpcodegen", "version": ...}``, with
    ``inputs`` (how it was generated: :mod:`hpcodegen.generate.sources.recorded`)."""
    model_name: str | None = None
    """``model_name``: names the modeling file ``modeling_<model_name>_gen_npu.py``."""
    model_class: str | None = None
    """``model_class``: the model class to build from the generated module."""
    covered: FrozenMap[str, Any] | None = None
    """``covered``: what the plan covers (``sharding_plan``, ``module_overrides``, ``axes``)."""
    not_covered: tuple[Any, ...] | None = None
    """``not_covered``: what it leaves to others, e.g. ``("mesh", "fsdp2")``."""
    replacements: tuple[Any, ...] | None = None
    """``replacements``: the reference generator's source replacements (frozen JSON)."""
    skipped_overrides: tuple[Any, ...] | None = None
    """``skipped_overrides``: overrides the reference generator skipped (frozen JSON)."""
    external_state_classes: tuple[Any, ...] | None = None
    """``external_state_classes``: classes whose state lives outside the module tree."""
    remote_siblings: tuple[Any, ...] | None = None
    """``remote_siblings``: sibling files copied for remote-code sources."""

    @property
    def generator_name(self) -> str | None:
        """``generator.name`` (``"hpcodegen"`` for our metas), else None."""
        name = (self.generator or EMPTY).get("name")
        return name if isinstance(name, str) else None


#: The provenance of a plan built without a meta (tests, generate in progress).
NO_PROVENANCE = Provenance()
