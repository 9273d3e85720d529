"""Reading the installed transformers' own TP plan and expanding its globs (lazy torch).

The plan lives in two class attributes: the config's ``base_model_tp_plan`` (keys relative to
the base model) and the model class's ``_tp_plan``; transformers merges them on the instance
at ``post_init``. Every rule must match at least one module of the meta-device model, and
every style must be one we can lift (:mod:`hpcodegen.generate.sources.styles`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass
from typing import Any

from hpcodegen.errors import PlanError, error
from hpcodegen.generate.sources.globs import expand_glob, parent_of
from hpcodegen.generate.sources.styles import PARAM_KINDS, STYLE_KINDS, Kind, style_kind


@dataclass(frozen=True)
class Assignment:
    """One module's style after glob expansion."""

    fqn: str
    kind: Kind
    factor: int
    style: str
    rule: str
    #: ``fqn`` names a parameter (a packed expert weight), not a module
    param: bool = False


def hf_rules(model: Any) -> list[tuple[str, str]]:
    """The model's TP plan as ``(glob, style)`` pairs, in plan order.

    Prefers the instance's merged ``_tp_plan``; else merges the config's
    ``base_model_tp_plan`` (prefixed with ``base_model_prefix``) and the class ``_tp_plan``.
    """
    merged = getattr(model, "_tp_plan", None)
    if isinstance(merged, Mapping) and merged:
        return [(str(k), str(v)) for k, v in merged.items()]
    rules: list[tuple[str, str]] = []
    prefix = base_model_fqn(model)
    base = getattr(getattr(model, "config", None), "base_model_tp_plan", None) or {}
    for key, style in base.items():
        rules.append((f"{prefix}.{key}" if prefix else str(key), str(style)))
    for key, style in (getattr(type(model), "_tp_plan", None) or {}).items():
        rules.append((str(key), str(style)))
    return rules


def base_model_fqn(model: Any) -> str:
    """Where the base model (the one ``base_model_tp_plan`` names modules of) sits in
    ``model``: its ``base_model_prefix`` attribute; else, when that attribute is absent
    (Llama-4's causal LM names its prefix ``language_model`` and holds the decoder as
    ``model``), the one direct child that is a transformers model itself; else the root
    (the model is the base model)."""
    prefix = getattr(model, "base_model_prefix", "") or ""
    if prefix and hasattr(model, prefix):
        return prefix
    inner = [name for name, child in model.named_children()
             if hasattr(child, "base_model_prefix") and hasattr(child, "config")]
    return inner[0] if len(inner) == 1 else ""


def expand_rules(rules: Sequence[tuple[str, str]], fqns: Sequence[str],
                 param_fqns: Sequence[str] = (),
                 overridden: Set[str] = frozenset(), *,
                 origin: str = "HF plan", strict: bool = True,
                 unmatched: list[str] | None = None) -> dict[str, Assignment]:
    """Map each module FQN to its style; later rules win, as in transformers.

    A rule whose every match (module, or the module owning a matched parameter) is in
    ``overridden`` (matched by a recipe rule, or by a package rule for HF rules) is
    dropped: recipes win over the package rules, which win over the HF plan. With
    ``strict=False`` (the HF plan and the package rules, which cover config variants) a rule
    matching no module (nor parameter) is skipped, whatever its style, as transformers
    skips it; its glob is appended to ``unmatched`` when given, so the caller can say so.

    Raises:
        PlanError: a style we cannot lift, or a rule that matches no module.
    """
    out: dict[str, Assignment] = {}
    problems = []
    for glob, style in rules:
        if _overridden(glob, fqns, param_fqns, overridden):
            continue
        matched = expand_glob(glob, fqns)
        on_params = [] if matched else expand_glob(glob, param_fqns)
        if not matched and not on_params and not strict:
            if unmatched is not None:
                unmatched.append(glob)
            continue
        kind = style_kind(style)
        if kind is None:
            problems.append(error(
                "generate.unsupported_style", glob,
                f"{origin} rule {glob!r}: style {style!r} is not supported",
                expected=", ".join(sorted(STYLE_KINDS)),
                hint="override the module with a recipe rule (--recipe); recipes win"))
            continue
        if on_params and kind[0] in PARAM_KINDS:
            for fqn in on_params:
                out[fqn] = Assignment(fqn, kind[0], kind[1], style, glob, param=True)
        elif on_params:
            problems.append(error(
                "generate.rule_on_parameter", glob,
                f"{origin} rule {glob!r} ({style}) names parameters; style {style!r} "
                "only applies to modules",
                hint="place the parameters with a recipe rule (params)"))
        elif not matched and strict and not _alternative(glob, fqns):
            problems.append(error(
                "generate.rule_no_match", glob,
                f"{origin} rule {glob!r} ({style}) matches no module of the model"))
        for fqn in matched:
            out[fqn] = Assignment(fqn, kind[0], kind[1], style, glob)
    if problems:
        raise PlanError(problems)
    return out


def _alternative(glob: str, fqns: Sequence[str]) -> bool:
    """A rule for one variant of a layer: its parent glob matches, the child is absent.

    HF writes one plan per family: ``layers.*.mlp.gate_proj`` (dense layers) next to
    ``layers.*.mlp.experts`` (sparse ones). A config whose layers are all sparse has no
    ``mlp.gate_proj``; transformers skips such a rule, and so do we. A rule whose parent
    matches nothing either (a wrong prefix) is still an error.
    """
    parent = parent_of(glob)
    return "." in glob and bool(expand_glob(parent, fqns))


def _overridden(glob: str, fqns: Sequence[str], param_fqns: Sequence[str],
                overridden: Set[str]) -> bool:
    owners = expand_glob(glob, fqns) or [parent_of(p) for p in expand_glob(glob, param_fqns)]
    return bool(owners) and all(o in overridden for o in owners)
