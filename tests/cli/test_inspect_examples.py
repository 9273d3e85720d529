"""inspect-plan on the shipped example artifacts (made by ``hpcodegen generate``)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from hpcodegen.inspect import InspectOptions, run_inspect

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NAMES = ["llama_tp2", "llama_tp2_sp", "qwen3_tp2", "qwen3_tp2_sp", "llama_tp4"]


def inspect_example(name: str, **kw: Any) -> dict[str, Any]:
    path = EXAMPLES / name
    if not (path / "codegen_meta.json").is_file():
        pytest.skip(f"example {name} not generated")
    out = io.StringIO()
    code = run_inspect(InspectOptions(path=str(path), as_json=True, expand=True, **kw), out,
                       io.StringIO())
    doc = json.loads(out.getvalue())
    assert code == 0, doc["findings"]
    return doc


def rows_of(doc: dict[str, Any], suffix: str) -> list[dict[str, Any]]:
    return [b for b in doc["boundaries"] if (b["class"] or "").endswith(suffix)]


def ops(row: dict[str, Any], side: str) -> list[tuple[str, int | None]]:
    return [(o["kind"], o["dim"]) for o in row[side] if o["kind"] != "identity"]


@pytest.mark.parametrize("name", NAMES)
def test_example_forms(name: str) -> None:
    doc = inspect_example(name)
    layers = json.loads((EXAMPLES / name / "codegen_meta.json").read_text())[
        "source"]["structure"]["num_hidden_layers"]
    attn, mlp, norms = rows_of(doc, "Attention"), rows_of(doc, "MLP"), rows_of(doc, "RMSNorm")
    assert len(attn) == layers and len(mlp) == layers
    assert {r["form"] for r in attn + mlp} == {"tp_collective"}
    assert norms and {r["form"] for r in norms} <= {"identity", "params"}
    sp = name.endswith("_sp")
    for row in attn + mlp:
        if sp:
            assert ops(row, "in_ops") == [("all_gather", 1)]
            assert ops(row, "out_ops") == [("reduce_scatter", 1)]
        else:
            assert ops(row, "in_ops") == [] and row["in_ops"][0]["kind"] == "identity"
            assert ops(row, "out_ops") == [("all_reduce", None)]


@pytest.mark.parametrize("name", NAMES)
def test_example_counts_follow_the_layer_count(name: str) -> None:
    doc = inspect_example(name)
    layers = json.loads((EXAMPLES / name / "codegen_meta.json").read_text())[
        "source"]["structure"]["num_hidden_layers"]
    fwd = {(c["kind"], c["dim"]): c["count"]
           for c in doc["summary"]["collectives_per_forward"]}
    if name.endswith("_sp"):
        # attention + MLP per layer, plus the embedding's reduce_scatter / lm_head's gather
        assert fwd[("all_gather", 1)] == 2 * layers + 1
        assert fwd[("reduce_scatter", 1)] == 2 * layers + 1
    else:
        assert fwd[("all_reduce", None)] == 2 * layers + 1


@pytest.mark.parametrize("name", NAMES)
def test_example_fits_its_own_mesh(name: str) -> None:
    meta = json.loads((EXAMPLES / name / "codegen_meta.json").read_text()) \
        if (EXAMPLES / name / "codegen_meta.json").is_file() else None
    if meta is None:
        pytest.skip(f"example {name} not generated")
    tp = meta["parallel_dims"]["tp_size"]
    doc = inspect_example(name, mesh=f"dp=2,tp={tp}")
    assert doc["mesh"]["changes"] == []
