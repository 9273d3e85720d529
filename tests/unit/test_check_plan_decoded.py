"""The ``plan`` check's rules on the decoded plan report what the JSON rules reported.

A differential test: ``tests/fixtures/plan_rules_before.py`` holds the rules as they read the
raw JSON (before the tolerant decode, :mod:`hpcodegen.plan.decode`); both run on every shipped
example, every fixture meta and a few hundred seeded mutations of them (keys dropped,
retyped and misspelt, placements broken, references pointed elsewhere), and their finding
lists must be equal, in order. Most mutations break the schema: that is the point (the
rules report on such a meta field by field, and the decoded plan must not lose a field).
"""

from __future__ import annotations

import copy
import json
import os
import random
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
sys.path.append(str(FIXTURES))
import plan_rules_before as before  # noqa: E402
import verify_fixtures as vf  # noqa: E402

from hpcodegen.artifact.load import LoadedMeta  # noqa: E402
from hpcodegen.checks.context import CheckContext  # noqa: E402
from hpcodegen.checks.plan import check_plan  # noqa: E402
from hpcodegen.checks.schema import cached_schema_findings  # noqa: E402
from hpcodegen.checks.source import read_modeling_tree  # noqa: E402
from hpcodegen.plan.codec import plan_from_meta  # noqa: E402

#: every meta file shipped or kept as a fixture
META_FILES = sorted(p for base in (ROOT / "examples", FIXTURES)
                    for p in base.rglob("codegen_meta.json"))
#: seeded mutations per suite run (about 40 ms each: two rule sets on a context of their
#: own, sharing only the schema findings and the parsed modeling file, :func:`_inputs`);
#: the redesign itself was checked at 2000, ``HPCODEGEN_MUTATIONS=2000`` reruns that
MUTATIONS = int(os.environ.get("HPCODEGEN_MUTATIONS", "300"))


def _metas() -> dict[str, dict[str, Any]]:
    out = {str(p.relative_to(ROOT)): json.loads(p.read_text()) for p in META_FILES}
    out.update({f"verify_fixtures:{name}": fns[0]() for name, fns in vf.FIXTURES.items()})
    return out


METAS = _metas()


def _context(meta: dict[str, Any], directory: Path,
             inputs: dict[str, Any] | None = None) -> CheckContext:
    loaded = LoadedMeta(meta, directory / "codegen_meta.json", directory)
    return CheckContext(loaded, allowed_targets=vf.REFERENCE_TARGETS, cache=dict(inputs or {}))


#: directory -> its modeling file as :func:`read_modeling_tree` parsed it (the file never
#: changes here: the seeded runs all read examples/llama_tp2's)
_TREES: dict[Path, Any] = {}


def _inputs(meta: dict[str, Any], directory: Path) -> dict[str, Any]:
    """What both rule sets read but neither computes: the meta's schema findings and the
    parsed modeling file, made once per meta (and the tree once per directory) instead of
    once per rule set. Both are pure functions of the bytes (the checks only read them:
    :func:`read_modeling_tree`); each run's own work (the decoded plan, the classification,
    every rule) still starts from nothing. A meta the schema check cannot read is left to
    each context: a crash there is compared like any other."""
    ctx = _context(meta, directory)
    if directory not in _TREES:
        _TREES[directory] = read_modeling_tree(_context({}, directory))
    try:
        schema = cached_schema_findings(ctx)
    except Exception:  # each run then meets it itself (and both must crash alike)
        return {"modeling_tree": _TREES[directory]}
    return {"modeling_tree": _TREES[directory], "schema": schema}


