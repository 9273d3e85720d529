"""bench/coverage.py's accounting: which table a family lands in and what the last line counts.

The split between dense decoders and encoder / encoder-decoder families comes from
transformers' own auto mappings; a row's status comes from one rule (``classify_row``).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "coverage.py"


@pytest.fixture(scope="module")
def cov() -> ModuleType:
    spec = importlib.util.spec_from_file_location("hpcodegen_bench_coverage", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("family", "kind"), [
    ("llama", "decoder"), ("gpt2", "decoder"), ("bert", "encoder"), ("roberta", "encoder"),
    ("bart", "seq2seq"), ("whisper", "seq2seq"), ("marian", "seq2seq")])
def test_family_kind_follows_transformers_mappings(cov: ModuleType, family: str,
                                                  kind: str) -> None:
    assert cov.family_kind(family) == kind


def _row(family: str, *, moe: bool = False, split: bool = True, parity: bool = True,
         tp2: bool = True) -> dict:
    row: dict = {"family": family, "moe": moe, "hf_plan": True}
    row["tp2"] = {"ok": True, "split": split, "dir": "x"} if tp2 else \
        {"ok": False, "stage": "generate", "reason": "no rule for X"}
    row["parity"] = {"tp2": {"ok": parity, "logits": 1e-7, "grad": 2e-7 if parity else 1.0,
                             "worst": "w", "odd": [], "error": None}}
    return row


def test_last_line_counts_dense_decoders_and_moe_only(cov: ModuleType) -> None:
    rows = [_row("llama"), _row("gpt2", parity=False), _row("tiny_no_rules", split=False),
            _row("qwen2", tp2=False), _row("bert"), _row("mixtral", moe=True),
            _row("qwen3_moe", moe=True, parity=False)]
    text = cov.render(rows, "x", 0.0)
    lines = text.strip().splitlines()
    assert lines[-1] == "coverage: dense_ok=1/4 moe_ok=1/2"
    assert "encoder and encoder-decoder families: ok=1/1 replicated=0" in lines
    assert "| qwen2 | hf | fail (generate) |" in text and "no rule for X" in text
    assert "| tiny_no_rules | hf | replicated |" in text
    assert "tp2 parity: logits diff 1.0e-07, grad diff 1.0e+00 at w" in text


def test_a_float32_miss_matched_in_float64_is_rounding_not_failure(cov: ModuleType) -> None:
    rounding = _row("ssmx", parity=False)
    rounding["parity"]["tp2"]["exact64"] = {"ok": True, "logits": 2e-15, "grad": 0.0}
    wrong = _row("gptx", parity=False)
    wrong["parity"]["tp2"]["exact64"] = {"ok": False, "logits": 1.3, "grad": 0.2}
    text = cov.render([rounding, wrong], "x", 0.0)
    assert text.strip().splitlines()[-1] == "coverage: dense_ok=1/2 moe_ok=0/0"
    assert "| ssmx | hf | ok | - | - | ok in fp64 (2e-15) |" in text
    assert "in float64 the sharded model matches" in text
    assert "| gptx | hf | ok | - | - | FAIL |" in text
