"""The schema check's one-sided test never passes what jsonschema refuses.

``hpcodegen.checks.schema_fast.surely_valid`` lets a valid meta skip jsonschema; on metas
mutated at random (wrong types, removed keys, unknown keys) the schema check must find an
error exactly when the full validator does.
"""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path

from hpcodegen.checks.schema import _validator, schema_findings
from hpcodegen.checks.schema_fast import surely_valid

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*/codegen_meta.json"))
VALUES = [None, True, False, 0, 1, -1, 2.0, 1.5, "", "R", "S(1)", "P(sum)", "x\n", [], {},
          ["a"], ["a", "a"], {"a": 1}, 10**12, "S(-1)"]


def _nodes(node, path=()):
    yield path, node
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _nodes(value, (*path, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _nodes(value, (*path, index))


def _mutated(meta: dict, rnd: random.Random) -> dict:
    meta = copy.deepcopy(meta)
    path, node = rnd.choice(list(_nodes(meta))[1:])
    parent = meta
    for part in path[:-1]:
        parent = parent[part]
    roll = rnd.random()
    if roll < 0.6:
        parent[path[-1]] = copy.deepcopy(rnd.choice(VALUES))
    elif roll < 0.8 and isinstance(parent, dict):
        del parent[path[-1]]
    elif isinstance(node, dict):
        node[rnd.choice(["zz", "tp", "weight", "x y"])] = copy.deepcopy(rnd.choice(VALUES))
    return meta


def test_valid_examples_pass_without_the_validator() -> None:
    from hpcodegen.checks.schema import _ecma, _root_schema

    for path in EXAMPLES:
        meta = json.loads(path.read_text())
        assert surely_valid(_root_schema(), meta, _root_schema(), _ecma), path


def test_mutated_metas_get_the_full_validators_verdict() -> None:
    rnd = random.Random(34)
    metas = [json.loads(p.read_text()) for p in EXAMPLES]
    for _ in range(150):
        meta = _mutated(rnd.choice(metas), rnd)
        ours = [f for f in schema_findings(meta) if f.severity.value == "error"]
        full = list(_validator().iter_errors(meta))
        assert bool(ours) == bool(full), (full[:1], ours[:1])
