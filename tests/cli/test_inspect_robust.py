"""Malformed metas never crash inspect-plan: a finding and exit 1 or 2, never an exception.

Seeded mutations of a real meta: any JSON node replaced by a value of another JSON type,
both with verify's gate (schema + plan checks) and without it (``--no-checks``), where
inspect-plan's own readers must cope.
"""

from __future__ import annotations

import copy
import io
import json
import random
from pathlib import Path
from typing import Any

import pytest

from hpcodegen.inspect import InspectOptions, run_inspect

META = json.loads((Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "inspect"
                   / "moe_cp2_tp2" / "codegen_meta.json").read_text())
ODD_VALUES: list[Any] = [None, 0, -3, 1.5, True, "", "S(1)", "Shard(0)", [], [1, "x"], {},
                         {"tp": 3}, {"x": {"tp": "P(max)"}}, ["model.norm"]]


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out.extend(_paths(v, (*prefix, k)))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out.extend(_paths(v, (*prefix, i)))
    return out


def _mutate(rng: random.Random) -> dict[str, Any]:
    meta = copy.deepcopy(META)
    for _ in range(rng.randint(1, 3)):
        path = rng.choice(_paths(meta)[1:])
        node = meta
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = copy.deepcopy(rng.choice(ODD_VALUES))
    return meta


@pytest.mark.timeout(400)
@pytest.mark.parametrize("checks", [False, True])
def test_mutated_metas_never_raise(tmp_path: Path, checks: bool) -> None:
    rng = random.Random(1234 + checks)
    codes = set()
    for i in range(100 if not checks else 30):
        meta = _mutate(rng)
        (tmp_path / "codegen_meta.json").write_text(json.dumps(meta))
        for as_json in (False, True) if i % 4 == 0 else (True,):
            out, err = io.StringIO(), io.StringIO()
            code = run_inspect(InspectOptions(path=str(tmp_path), as_json=as_json, checks=checks,
                                              mesh="tp=2" if i % 3 == 0 else None), out, err)
            assert code in (0, 1, 2)
            if as_json:
                assert json.loads(out.getvalue())["status"] in ("ok", "fail")
            codes.add(code)
    assert 1 in codes  # some mutations must be caught