def _findings(rules: Any, meta: dict[str, Any], directory: Path,
              inputs: dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
    """One rule set's findings on a fresh context (nothing cached from the other run but
    ``inputs``, :func:`_inputs`)."""
    ctx = _context(meta, directory, inputs)
    try:
        return [(f.code, f.severity.value, f.where, f.message, f.expected, f.hint)
                for f in rules(ctx)]
    except Exception as exc:  # a crash is a finding of its own: both must crash alike
        return [("crash", type(exc).__name__, str(exc))]


def _both(meta: dict[str, Any], directory: Path
          ) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """(the JSON rules' findings, the decoded rules' findings) on one meta."""
    inputs = _inputs(meta, directory)
    return (_findings(before.check_plan, meta, directory, inputs),
            _findings(check_plan, meta, directory, inputs))


def _compare(meta: dict[str, Any], directory: Path) -> None:
    old, new = _both(meta, directory)
    assert new == old


def test_the_metas_are_found() -> None:
    assert len(META_FILES) >= 15 and len(METAS) >= 18


@pytest.mark.parametrize("name", sorted(METAS))
def test_every_shipped_and_fixture_meta_reports_the_same(name: str) -> None:
    directory = ROOT / name if ":" not in name else Path("/nonexistent")
    _compare(METAS[name], directory.parent if directory.name.endswith(".json") else directory)


# -- seeded mutations --------------------------------------------------------------------

JUNK: tuple[Any, ...] = (None, True, 0, 1, 2, -1, 1.0, "", "x", "R", "S(-1)", "S(x)", "P(sum)",
                         "SS(0,2)", "tp", "cp", "ep", [], ["tp"], [1], {}, {"tp": "R"},
                         {"tp": 5}, "lm_head", "model.norm", "lm_head.weight",
                         "hp_parallelize", ["a", "b", "c"])


def _slots(node: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """The path of every value inside a JSON value (the root excluded)."""
    items = node.items() if isinstance(node, dict) else enumerate(node) \
        if isinstance(node, list) else ()
    for key, value in items:
        yield (*path, key)
        yield from _slots(value, (*path, key))


def _at(node: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        node = node[key]
    return node


def _names(meta: dict[str, Any]) -> list[str]:
    """FQNs and names the meta uses: a reference pointed at one of them stays plausible."""
    plan = meta.get("param_plan") if isinstance(meta.get("param_plan"), dict) else {}
    out = list(plan)
    for fqn, entry in plan.items():
        if isinstance(entry, dict) and isinstance(entry.get("params"), dict):
            out += [f"{fqn}.{p}" if fqn else p for p in entry["params"]]
    return out or ["x"]


def _mutate(meta: dict[str, Any], rng: random.Random) -> None:
    """One mutation in place, at a random path."""
    slots = list(_slots(meta))
    path = rng.choice(slots)
    parent, key = _at(meta, path[:-1]), path[-1]
    kind = rng.randrange(7)
    if kind == 0:  # drop
        del parent[key]
    elif kind == 1:  # retype
        parent[key] = rng.choice(JUNK)
    elif kind == 2 and isinstance(parent, dict):  # misspell a key
        value = parent.pop(key)
        parent[str(key) + rng.choice(("_", "s", "x"))] = value
    elif kind == 3 and isinstance(parent[key], str):  # a bad placement or another name
        parent[key] = rng.choice(("S(99x)", "P(mean)", "S(-1)", "SS(1,0)", "P(sum)", "R ",
                                  rng.choice(_names(meta))))
    elif kind == 4:  # a reference to something planned, or not
        parent[key] = rng.choice(_names(meta)) + rng.choice(("", "", ".nope"))
    elif kind == 5 and isinstance(parent, dict):  # a new sibling
        parent[rng.choice(("tp", "ep", "zz", "out_names", "params", "match"))] = \
            copy.deepcopy(rng.choice(JUNK))
    elif isinstance(parent, list):  # insert into an array
        parent.insert(key, copy.deepcopy(rng.choice(JUNK)))
    else:
        parent[key] = copy.deepcopy(rng.choice(JUNK))


def _mutants(seed: int, count: int) -> Iterator[tuple[str, dict[str, Any]]]:
    rng = random.Random(seed)
    names = sorted(METAS)
    for _ in range(count):
        name = rng.choice(names)
        meta = copy.deepcopy(METAS[name])
        for _ in range(rng.choice((1, 1, 1, 2, 3))):
            if list(_slots(meta)):
                _mutate(meta, rng)
        yield name, meta


@pytest.mark.parametrize("seed", range(6))
def test_seeded_mutations_report_the_same(seed: int) -> None:
    directory = ROOT / "examples" / "llama_tp2"  # a real modeling file for the class rules
    differing = []
    invalid = 0
    for name, meta in _mutants(seed, MUTATIONS // 6):
        refused: list[Any] = []
        plan_from_meta(meta, refused=refused)
        invalid += bool(refused)
        old, new = _both(meta, directory)
        if new != old:
            differing.append((name, meta, old, new))
    assert not differing, differing[0]
    assert invalid > MUTATIONS // 60  # the mutations do reach the tolerant decode
