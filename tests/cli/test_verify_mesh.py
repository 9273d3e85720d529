"""``verify --mesh``: the model check re-derives the plan at the live axis sizes (issue 34:
"a live --mesh re-derives at the new sizes"). An axis of size 1 moves nothing and is no
error; heads a larger tp cannot split are refused with the derived reason; an axis the plan
cannot have is a usage error, as in ``inspect-plan``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
ART, CONFIG = REPO / "examples" / "llama_tp2", REPO / "examples" / "configs" / "llama"

pytestmark = pytest.mark.timeout(600)


def _verify(*args: Any) -> tuple[int, dict]:
    from hpcodegen.cli.app import app, register_verbs
    from typer.testing import CliRunner

    register_verbs()
    res = CliRunner().invoke(app, ["verify", *map(str, args), "--json"],
                             catch_exceptions=False)
    return res.exit_code, json.loads(res.stdout)


def _findings(doc: dict) -> list[dict]:
    return [f for a in doc["artifacts"] for c in a["checks"].values() for f in c["findings"]]


def test_tp_one_moves_nothing_and_passes() -> None:
    code, doc = _verify(ART, "--hf-config", CONFIG, "--mesh", "tp=1", "--strict", "-v")
    assert code == 0, [f for f in _findings(doc) if f["severity"] != "info"]
    skipped = [f for f in _findings(doc) if f["code"] == "derive.skipped"]
    assert skipped and "tp=1" in skipped[0]["message"]


def test_a_larger_tp_is_derived_at_that_size() -> None:
    code, doc = _verify(ART, "--hf-config", CONFIG, "--mesh", "tp=4", "--strict", "-v")
    assert code == 0, [f for f in _findings(doc) if f["severity"] != "info"]
    summary = [f for f in _findings(doc) if f["code"] == "derive.summary"]
    assert summary and "at tp=4" in summary[0]["message"]


def test_heads_the_live_tp_cannot_split_are_refused() -> None:
    code, doc = _verify(ART, "--hf-config", CONFIG, "--mesh", "tp=8")
    assert code == 1
    heads = [f for f in _findings(doc) if f["code"] == "model.heads_not_divisible"]
    assert heads and all(f["path"] == "--mesh" for f in heads), heads
    assert "tp_size = 8" in heads[0]["message"]
    # the frozen size still passes: the verdict is the live mesh's
    assert _verify(ART, "--hf-config", CONFIG)[0] == 0


@pytest.mark.parametrize("mesh", ["pt=4", "tp=0", "tp=x", "tp=2,tp=4"])
def test_an_unknown_or_unreadable_axis_is_a_usage_error(mesh: str) -> None:
    code, doc = _verify(ART, "--hf-config", CONFIG, "--mesh", mesh)
    assert code == 2
    assert doc["ok"] is False and any("--mesh" in json.dumps(f) for f in doc["findings"])
