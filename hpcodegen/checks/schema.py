"""The ``schema`` check: every JSON Schema violation of the meta at once, each at its pointer.

The schema (``schemas/codegen_meta.schema.json``, draft 2020-12) is the published definition
of the meta; this check maps each violation to a :class:`~hpcodegen.errors.Finding` whose
``where`` is the JSON pointer of the offending value (for a missing field, the pointer the
field would have), and adds duplicate object keys, which JSON parsers silently collapse.

Two readings are stricter than a stock Python validator, so the schema means here what it
says: ``integer`` is a JSON integer (``2.0`` and ``true`` are not, though JSON Schema lets
``2.0`` pass and Python's ``True`` is an ``int``), and a ``pattern``'s final ``$`` is the end
of the string as in ECMA-262 (Python's ``$`` also matches before a final newline, which
would let ``"S(1)\n"`` through).
"""

from __future__ import annotations

import json
import pkgutil
import re
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, replace
from functools import cache, lru_cache
from typing import Any

from hpcodegen.checks.context import CheckContext, pointer
from hpcodegen.checks.schema_fast import surely_valid
from hpcodegen.errors import Finding, error
from hpcodegen.json_key import json_key
from hpcodegen.placement import PLACEMENT_PATTERN

SCHEMA_NAME = "codegen_meta.schema.json"

#: Friendlier words for the patterns the schema uses.
_PATTERN_WORDS: dict[str, tuple[str, str]] = {
    PLACEMENT_PATTERN: ("is not a placement", "one of R, S(n), SS(d,f), P(op) without spaces"),
    "^[0-9a-f]{12}$": ("is not a signature", "12 lowercase hex characters"),
    "^[0-9a-f]{64}$": ("is not a sha256", "64 lowercase hex characters"),
    "^([0-9a-f]{64})?$": ("is not a sha256", "64 lowercase hex characters or \"\""),
    "^[A-Za-z_][A-Za-z0-9_]*$": ("is not a name", "a Python identifier"),
    r"^([A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*)?$": (
        "is not a module path", "names and layer indices joined by dots, or \"\""),
    r"^[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*$": (
        "is not a parameter FQN", "names and layer indices joined by dots"),
    r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$": (
        "is not a target name", "identifiers joined by dots"),
    r"^[A-Za-z0-9_][A-Za-z0-9_.-]*(/[A-Za-z0-9_][A-Za-z0-9_.-]*)*$": (
        "is not a file name", "a relative name of letters, digits, _ . - and /"),
}


def schema_text() -> str:
    """The schema file's text, as shipped in the package (``hpcodegen schema`` prints it).

    Read through the package loader (``pkgutil.get_data``): ``importlib.resources`` would
    import its readers (and ``zipfile`` with them): about 9 ms of the gate's start-up."""
    data = pkgutil.get_data("hpcodegen.schemas", SCHEMA_NAME)
    if data is None:  # a loader that cannot read data files
        from importlib import resources

        return resources.files("hpcodegen.schemas").joinpath(SCHEMA_NAME).read_text("utf-8")
    return data.decode("utf-8")


@lru_cache(maxsize=1)
def _schema_json() -> str:
    return schema_text()


def meta_schema() -> dict[str, Any]:
    """The parsed meta schema (a fresh copy: callers may mutate it)."""
    return json.loads(_schema_json())


def is_json_integer(value: Any) -> bool:
    """A JSON integer: an ``int`` that is not a ``bool`` (``2.0`` is a float here)."""
    return isinstance(value, int) and not isinstance(value, bool)


@cache
def _ecma(pattern: str) -> re.Pattern[str]:
    """``pattern`` with a final unescaped ``$`` read as ECMA-262 does: end of string."""
    if pattern.endswith("$") and not pattern.endswith("\\$"):
        pattern = pattern[:-1] + r"\Z"
    return re.compile(pattern)


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[Any]:
    from jsonschema.exceptions import ValidationError

    if validator.is_type(instance, "string") and not _ecma(pattern).search(instance):
        shown = repr(instance) if len(instance) <= 60 else repr(instance[:57]) + "..."
        yield ValidationError(f"{shown} does not match {pattern!r}")


