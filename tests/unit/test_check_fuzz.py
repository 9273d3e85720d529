"""Property: whatever the meta, verify ends with exit 0, 1 or 2 and findings, never a crash.

Metas come from the published schema (hypothesis-jsonschema) and from random mutations of
the fixture metas (replace, delete or insert at any JSON path), written as artifact dirs
next to the fixture's files and verified with every pure check plus ``signature``.
"""

from __future__ import annotations

import copy
import io
import json
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis_jsonschema import from_schema

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
sys.path.append(str(FIXTURES))
import verify_fixtures as vf  # noqa: E402

from hpcodegen.checks.schema import meta_schema  # noqa: E402
from hpcodegen.verify import run_verify  # noqa: E402

pytestmark = pytest.mark.timeout(400)


SETTINGS = settings(deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])
BASES = {name: vf.FIXTURES[name][0]() for name in vf.FIXTURES}
CONFIG = FIXTURES / "configs" / "llama"
LEAVES = st.none() | st.booleans() | st.integers(-3, 3) | st.text(max_size=4) | st.sampled_from(
    ["R", "S(-1)", "S(9)", "P(sum)", "SS(0,2)", "tp", "cp", "ep", "model.norm", "lm_head",
     "lm_head.weight", "0" * 64, ""])
JSON = st.recursive(LEAVES, lambda c: st.lists(c, max_size=3)
                    | st.dictionaries(st.text(max_size=4) | st.sampled_from(["tp", "params"]),
                                      c, max_size=3), max_leaves=6)


def _slots(node: Any) -> Iterator[tuple[Any, Any]]:
    """Every (container, key) in a JSON value."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield node, k
            yield from _slots(v)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield node, i
            yield from _slots(v)


@st.composite
def mutated(draw: Any) -> tuple[str, dict[str, Any]]:
    name = draw(st.sampled_from(sorted(BASES)))
    meta = copy.deepcopy(BASES[name])
    for _ in range(draw(st.integers(1, 3))):
        container, key = draw(st.sampled_from(list(_slots(meta))))
        action = draw(st.sampled_from(["replace", "delete", "insert"]))
        if action == "replace":
            container[key] = draw(JSON)
        elif action == "delete":
            del container[key]
        elif isinstance(container, dict):
            container[draw(st.text(max_size=6))] = draw(JSON)
        else:
            container.insert(key, draw(JSON))
    return name, meta


def _verify(meta: Any, base: str | None, modeling: bytes | None = None) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        art = Path(tmp) / "a"
        if base is None:
            art.mkdir()
        else:
            vf.build_fixture(base, art)
        if modeling is not None:
            (art / vf.modeling_name(art)).write_bytes(modeling)
        (art / "codegen_meta.json").write_text(json.dumps(meta), encoding="utf-8")
        out = io.StringIO()
        code = run_verify([art], hf_config=CONFIG, skip=["model"], output="json",
                          stdout=out, stderr=io.StringIO())
    doc = json.loads(out.getvalue())
    findings = [f for a in doc["artifacts"] for c in a["checks"].values() for f in c["findings"]]
    assert code in (0, 1, 2)
    assert not [f["message"] for f in findings if f["code"].endswith(".internal")]
    if code:
        assert any(f["severity"] == "error" for f in findings)
    else:
        assert doc["ok"] is True


def _local_schema() -> dict[str, Any]:
    """The schema without its ``$id``: hypothesis-jsonschema resolves ``#/$defs/...``
    against the ``$id`` with urljoin, which cannot join onto a ``urn:`` base."""
    return {k: v for k, v in meta_schema().items() if k != "$id"}


@settings(SETTINGS, max_examples=12)  # generating names and paths by regex is slow
@given(from_schema(_local_schema()))
@pytest.mark.filterwarnings("ignore")
def test_schema_generated_metas_never_crash(meta: dict[str, Any]) -> None:
    _verify(meta, None)


@settings(SETTINGS, max_examples=150)
@given(mutated())
def test_mutated_fixture_metas_never_crash(case: tuple[str, dict[str, Any]]) -> None:
    base, meta = case
    _verify(meta, base)


@st.composite
def spliced_source(draw: Any) -> bytes:
    """The fixture's modeling file with a random slice replaced by random bytes or text."""
    source = vf.llama_source().encode()
    start = draw(st.integers(0, len(source)))
    end = draw(st.integers(start, min(len(source), start + 200)))
    junk = draw(st.binary(max_size=40) | st.text(max_size=40).map(str.encode)
                | st.sampled_from([b"(", b"\x00", b"    ", b"class X(:\n", b"def forward(*a):"]))
    return source[:start] + junk + source[end:]


@settings(SETTINGS, max_examples=60)
@given(spliced_source())
def test_garbled_modeling_files_never_crash(modeling: bytes) -> None:
    _verify(BASES["llama_hp"], "llama_hp", modeling)
