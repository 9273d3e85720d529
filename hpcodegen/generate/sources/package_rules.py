"""Rules shipped inside the package, chosen by the config's ``model_type`` (pure: no torch).

transformers ships no ``base_model_tp_plan`` for some families (GPT-2, Falcon, Hunyuan-V1
dense) and a plan we must correct for others. ``hpcodegen/generate/rules/<model_type>.yaml``
fills the gap, so ``generate --model DIR --tp N`` works with no recipe from the user, and
``generate`` prints which rules came from the package. A file is data, not code::

    reason: transformers ships no base_model_tp_plan for GPT-2   # printed by generate
    replace_hf_plan: true      # ignore the HF plan (default false: the rules extend it)
    tp_plan:                   # full module FQN globs -> HF style names (docs/generate.md);
      "transformer.h.*.attn.c_attn": "packed_colwise:3"     # a packed style with n blocks
      "transformer.h.*.attn.c_proj": rowwise
    recipe: []                 # recipe rules (schemas/recipe.schema.json), after the lift
    unsplit_fields: []         # head-count fields the rules do not split (no divisibility)
    no_sp: why --sp cannot run # optional: generate refuses --sp, naming the file and this
    variants:                  # optional; the first whose `when` holds is merged on top
      - when: {multi_query: true, new_decoder_architecture: [false, null]}
        reason: one shared k/v head cannot be split over tp: attention stays replicated
        tp_plan: {...}
      - when_indivisible: {num_key_value_heads: 2}   # holds when a field % (2 * tp) != 0
        reason: heads are split in pairs: attention stays replicated

A ``tp_plan`` rule wins over an HF rule for the same modules (an HF rule whose modules all
match package rules is dropped, whatever its style); the user's ``--recipe`` wins over both.
``when`` compares config fields (a missing field reads as null; a list means any of).

A model_type without a file of its own that reuses another family's modeling classes (a
model_type built from ``transformers.models.X`` classes) gets the rules of the family whose
transformers package defines its model class (``X.yaml``): the rules
name modules of those classes, so they hold for every model_type built from them.

``when_indivisible`` holds when some config field is not a multiple of its factor times
the tp size (a layout that needs whole groups of heads per rank); a variant with both
``when`` and ``when_indivisible`` needs both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from hpcodegen.errors import PlanError, error

RULES_PACKAGE = "hpcodegen.generate.rules"
_TOP_KEYS = frozenset({"reason", "replace_hf_plan", "tp_plan", "recipe", "variants",
                       "unsplit_fields", "no_sp"})
_VARIANT_KEYS = frozenset({"when", "when_indivisible", "reason", "replace_hf_plan", "tp_plan",
                           "recipe", "unsplit_fields", "no_sp"})


@dataclass(frozen=True)
class PackageRules:
    """The rules of one model_type for one config (variants resolved)."""

    file: str
    reasons: tuple[str, ...]
    replace_hf_plan: bool = False
    tp_plan: tuple[tuple[str, str], ...] = ()
    recipe: tuple[Mapping[str, Any], ...] = field(default_factory=tuple)
    #: head-count fields of the config these rules do not split over tp (GPTBigCode's one
    #: shared k/v head under multi_query): exempt from the divisibility check
    unsplit_fields: tuple[str, ...] = ()
    #: why these rules cannot run with --sp (generate refuses it, naming the file), or None
    no_sp: str | None = None

    def describe(self) -> str:
        """One line for generate's output: which file, what it does, and why."""
        how = "replace the HF plan" if self.replace_hf_plan else "extend the HF plan"
        counts = f"{len(self.tp_plan)} tp_plan rules, {len(self.recipe)} recipe rules"
        return f"package rules {self.file} ({how}; {counts}): {'; '.join(self.reasons)}"

    def record(self) -> dict[str, Any]:
        """What the rules contribute to the artifact's input digest (``yaml_sha256``)."""
        return {"file": self.file, "replace_hf_plan": self.replace_hf_plan,
                "tp_plan": [list(r) for r in self.tp_plan], "recipe": list(self.recipe)}


def rules_file_name(model_type: str) -> str:
    return f"{model_type}.yaml"


def _bad(file: str, where: str, message: str) -> PlanError:
    return PlanError([error("package_rules.invalid", where, message, file=file)])


def _read(model_type: str) -> tuple[str, Any] | None:
    name = rules_file_name(model_type)
    if not model_type or "/" in model_type or model_type.startswith("."):
        return None
    path = resources.files(RULES_PACKAGE).joinpath(name)
    if not path.is_file():
        return None
    import yaml

    label = f"hpcodegen/generate/rules/{name}"
    try:
        return label, yaml.safe_load(path.read_text("utf-8"))
    except yaml.YAMLError as exc:
        raise _bad(label, "", f"not valid YAML: {exc}") from None