def strict_validator(schema: Mapping[str, Any]) -> Any:
    """A draft 2020-12 validator of ``schema`` with JSON integers and ECMA-262 ``$``; the
    one way hpcodegen validates JSON against its schemas (the meta, recipes)."""
    from jsonschema import Draft202012Validator, validators

    strict = validators.extend(
        Draft202012Validator, {"pattern": _pattern},
        type_checker=Draft202012Validator.TYPE_CHECKER.redefine(
            "integer", lambda _checker, value: is_json_integer(value)))
    return strict(schema)


@lru_cache(maxsize=1)
def _validator() -> Any:
    return strict_validator(meta_schema())


@lru_cache(maxsize=1)
def top_level_keys() -> frozenset[str]:
    """The top-level properties the schema defines."""
    return frozenset(meta_schema()["properties"])


def _deepest(err: Any) -> Any:
    """For anyOf/oneOf, the alternative that explains the failure best.

    That is the alternative whose type matched (its error is not a ``type`` error), else one
    that got strictly deeper into the value (``[1]`` for a list of strings -> ``/0``); when
    neither exists the anyOf error itself is reported.
    """
    while err.context:
        typed = [e for e in err.context if e.validator != "type"]
        pool = typed or [e for e in err.context
                         if len(e.absolute_path) > len(err.absolute_path)]
        if not pool:
            break
        err = max(pool, key=lambda e: len(e.absolute_path))
    return err


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=True)
    return text if len(text) <= 60 else text[:57] + "..."


def _findings_of(err: Any) -> Iterator[Finding]:
    """Map one jsonschema error to findings (one per missing or unexpected key)."""
    err = _deepest(err)
    path = list(err.absolute_path)
    kind = err.validator
    if kind == "required":
        present = err.instance if isinstance(err.instance, Mapping) else {}
        for key in err.validator_value:
            if key not in present:
                yield error("schema.required", pointer(*path, key),
                            f"required field {key!r} is missing")
        return
    if kind == "additionalProperties" and isinstance(err.instance, Mapping):
        known = set(err.schema.get("properties", {}))
        for key in err.instance:
            if key not in known:
                yield error("schema.unknown_key", pointer(*path, key), f"unexpected key {key!r}",
                            expected="one of " + ", ".join(sorted(known)))
        return
    if kind == "pattern" and err.validator_value in _PATTERN_WORDS:
        what, expected = _PATTERN_WORDS[err.validator_value]
        yield error("schema.pattern", pointer(*path), f"{_short(err.instance)} {what}",
                    expected=expected)
        return
    yield error(f"schema.{kind}", pointer(*path), err.message if len(err.message) < 200
                else f"{_short(err.instance)} violates {kind}")


#: Top-level maps whose values all share one schema (``additionalProperties``): each distinct
#: value is validated once and its errors are reported under every key holding it.
_UNIFORM_MAPS: tuple[str, ...] = ("param_plan", "boundary_classes", "special_handlers")


#: Top-level arrays whose items all share one schema (``items``), found in the schema: each
#: distinct item is validated once; the array's own keywords (``uniqueItems``...) still
#: run on the whole array.
@lru_cache(maxsize=1)
def _uniform_arrays() -> tuple[str, ...]:
    return tuple(field for field, sub in meta_schema()["properties"].items()
                 if isinstance(sub, Mapping) and isinstance(sub.get("items"), Mapping))


def _resolved(schema: Any) -> Any:
    """``schema`` with a lone local ``$ref`` (``{"$ref": "#/$defs/x"}``) followed, once.

    A value checked against ``{"$ref": ...}`` pays a ``referencing`` lookup (~25 us) per
    value; a thousand-key map paid it a thousand times. Annotation keywords beside the
    ``$ref`` do not validate anything; refs inside the target still resolve from the root.
    """
    root = meta_schema()
    for _ in range(32):  # a ref cycle is the schema's bug, not a reason to hang
        if not (isinstance(schema, Mapping) and isinstance(schema.get("$ref"), str)
                and schema["$ref"].startswith("#/")
                and set(schema) <= {"$ref", "description", "examples", "title"}):
            return schema
        node: Any = root
        for part in schema["$ref"][2:].split("/"):
            node = node[part.replace("~1", "/").replace("~0", "~")]
        schema = node
    return schema


