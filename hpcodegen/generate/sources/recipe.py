"""Recipes: YAML rules over module FQN globs that add or override plan entries.

A recipe is a list of rules (``schemas/recipe.schema.json``)::

    - match: "model.layers.*.self_attn"      # a glob or a list of globs
      params: {q_proj.weight: {tp: "S(0)"}}  # merged into the entry, rule wins
      out_dst: {output: {tp: "R"}}           # in/out fields replace the entry's
      injections: {inner_wrapper: sdpa_hf}

Recipes win over the HF plan: a parameter a rule places is removed from any entry the HF
plan gave it to. A rule that matches nothing is an error naming its index and match. A file
that cannot be read or parsed exits 2; one that breaks the schema exits 1 with a JSON
pointer per problem.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from hpcodegen.errors import InputError, PlanError, error, pointer
from hpcodegen.generate.sources.globs import fqn_matches
from hpcodegen.plan.draft import DraftEntry, DraftPlan
from hpcodegen.plan.entry import join_fqn

REPLACED_FIELDS = ("in_src", "in_dst", "out_src", "out_dst", "out_names", "is_boundary",
                   "tp_divide_attrs", "deferred_bias_params", "partial_grad_params")
INJECTION_KEYS = ("inner_wrapper", "inner_target", "inner_out_src", "local_compute_fn")


def recipe_schema() -> dict[str, Any]:
    """The published recipe schema (``schemas/recipe.schema.json``)."""
    text = resources.files("hpcodegen.schemas").joinpath("recipe.schema.json").read_text("utf-8")
    return json.loads(text)


def validate_recipe(data: Any, file: str = "") -> list[dict[str, Any]]:
    """Schema-check a parsed recipe; PlanError (exit 1) with one finding per problem."""
    from hpcodegen.checks.schema import strict_validator

    validator = strict_validator(recipe_schema())
    problems = [
        error("recipe.schema", pointer(*e.absolute_path), e.message, file=file or None)
        for e in sorted(validator.iter_errors(data), key=lambda e: list(map(str, e.absolute_path)))
    ]
    if problems:
        raise PlanError(problems)
    return list(data)


def load_recipe(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read, parse and validate a recipe file.

    Raises:
        InputError: (exit 2) missing, unreadable or not YAML.
        PlanError: (exit 1) valid YAML that breaks the schema.
    """
    import yaml

    p = Path(path)
    text = _read_text(p)
    try:
        data = _bounded_load(text, _unique_key_loader())
    except _TooLarge as exc:
        raise InputError([error("recipe.too_large", exc.where, str(exc), file=str(p),
                                hint="a recipe is a short list of rules: split or simplify "
                                     "it (YAML aliases count once per use)")]) from None
    except _BigInteger as exc:
        raise InputError([error("recipe.integer_range", exc.where,
                                f"an integer of {exc.digits} characters (line {exc.line})",
                                expected=f"an integer of magnitude below 2^{INT_BITS}",
                                hint="recipes hold names, placements and small numbers",
                                file=str(p))]) from None
    except _DuplicateKey as exc:
        raise InputError([error("recipe.duplicate_key", exc.where,
                                f"key {exc.key!r} occurs twice in one mapping (line "
                                f"{exc.line}); YAML would keep the last silently",
                                hint="merge the two entries", file=str(p))]) from None
    except yaml.YAMLError as exc:
        raise InputError([error("recipe.invalid_yaml", "", f"not valid YAML: {exc}",
                                file=str(p))]) from None
    rules = validate_recipe(data, str(p))
    _check_size(rules, str(p))
    return rules


#: Most rules and globs a recipe may hold, and the longest glob: matching costs rules x
#: globs x modules, so these keep a hostile recipe's work bounded (real ones hold tens).
MAX_RULES = 2_000
MAX_GLOBS = 10_000
MAX_GLOB_CHARS = 1_024


def _check_size(rules: Sequence[Mapping[str, Any]], file: str) -> None:
    globs = [g for rule in rules
             for g in ([rule["match"]] if isinstance(rule["match"], str) else rule["match"])]
    long = next((i for i, g in enumerate(globs) if len(g) > MAX_GLOB_CHARS), None)
    if len(rules) > MAX_RULES or len(globs) > MAX_GLOBS or long is not None:
        raise InputError([error(
            "recipe.too_large", "", f"{len(rules)} rules, {len(globs)} globs"
            + (f", a glob of {len(globs[long])} characters" if long is not None else ""),
            expected=f"at most {MAX_RULES} rules, {MAX_GLOBS} globs of at most "
                     f"{MAX_GLOB_CHARS} characters", file=file)])


