"""Property (issue 10): hostile placement strings, integer fields and key names never crash
the gate. verify ends with exit 0, 1 or 2, no check reports ``*.internal``, a placement it
accepts matches the whole grammar, a non-integer integer field always fails, and no report
(text, JSON, JUnit) carries a control character from the artifact.

Each example edits one field of a small, valid artifact written once per test; the bounded
``max_examples`` keep the whole file within a few seconds.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
sys.path.append(str(FIXTURES))
import verify_fixtures as vf  # noqa: E402

from hpcodegen.placement import PLACEMENT_PATTERN  # noqa: E402
from hpcodegen.verify import run_verify  # noqa: E402

pytestmark = pytest.mark.timeout(400)

SETTINGS = settings(max_examples=40, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow,
                                           HealthCheck.function_scoped_fixture])
GRAMMAR = re.compile(PLACEMENT_PATTERN[1:-1])
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
ATTN = "model.layers.0.self_attn"
WEIGHT = ("param_plan", ATTN, "params", "q_proj.weight", "tp")

#: Characters that break parsers, terminals and XML, mixed with the grammar's own.
NASTY = st.sampled_from(list("RSP()-,0129 \n\r\t\x00\x1b\x7f\x85\u2028\u202e\ufeff\ud800Ｓ٣"))
PLACEMENTS = st.one_of(
    st.text(NASTY, max_size=12),
    st.builds(lambda k, a, tail: f"{k}({a}){tail}", st.sampled_from(["S", "SS", "P", "R"]),
              st.text(NASTY, max_size=6), st.sampled_from(["", "\n", " ", "\r\n", ")"])),
    st.builds("S({})".format, st.integers(-10**6, 10**6)),
    st.builds("SS({},{})".format, st.integers(-200, 200), st.integers(-2, 20000)),
)
INTEGER_FIELDS = [("parallel_dims", "tp_size"), ("parallel_dims", "cp_size"),
                  ("outputs", "modeling", "lines"), ("source", "line_count")]
NOT_INTEGERS = st.one_of(st.booleans(), st.floats(allow_nan=False, allow_infinity=False),
                         st.text(max_size=3), st.none(), st.lists(st.integers(), max_size=1))
KEYS = st.text(st.characters(codec="utf-8") | NASTY, min_size=0, max_size=12) | st.sampled_from(
    ["lm_head\nPASS fake", "\x1b[2J", "a" * 3000, "..", "a/b", "~0", ""])


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return vf.build_fixture("llama_hp", tmp_path_factory.mktemp("fuzz") / "base")


def _set(meta: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node = meta
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value


def _verify(base: Path, meta: dict[str, Any]) -> Iterator[tuple[int, dict[str, Any], str]]:
    """verify the edited meta (beside the base's files): exit code, JSON, text + JUnit."""
    with tempfile.TemporaryDirectory() as tmp:
        art = Path(tmp) / "a"
        shutil.copytree(base, art)
        (art / "codegen_meta.json").write_text(json.dumps(meta), encoding="utf-8")
        out, err = io.StringIO(), io.StringIO()
        code = run_verify([art], output="json", stdout=out, stderr=err)
        doc = json.loads(out.getvalue())
        text, junit = io.StringIO(), Path(tmp) / "j.xml"
        run_verify([art], output="text", junit=junit, verbose=True, stdout=text,
                   stderr=io.StringIO())
        yield code, doc, text.getvalue() + junit.read_text(encoding="utf-8")


def _check(code: int, doc: dict[str, Any], reports: str) -> list[dict[str, Any]]:
    assert code in (0, 1, 2)
    findings = [f for art in doc["artifacts"] for check in art["checks"].values()
                for f in check["findings"]]
    assert not [f for f in findings if f["code"].endswith(".internal")], findings
    for f in findings:
        for value in f.values():
            assert value is None or not CONTROL.search(value), f
    assert not CONTROL.search(reports.replace("\n", "").replace("\t", ""))
    return findings


@SETTINGS
@given(text=PLACEMENTS)
def test_placement_strings(base: Path, text: str) -> None:
    meta = vf.read_meta(base)
    _set(meta, WEIGHT, text)
    for code, doc, reports in _verify(base, meta):
        findings = _check(code, doc, reports)
        refused = any(f["path"] == "/" + "/".join(WEIGHT) and f["severity"] == "error"
                      for f in findings)
        assert refused == (GRAMMAR.fullmatch(text) is None or text.startswith("P(")), text


@SETTINGS
@given(field=st.sampled_from(INTEGER_FIELDS), value=NOT_INTEGERS | st.integers(-5, 10**12))
def test_integer_fields(base: Path, field: tuple[str, ...], value: Any) -> None:
    meta = vf.read_meta(base)
    _set(meta, field, value)
    for code, doc, reports in _verify(base, meta):
        findings = _check(code, doc, reports)
        schema = {f["path"] for f in findings if f["code"].startswith("schema.")}
        integer = isinstance(value, int) and not isinstance(value, bool)
        if not integer:
            assert "/" + "/".join(field) in schema, (field, value)
            assert code == 1


@SETTINGS
@given(key=KEYS, where=st.sampled_from(["param_plan", "boundary_classes", "outputs", "axis",
                                        "input", "params"]))
def test_key_names(base: Path, key: str, where: str) -> None:
    meta = vf.read_meta(base)
    if where == "param_plan":
        meta["param_plan"][key] = {"params": {"weight": {"tp": "R"}}}
    elif where == "boundary_classes":
        meta["boundary_classes"][key] = "LlamaMLP"
    elif where == "outputs":
        meta["outputs"][key] = {"sha256": "0" * 64, "lines": 1}
    elif where == "axis":
        meta["param_plan"][ATTN]["params"]["q_proj.weight"][key] = "S(0)"
    elif where == "input":
        meta["param_plan"][ATTN]["in_src"][key] = {"tp": "R"}
    else:
        meta["param_plan"][ATTN]["params"][key] = {"tp": "R"}
    for code, doc, reports in _verify(base, meta):
        _check(code, doc, reports)
