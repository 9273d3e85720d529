"""The published schemas describe themselves: a stable versioned ``$id``, and a description
(or title) and examples on every field, each example valid for its field."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = {"codegen-meta": ROOT / "schemas" / "codegen_meta.schema.json",
           "recipe": ROOT / "schemas" / "recipe.schema.json"}


def fields(node: Any, where: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every named field: properties (nested, in array items too) and every $defs entry."""
    if not isinstance(node, dict):
        return
    for name, child in (node.get("properties") or {}).items():
        yield f"{where}/{name}", child
        yield from fields(child, f"{where}/{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            yield from fields(node[key], f"{where}/{key}")
    for name, child in (node.get("$defs") or {}).items():
        yield f"$defs/{name}", child
        yield from fields(child, f"$defs/{name}")


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_id_is_stable_and_versioned(name: str) -> None:
    schema = json.loads(SCHEMAS[name].read_text())
    assert re.fullmatch(rf"urn:hpcodegen:schema:{name}:[1-9][0-9]*", schema["$id"])
    assert ".invalid" not in SCHEMAS[name].read_text()
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["$id"] in (ROOT / "docs" / "schema.md").read_text()


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_every_field_has_a_description_and_valid_examples(name: str) -> None:
    schema = json.loads(SCHEMAS[name].read_text())
    found = list(fields(schema))
    assert len(found) > (60 if name == "codegen-meta" else 15)
    bare = [w for w, node in found if not (node.get("description") or node.get("title"))]
    assert not bare, f"fields without a description: {bare}"
    no_examples = [w for w, node in found if not node.get("examples")]
    assert not no_examples, f"fields without examples: {no_examples}"
    for where, node in found:
        validator = jsonschema.Draft202012Validator({**node, "$defs": schema["$defs"]})
        for example in node["examples"]:
            errors = [e.message for e in validator.iter_errors(example)]
            assert not errors, (where, example, errors)


def test_docs_show_vs_code_and_jetbrains() -> None:
    text = (ROOT / "docs" / "schema.md").read_text()
    assert '"json.schemas"' in text and '"yaml.schemas"' in text
    assert "JSON Schema Mappings" in text and "hpcodegen schema --recipe" in text
