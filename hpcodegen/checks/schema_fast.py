"""A one-sided schema test: True only when a value surely satisfies a schema.

The schema check's messages come from ``jsonschema`` (importing it costs about as much CPU
as verifying a 1,000-entry meta). A meta that is valid needs none of them: this walk
decides "valid" for the keywords the meta schema uses, read as the strict validator reads
them (JSON integers, ECMA-262 ``$``), and answers False for anything else (an invalid
value, a keyword it does not know, an ``enum`` it would have to compare loosely). False
only means "ask jsonschema", which then reports exactly what is wrong, so a gap here can
cost time but never a finding.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

#: keywords that accept every value
_ANNOTATIONS = frozenset({"description", "examples", "title", "$comment", "$schema", "$id",
                          "$defs", "default"})

_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: type(v) is str,
    "integer": lambda v: type(v) is int,  # a JSON integer: not a bool, not 2.0
    "number": lambda v: type(v) in (int, float),
    "boolean": lambda v: type(v) is bool,
    "object": lambda v: type(v) is dict,
    "array": lambda v: type(v) is list,
    "null": lambda v: v is None,
}


def surely_valid(schema: Any, value: Any, root: Mapping[str, Any],
                 ecma: Callable[[str], Any]) -> bool:
    """True when ``value`` satisfies ``schema`` (``$ref`` resolved from ``root``;
    ``ecma(pattern)`` the compiled pattern); False when invalid or not decided here."""
    if schema is True:
        return True
    if type(schema) is not dict:
        return False
    for key, rule in schema.items():
        if key in _ANNOTATIONS:
            continue
        check = _KEYWORDS.get(key)
        if check is None or not check(rule, value, schema, root, ecma):
            return False
    return True


def _ref(rule: Any, value: Any, schema: Any, root: Any, ecma: Any) -> bool:
    if type(rule) is not str or not rule.startswith("#/"):
        return False
    node: Any = root
    for part in rule[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if type(node) is not dict or part not in node:
            return False
        node = node[part]
    return surely_valid(node, value, root, ecma)


def _type(rule: Any, value: Any, *_: Any) -> bool:
    names = rule if type(rule) is list else [rule]
    return any(name in _TYPES and _TYPES[name](value) for name in names)


def _number(value: Any) -> bool:
    return type(value) in (int, float)


def _minimum(rule: Any, value: Any, *_: Any) -> bool:
    return _number(rule) and (not _number(value) or value >= rule)


def _maximum(rule: Any, value: Any, *_: Any) -> bool:
    return _number(rule) and (not _number(value) or value <= rule)


def _min_length(rule: Any, value: Any, *_: Any) -> bool:
    return type(rule) is int and (type(value) is not str or len(value) >= rule)


def _max_length(rule: Any, value: Any, *_: Any) -> bool:
    return type(rule) is int and (type(value) is not str or len(value) <= rule)


def _pattern(rule: Any, value: Any, schema: Any, root: Any, ecma: Any) -> bool:
    return type(rule) is str and (type(value) is not str or ecma(rule).search(value) is not None)


def _same(a: Any, b: Any) -> bool:
    """JSON equality for scalars only (a container: undecided, so False)."""
    return type(a) is type(b) and type(a) in (str, int, float, bool, type(None)) and a == b


def _enum(rule: Any, value: Any, *_: Any) -> bool:
    return type(rule) is list and any(_same(option, value) for option in rule)


def _const(rule: Any, value: Any, *_: Any) -> bool:
    return _same(rule, value)


def _min_items(rule: Any, value: Any, *_: Any) -> bool:
    return type(rule) is int and (type(value) is not list or len(value) >= rule)


def _max_items(rule: Any, value: Any, *_: Any) -> bool:
    return type(rule) is int and (type(value) is not list or len(value) <= rule)


def _unique(rule: Any, value: Any, *_: Any) -> bool:
    if rule is not True or type(value) is not list:
        return rule is False or (rule is True and type(value) is not list)
    return all(type(v) is str for v in value) and len(set(value)) == len(value)


def _properties(rule: Any, value: Any, schema: Any, root: Any, ecma: Any) -> bool:
    if type(rule) is not dict:
        return False
    if type(value) is not dict:
        return True
    return all(surely_valid(rule[k], v, root, ecma) for k, v in value.items() if k in rule)


def _pattern_properties(rule: Any, value: Any, schema: Any, root: Any, ecma: Any) -> bool:
    if type(rule) is not dict:
        return False
    if type(value) is not dict:
        return True
    # as jsonschema matches them (Python's re; only ``pattern`` reads ``$`` as ECMA-262)
    return all(surely_valid(sub, v, root, ecma) for pat, sub in rule.items()
               for k, v in value.items() if re.search(pat, k) is not None)


def _additional(rule: Any, value: Any, schema: Any, root: Any, ecma: Any) -> bool:
    if type(value) is not dict:
        return True
    named = schema.get("properties") or {}
    patterns = [re.compile(p) for p in (schema.get("patternProperties") or {})]
    return all(surely_valid(rule, v, root, ecma) for k, v in value.items()
               if k not in named and not any(p.search(k) for p in patterns))


def _property_names(rule: Any, value: Any, schema: Any, root: Any, ecma: Any) -> bool:
    return type(value) is not dict or all(surely_valid(rule, k, root, ecma) for k in value)


def _required(rule: Any, value: Any, *_: Any) -> bool:
    return type(rule) is list and (type(value) is not dict or all(k in value for k in rule))


def _prefix_items(rule: Any, value: Any, schema: Any, root: Any, ecma: Any) -> bool:
    if type(rule) is not list:
        return False
    return type(value) is not list or all(
        surely_valid(sub, v, root, ecma) for sub, v in zip(rule, value, strict=False))


def _items(rule: Any, value: Any, schema: Any, root: Any, ecma: Any) -> bool:
    if type(value) is not list:
        return True
    skip = len(schema.get("prefixItems") or ())
    return all(surely_valid(rule, v, root, ecma) for v in value[skip:])


def _any_of(rule: Any, value: Any, schema: Any, root: Any, ecma: Any) -> bool:
    return type(rule) is list and any(surely_valid(sub, value, root, ecma) for sub in rule)


_KEYWORDS: dict[str, Callable[[Any, Any, Any, Any, Any], bool]] = {
    "$ref": _ref, "type": _type, "minimum": _minimum, "maximum": _maximum,
    "minLength": _min_length, "maxLength": _max_length, "pattern": _pattern, "enum": _enum,
    "const": _const, "minItems": _min_items, "maxItems": _max_items, "uniqueItems": _unique,
    "properties": _properties, "patternProperties": _pattern_properties,
    "additionalProperties": _additional, "propertyNames": _property_names,
    "required": _required, "prefixItems": _prefix_items, "items": _items, "anyOf": _any_of,
}

__all__ = ["surely_valid"]