@cache
def _value_validator(field: str, part: str = "additionalProperties") -> Any:
    """Validates one value (or, with ``part="propertyNames"``, one key; ``items``, one item)
    of a uniform top-level map or array (refs inside resolve from the root schema)."""
    return _validator().evolve(schema=_resolved(meta_schema()["properties"][field][part]))


@lru_cache(maxsize=1)
def _rest_validator() -> Any:
    """The root validator without the ``items`` of the uniform arrays (checked apart)."""
    return strict_validator(_rest_schema())  # not evolve(): its "$schema" would pick the
    # stock class


@cache
def _has_key_rule(field: str) -> bool:
    return "propertyNames" in meta_schema()["properties"][field]


#: Keywords that only annotate a schema (they accept every value).
_ANNOTATIONS = frozenset({"description", "examples", "title", "$comment"})


@dataclass(frozen=True)
class _StringRule:
    """A value schema that is only a string rule (``type: string`` with ``pattern`` and
    length bounds), judged without the validator: True exactly when it finds no error."""

    regex: Any
    low: int
    high: int | None

    def test(self, value: Any) -> bool:
        return (type(value) is str and self.low <= len(value)
                and (self.high is None or len(value) <= self.high)
                and (self.regex is None or self.regex.search(value) is not None))

    def all_pass(self, values: Collection[Any]) -> bool:
        """:meth:`test` of every value, in C loops (``map``): a 10,000-entry plan's keys
        pass in one sweep; False sends the caller to the value-by-value path."""
        if not values:
            return True
        if set(map(type, values)) != {str}:
            return False
        lengths = set(map(len, values))
        if min(lengths) < self.low or (self.high is not None and max(lengths) > self.high):
            return False
        return self.regex is None or None not in map(self.regex.search, values)


@cache
def _string_rule(field: str, part: str) -> _StringRule | None:
    """The :class:`_StringRule` of one uniform map's keys or values (one array's items), or
    None when that schema is more than a string rule. A 10,000-entry plan has 10,000 keys
    and thousands of sharded parameter names: each passes through one compiled regex
    instead of the validator's keyword dispatch, and only a value that fails is handed to
    the validator for its messages."""
    sub = _resolved(meta_schema()["properties"][field][part])
    if not isinstance(sub, Mapping) or sub.get("type") != "string" \
            or not set(sub) <= {"type", "pattern", "maxLength", "minLength", *_ANNOTATIONS}:
        return None
    pattern = sub.get("pattern")
    low, high = sub.get("minLength", 0), sub.get("maxLength")
    if not isinstance(low, int) or not isinstance(high, (int, type(None))) \
            or not isinstance(pattern, (str, type(None))):
        return None
    return _StringRule(_ecma(pattern) if pattern is not None else None, low, high)


def _errors(field: str, part: str, value: Any) -> list[Any]:
    """The validator's errors of one value of a uniform map or array (the validator runs
    only for a value the one-sided tests cannot pass)."""
    rule = _string_rule(field, part)
    if rule is not None and rule.test(value):
        return []
    root = _root_schema()
    if surely_valid(root["properties"][field][part], value, root, _ecma):
        return []
    return list(_value_validator(field, part).iter_errors(value))


def _all_pass(field: str, part: str, values: Collection[Any]) -> bool:
    """True when every value surely passes (a string rule's sweep); False: look closer."""
    rule = _string_rule(field, part)
    return rule is not None and rule.all_pass(values)


@lru_cache(maxsize=1)
def _root_schema() -> dict[str, Any]:
    """The meta schema, parsed once and never mutated (the one-sided test reads it)."""
    return meta_schema()


@lru_cache(maxsize=1)
def _rest_schema() -> dict[str, Any]:
    """The root schema without the ``items`` of the uniform arrays (checked apart)."""
    schema = meta_schema()
    for field in _uniform_arrays():
        del schema["properties"][field]["items"]
    return schema