def _check_part(label: str, where: str, part: Any, keys: frozenset[str]) -> None:
    if not isinstance(part, Mapping):
        raise _bad(label, where, "expected a mapping")
    unknown = sorted(set(part) - keys)
    if unknown:
        raise _bad(label, where, f"unknown keys {unknown}; expected some of {sorted(keys)}")
    plan = part.get("tp_plan", {})
    if not isinstance(plan, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in plan.items()):
        raise _bad(label, f"{where}/tp_plan", "expected a mapping of glob -> style name")
    if not isinstance(part.get("recipe", []), list):
        raise _bad(label, f"{where}/recipe", "expected a list of recipe rules")
    if not isinstance(part.get("replace_hf_plan", False), bool):
        raise _bad(label, f"{where}/replace_hf_plan", "expected true or false")
    unsplit = part.get("unsplit_fields", [])
    if not isinstance(unsplit, list) or not all(isinstance(f, str) for f in unsplit):
        raise _bad(label, f"{where}/unsplit_fields", "expected a list of config field names")
    if not isinstance(part.get("no_sp", ""), str):
        raise _bad(label, f"{where}/no_sp", "expected the reason --sp is refused (a string)")
    if "when" in part and not isinstance(part["when"], Mapping):
        raise _bad(label, f"{where}/when", "expected a mapping of config field -> value(s)")
    factors = part.get("when_indivisible", {})
    if not isinstance(factors, Mapping) or not all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 1
            for k, v in factors.items()):
        raise _bad(label, f"{where}/when_indivisible",
                   "expected a mapping of config field -> positive integer factor")


def _holds(when: Mapping[str, Any], config: Mapping[str, Any]) -> bool:
    for key, want in when.items():
        options = want if isinstance(want, list) else [want]
        if config.get(key) not in options:
            return False
    return True


def _indivisible(factors: Mapping[str, int], config: Mapping[str, Any], tp: int) -> bool:
    """True when some integer field is not a multiple of ``factor * tp``."""
    return any(isinstance(config.get(key), int) and config[key] % (factor * tp) != 0
               for key, factor in factors.items())


def package_rules(config: Mapping[str, Any], family: str | None = None, tp: int = 1
                  ) -> PackageRules | None:
    """The shipped rules for ``config['model_type']`` at tp size ``tp``, None when the
    package has none.

    Args:
        config: the HF config (plain JSON).
        family: the transformers package defining the model's class (``gpt2`` for
            ``transformers.models.gpt2.modeling_gpt2.GPT2LMHeadModel``); its rules are used
            when the model_type has no file of its own.
        tp: the tp size (``when_indivisible`` variants).

    Raises:
        PlanError: a shipped file that breaks the format (a bug in the package).
    """
    model_type = str(config.get("model_type") or "")
    found, shared = _read(model_type), ()
    if found is None and family and family != model_type:
        found = _read(family)
        shared = (f"{model_type} is built from the classes of transformers.models.{family}",)
    if found is None:
        return None
    label, data = found
    _check_part(label, "", data, _TOP_KEYS)
    parts = [data]
    variants = data.get("variants", [])
    if not isinstance(variants, list):
        raise _bad(label, "/variants", "expected a list")
    for i, variant in enumerate(variants):
        _check_part(label, f"/variants/{i}", variant, _VARIANT_KEYS)
        factors = variant.get("when_indivisible")
        if _holds(variant.get("when", {}), config) and (
                factors is None or _indivisible(factors, config, tp)):
            parts.append(variant)
            break
    from hpcodegen.generate.sources.recipe import validate_recipe

    recipe: list[Mapping[str, Any]] = []
    plan: dict[str, str] = {}
    replace_hf = False
    unsplit: list[str] = []
    no_sp: str | None = None
    for part in parts:
        unsplit.extend(part.get("unsplit_fields", []))
        no_sp = part.get("no_sp", no_sp)
        plan.update(part.get("tp_plan", {}))
        recipe.extend(validate_recipe(part.get("recipe", []), label))
        replace_hf = part.get("replace_hf_plan", replace_hf)
    reasons = shared + tuple(str(p["reason"]) for p in parts if p.get("reason"))
    return PackageRules(label, reasons, replace_hf, tuple(plan.items()), tuple(recipe),
                        tuple(unsplit), no_sp)


def rerooted(rules: PackageRules, base: str, at: str, owner: str) -> PackageRules:
    """The rules of a sub-model's family, moved to where the sub-model sits in a composite.

    ``rules`` name modules of that family's causal LM, whose base model is ``base``
    (``model.layers.*...`` for Persimmon); the composite holds the base model at ``at``
    (Fuyu's ``model.language_model``). Rules under ``base`` move under ``at``; the others
    (the family's own ``lm_head``) are dropped: the composite's head is its own. The rules
    extend the composite's HF plan (they may only replace the part they cover).
    """
    def move(glob: str) -> str | None:
        if base and glob.startswith(base + "."):
            return f"{at}.{glob[len(base) + 1:]}"
        return None if base else f"{at}.{glob}"

    plan = tuple((g, s) for g, s in ((move(g), s) for g, s in rules.tp_plan) if g)
    recipe = []
    for rule in rules.recipe:
        match = rule["match"]
        moved = [m for m in map(move, [match] if isinstance(match, str) else match) if m]
        if moved:
            recipe.append({**rule, "match": moved[0] if isinstance(match, str) else moved})
    why = (f"{owner}'s {at} is built from the classes of that family: {rules.file}, its "
           f"rules under {base or '(the root)'} moved under {at}",)
    return PackageRules(rules.file, why + rules.reasons, False, plan, tuple(recipe),
                        rules.unsplit_fields, rules.no_sp)


def unsplit_fields(config: Mapping[str, Any], tp: int = 1) -> tuple[str, ...]:
    """The config fields the shipped rules of ``config``'s model_type do not split over tp
    (for the divisibility checks of verify and inspect-plan, which see no model class)."""
    rules = package_rules(config, tp=tp)
    return rules.unsplit_fields if rules is not None else ()


def merged_rules(hf: Sequence[tuple[str, str]], rules: PackageRules | None
                 ) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """``(HF rules kept, package rules)``; the package's come last, so they win."""
    if rules is None:
        return list(hf), []
    return ([] if rules.replace_hf_plan else list(hf)), list(rules.tp_plan)
