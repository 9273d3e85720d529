"""A plan that splits no layer over tp is a warning of generate (``--strict``: exit 1).

The rule reads the module tree (:mod:`hpcodegen.generate.checks.layer_split`): unit cases on a
hand-built torch module, then the CLI path on BERT (no HF plan, no package rule) and on
Llama (split: no warning).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from hpcodegen.generate.api import GenerateArgs, run_generate
from hpcodegen.generate.checks.layer_split import fold_blocks, layer_blocks, unsplit_layers
from hpcodegen.plan.codec import entries_from_json
from hpcodegen.plan.frozen import FrozenMap
from hpcodegen.plan.types import PlanEntry

FAMILIES = Path(__file__).resolve().parents[1] / "fixtures" / "families"
LLAMA = Path(__file__).resolve().parents[2] / "examples" / "configs" / "llama"
RULES = ["transformers ships no tp plan", "no package rules", "no recipe"]


def _net():
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn = nn.Linear(4, 4)
            self.experts = nn.ModuleList([nn.Sequential(nn.Linear(4, 4)) for _ in range(2)])

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(8, 4)
            self.layers = nn.ModuleList([Block() for _ in range(3)])
            self.heads = nn.ModuleList([nn.Linear(4, 8) for _ in range(2)])  # bare Linears

    return Net()


def _plan(**split: str) -> FrozenMap[str, PlanEntry]:
    """``emb`` and both heads sharded on tp, every layer replicated, plus ``split``."""
    plan = {"emb": {"params": {"weight": {"tp": "S(0)"}}},
            "heads": {"params": {"0.weight": {"tp": "S(0)"}, "1.weight": {"tp": "S(0)"}}},
            "layers": {"params": {"0.attn.weight": {"tp": "R"}}}}
    for fqn, placement in split.items():
        plan[fqn.replace("__", ".")] = {"params": {"weight": {"tp": placement}}}
    return entries_from_json(plan)


def test_layers_are_the_outermost_repeated_blocks() -> None:
    blocks = layer_blocks(_net())
    assert blocks == {f"layers.{i}": "Block" for i in range(3)}  # no heads, no experts
    assert fold_blocks(blocks) == ["layers.{0..2} (Block x3)"]


def test_no_split_layer_is_a_warning_naming_them_and_the_rules() -> None:
    finding = unsplit_layers(_net(), _plan(), 2, ["rules A", "rules B"])
    assert finding is not None and finding.code == "generate.no_layer_split"
    assert finding.severity == "warning" and finding.where == "layers"
    assert "layers.{0..2} (Block x3) stay whole" in finding.message
    assert "only emb, heads.0, heads.1 are split" in finding.message
    assert "Rules in use: rules A; rules B" in finding.message


@pytest.mark.parametrize("split", [{"layers__1__attn": "S(0)"},
                                   {"layers__2__experts__0__0": "S(1)"},
                                   {"layers__0__attn": "SS(0,2)"}])
def test_one_split_parameter_in_any_layer_is_enough(split: dict) -> None:
    assert unsplit_layers(_net(), _plan(**split), 2, []) is None


def test_tp1_and_a_model_without_layers_say_nothing() -> None:
    from torch import nn

    assert unsplit_layers(_net(), _plan(), 1, []) is None
    assert unsplit_layers(nn.Sequential(nn.Linear(4, 4)), {}, 2, []) is None
    # a replicated placement in a layer is not a split
    assert unsplit_layers(_net(), _plan(layers__1__attn="R"), 2, []) is not None


def _generate(tmp_path: Path, model: Path, *extra: str, strict: bool = False):
    out, err = io.StringIO(), io.StringIO()
    import contextlib

    with contextlib.redirect_stderr(err):
        code = run_generate(GenerateArgs(model, 2, tmp_path / "out", as_json="json" in extra,
                                         strict=strict), out, err)
    return code, out.getvalue(), err.getvalue()


@pytest.mark.slow
def test_a_model_splitting_no_layer_warns_and_strict_refuses(tmp_path: Path) -> None:
    """BLOOM with slow_but_exact reads its closing projections' weights itself: nothing in
    its layers can be split (BERT-style encoders, the former example, now have their
    feed-forward split by the dataflow seeds)."""
    config = json.loads((FAMILIES / "bloom" / "config.json").read_text())
    config.update(slow_but_exact=True, pretraining_tp=2)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(config))
    code, out, err = _generate(tmp_path, model, "json")
    assert code == 0 and (tmp_path / "out" / "codegen_meta.json").is_file()
    doc = json.loads(out)
    (finding,) = [f for f in doc["findings"] if f["code"] == "generate.no_layer_split"]
    assert finding["severity"] == "warning" and doc["status"] != "error"
    assert "transformer.h.{0..1} (BloomBlock x2)" in finding["message"]
    assert all(phrase in finding["message"] for phrase in RULES), finding["message"]
    code, _, err = _generate(tmp_path / "strict", model, strict=True)
    assert code == 1 and not (tmp_path / "strict" / "out").exists()
    assert "splits no layer" in err and "--strict" in err


@pytest.mark.slow
def test_a_split_model_has_no_warning(tmp_path: Path) -> None:
    code, out, err = _generate(tmp_path, LLAMA, "json", strict=True)
    assert code == 0 and json.loads(out)["findings"] == [], err


def test_the_coverage_probe_reads_the_same_rule() -> None:
    """bench/coverage.py's ``split`` (docs/models.md's ok / replicated) is this rule on the
    meta model, not a guess from parameter names."""
    from hpcodegen.families.probe import layers_split
    from hpcodegen.plan.types import Plan

    net = _net()
    assert not layers_split(Plan(param_plan=_plan()), net)  # split heads are no layer
    assert layers_split(Plan(param_plan=_plan(layers__2__experts__0__0="S(1)")), net)
    assert not layers_split(Plan(param_plan=_plan(layers__1__attn="R")), net)