def _map_findings(field: str, values: Mapping[str, Any],
                  keys: Mapping[str, str | bytes | None] | None = None) -> Iterator[Finding]:
    """Validate each *distinct* value once: repeated layers share their verdict.

    A 1,000-layer plan has a handful of distinct entries, so the check stays linear in the
    number of distinct contracts rather than in the number of modules.
    """
    if _has_key_rule(field) and not _all_pass(field, "propertyNames", values.keys()):
        for key in values:
            for err in _errors(field, "propertyNames", key):
                for f in _findings_of(err):
                    yield replace(f, where=pointer(field))
    if _all_pass(field, "additionalProperties", values.values()):
        return
    verdicts: dict[str | bytes | None, list[Any]] = {}
    keys = keys or {}
    if len(keys) == len(values) and keys.keys() == values.keys():
        # one value of each distinct content (C loops): a plan whose distinct entries
        # all pass has nothing to report, and the loop below is skipped
        distinct = dict(zip(keys.values(), values.values(), strict=True))
        distinct.pop(None, None)  # a value too deep to key: judged in the loop below
        verdicts = {seen: _errors(field, "additionalProperties", value)
                    for seen, value in distinct.items()}
        if None not in keys.values() and not any(verdicts.values()):
            return
    for key, value in values.items():
        seen = keys[key] if key in keys else json_key(value)
        errors = verdicts.get(seen) if seen is not None else None
        if errors is None:
            errors = verdicts[seen] = _errors(field, "additionalProperties", value)
        for err in errors:
            for f in _findings_of(err):
                yield replace(f, where=pointer(field, key) + f.where)


def _item_findings(field: str, items: list[Any]) -> Iterator[Finding]:
    """Validate each *distinct* item of a uniform array once, reported at every index."""
    if _all_pass(field, "items", items):
        return
    verdicts: dict[str | bytes | None, list[Any]] = {}
    for index, item in enumerate(items):
        seen = json_key(item)
        errors = verdicts.get(seen) if seen is not None else None
        if errors is None:
            errors = verdicts[seen] = _errors(field, "items", item)
        for err in errors:
            for f in _findings_of(err):
                yield replace(f, where=pointer(field, index) + f.where)


def schema_findings(meta: Mapping[str, Any],
                    entry_keys: Mapping[str, str | bytes | None] | None = None) -> list[Finding]:
    """All schema violations of ``meta``, sorted by pointer (no duplicate-key findings).

    ``entry_keys``: the ``param_plan`` entries' :func:`json_key` when the caller has them
    (:meth:`CheckContext.entry_keys`)."""
    out: list[Finding] = []
    rest = dict(meta)
    for field in _UNIFORM_MAPS:
        if isinstance(meta.get(field), Mapping):
            out.extend(_map_findings(field, meta[field],
                                     entry_keys if field == "param_plan" else None))
            rest[field] = {}
    for field in _uniform_arrays():
        if isinstance(meta.get(field), list):
            out.extend(_item_findings(field, meta[field]))
    if not surely_valid(_rest_schema(), rest, _rest_schema(), _ecma):  # jsonschema says why
        for err in _rest_validator().iter_errors(rest):
            out.extend(_findings_of(err))
    return sorted(set(out), key=lambda f: (f.where, f.code, f.message))


def cached_schema_findings(ctx: CheckContext) -> list[Finding]:
    """:func:`schema_findings` memoized on the context (other checks consult it)."""
    if "schema" not in ctx.cache:
        ctx.cache["schema"] = schema_findings(ctx.meta, ctx.entry_keys())
    return ctx.cache["schema"]


def subtree_valid(ctx: CheckContext, *roots: str) -> bool:
    """True when no schema error lies at or under any of the given top-level keys."""
    prefixes = tuple(pointer(r) for r in roots)
    return not any(
        f.where == p or f.where.startswith(p + "/")
        for f in cached_schema_findings(ctx) for p in prefixes
    )


def check_schema(ctx: CheckContext) -> Iterator[Finding]:
    """Every schema violation, plus duplicate object keys, each at its JSON pointer."""
    for ptr in ctx.loaded.duplicate_keys:
        yield error("schema.duplicate_key", ptr, "key occurs more than once in its object; "
                    "JSON readers keep only the last value", hint="remove the duplicate")
    yield from cached_schema_findings(ctx)