#: Bounds on a recipe, so a hostile file is refused at once instead of hanging ``generate``
#: (a 342-byte file of nested aliases expands to 10^9 nodes).
MAX_RECIPE_BYTES = 4 * 2**20
MAX_DEPTH = 64
MAX_NODES = 1_000_000


class _TooLarge(Exception):
    def __init__(self, message: str, where: str = "") -> None:
        super().__init__(message)
        self.where = where


def _read_text(path: Path) -> str:
    """The recipe's text; InputError for anything but a readable regular file (a FIFO
    would block), over :data:`MAX_RECIPE_BYTES`, or not UTF-8."""
    import stat

    try:
        if not stat.S_ISREG(path.stat().st_mode):
            raise OSError(f"{path} is not a regular file")
        with open(path, "rb") as fh:
            raw = fh.read(MAX_RECIPE_BYTES + 1)
        if len(raw) > MAX_RECIPE_BYTES:
            raise OSError(f"larger than {MAX_RECIPE_BYTES // 2**20} MiB")
        return raw.decode("utf-8")
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InputError([error("recipe.unreadable", "", f"cannot read recipe: {exc}",
                                file=str(path))]) from None


def _bounded_load(text: str, loader_cls: Any) -> Any:
    """Parse YAML with bounded work: nesting depth at most :data:`MAX_DEPTH` (checked on the
    event stream, before any recursive step) and at most :data:`MAX_NODES` nodes once every
    alias is expanded (counted on the composed graph, shared nodes memoized), so an alias
    bomb is refused without being expanded."""
    import yaml

    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_DEPTH:
                raise _TooLarge(f"nested deeper than {MAX_DEPTH} levels",
                                f"line {event.start_mark.line + 1}")
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1
    loader = loader_cls(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if _expanded_size(node) > MAX_NODES:
            raise _TooLarge(f"expands to more than {MAX_NODES} values (aliases included)")
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _expanded_size(root: Any) -> int:
    """Nodes of the document with every alias expanded, without expanding it: a node's
    size is computed once (post-order, iteratively) and shared by its aliases."""
    import yaml

    sizes: dict[int, int] = {}
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        if id(node) in sizes:
            continue
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        else:
            sizes[id(node)] = 1
            continue
        if done:
            sizes[id(node)] = min(MAX_NODES + 1, 1 + sum(sizes[id(c)] for c in children))
        else:
            stack.append((node, True))
            stack.extend((c, False) for c in children if id(c) not in sizes)
    return sizes[id(root)]


#: Integers in a recipe (wrapper kwargs) stay below 2^63 in magnitude; longer literals are
#: refused before Python converts them (a 5,000-digit one is over its conversion limit).
INT_BITS = 63
_MAX_INT_CHARS = 40


class _BigInteger(Exception):
    def __init__(self, digits: int, line: int) -> None:
        super().__init__(digits)
        self.digits, self.line, self.where = digits, line, f"line {line}"


class _DuplicateKey(Exception):
    def __init__(self, key: Any, where: str, line: int) -> None:
        super().__init__(key)
        self.key, self.where, self.line = key, where, line


def _unique_key_loader() -> Any:
    """A ``yaml.SafeLoader`` that refuses a key repeated in one mapping (as verify refuses
    duplicate JSON keys) instead of keeping the last one."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_yaml_int(self, node: Any) -> int:
            line = node.start_mark.line + 1
            text = str(node.value)
            if len(text) > _MAX_INT_CHARS:
                raise _BigInteger(len(text), line)
            value = super().construct_yaml_int(node)
            if abs(value) >= 2**INT_BITS:
                raise _BigInteger(len(text), line)
            return value

        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            # YAML merge keys (``<<: *defaults``) are supported: the merged keys come
            # first and the mapping's own keys override them (flatten_mapping); only the
            # mapping's own keys must be unique
            seen: set[Any] = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                if isinstance(key, (str, int, float, bool)) or key is None:
                    if key in seen:
                        raise _DuplicateKey(key, f"line {key_node.start_mark.line + 1}",
                                            key_node.start_mark.line + 1)
                    seen.add(key)
            return super().construct_mapping(node, deep=deep)

    UniqueKeyLoader.add_constructor("tag:yaml.org,2002:int",
                                    UniqueKeyLoader.construct_yaml_int)
    return UniqueKeyLoader


def recipe_target_findings(rules: Sequence[Mapping[str, Any]],
                           prefixes: Sequence[str] = (), file: str = "") -> list[Any]:
    """An error for every injection target the runtime would refuse to load.

    Whatever generate writes, the runtime must be able to run: a target outside the
    injection registry (:mod:`hpcodegen.targets`) is refused here, at its recipe pointer.
    """
    from hpcodegen.targets import TARGET_FIELDS, registry, target_spec

    known = registry()
    out = []
    for index, rule in enumerate(rules):
        for key in TARGET_FIELDS:
            value = (rule.get("injections") or {}).get(key)
            if value is None:
                continue
            name = value.get("_target_") if isinstance(value, Mapping) else value
            if target_spec(name, prefixes, known) is None:
                out.append(error(
                    "recipe.foreign_target", pointer(index, "injections", key),
                    f"injection target {name!r} is not in the injection registry: the "
                    "runtime would refuse to run it",
                    expected=f"one of {', '.join(sorted(n for n in known if '.' not in n))}"
                             " or a registered entry point",
                    hint="register it (entry point group hpcodegen.injection_targets) or "
                         "pass --allow-target PREFIX", file=file or None))
    return out


def _matches(index: int, rule: Mapping[str, Any], fqns: Sequence[str]) -> list[str]:
    globs = [rule["match"]] if isinstance(rule["match"], str) else list(rule["match"])
    found = [f for f in fqns if any(fqn_matches(g, f) for g in globs)]
    if not found:
        raise PlanError([error("recipe.no_match", f"/{index}/match",
                               f"recipe rule {index} (match {rule['match']!r}) matches no module",
                               hint="check the FQNs with `hpcodegen inspect-plan`")])
    return found


def recipe_modules(rules: Sequence[Mapping[str, Any]], fqns: Sequence[str]) -> set[str]:
    """Every module FQN some rule matches (a rule matching nothing is an error)."""
    return {fqn for index, rule in enumerate(rules) for fqn in _matches(index, rule, fqns)}


def apply_recipe(plan: DraftPlan, rules: Sequence[Mapping[str, Any]],
                 fqns: Sequence[str]) -> list[dict[str, Any]]:
    """Apply every rule to ``plan`` in order (in place); returns the injection records.

    A rule's values enter the draft through the plan's codec (the one reader of a
    placement string); one it refuses is a finding naming the rule.
    """
    from hpcodegen.plan.codec import PlanFormatError

    injections: dict[str, dict[str, Any]] = {}
    for index, rule in enumerate(rules):
        for fqn in _matches(index, rule, fqns):
            entry = plan.entry(fqn)
            try:
                _apply_rule(plan, entry, rule)
            except PlanFormatError as exc:
                raise PlanError([error("recipe.invalid_value", f"/{index}{exc.where}",
                                       f"rule {index} on {fqn}: {exc.message}")]) from None
            if rule.get("injections"):
                injections.setdefault(fqn, {}).update(rule["injections"])
    return [{"match": fqn, **injections[fqn]} for fqn in sorted(injections)]


def _apply_rule(plan: DraftPlan, entry: DraftEntry, rule: Mapping[str, Any]) -> None:
    """One rule's ``params`` (merged) and replaced fields on one entry."""
    from hpcodegen.plan.codec import entry_field_from_json

    params = rule.get("params")
    if params is not None:
        parsed = entry_field_from_json("params", params, ())
        entry.set_placements("params", {**entry.placements("params"), **parsed})
        for rel in params:
            _drop_elsewhere(plan, entry.fqn, join_fqn(entry.fqn, rel))
    entry.update_json({key: rule[key] for key in REPLACED_FIELDS if key in rule})


def _drop_elsewhere(plan: DraftPlan, keep: str, full: str) -> None:
    """Remove ``full`` from every entry but ``keep`` (the recipe's placement wins)."""
    for fqn, entry in plan.items():
        if fqn == keep:
            continue
        for rel in list(entry.placements("params")):
            if join_fqn(fqn, rel) != full:
                continue
            entry.unplace("params", rel)
            for key in ("deferred_bias_params", "partial_grad_params", "tp_rank0_params"):
                entry.remove_name(key, rel)
