"""The tests' shared builds (:mod:`bundle_memo`) answer what the real build answers, and no
caller can change what the next one gets."""

from __future__ import annotations

import json
from pathlib import Path

import bundle_memo
import pytest

from hpcodegen.errors import UsageError
from hpcodegen.generate import api
from hpcodegen.hf import read_hf_config

pytestmark = pytest.mark.slow

GPT2 = Path(__file__).resolve().parents[1] / "fixtures" / "families" / "gpt2"


def test_a_shared_build_equals_its_own_and_is_a_fresh_copy_each_time() -> None:
    config, _ = read_hf_config(GPT2)
    first_notes: list[str] = []
    first = bundle_memo.build_bundle(config, 2, False, None, "gpt2", notes=first_notes)
    first["codegen_meta.json"] = b"{}"  # a caller's edit stays its own
    hits = len(bundle_memo.hits)
    again_notes: list[str] = []
    again = bundle_memo.build_bundle(config, 2, False, None, "gpt2", notes=again_notes)
    assert len(bundle_memo.hits) == hits + 1  # answered from the memo
    own_notes: list[str] = []
    own = api.build_bundle(config, 2, False, None, "gpt2", notes=own_notes)
    assert again == own and again_notes == first_notes == own_notes
    assert json.loads(again["codegen_meta.json"])["param_plan"]


def test_a_refused_build_is_not_kept() -> None:
    config, _ = read_hf_config(GPT2)
    kept = len(bundle_memo._BUILT)
    for _ in range(2):
        with pytest.raises(UsageError, match="--tp"):
            bundle_memo.build_bundle(config, 0, False, None, "gpt2")
    assert len(bundle_memo._BUILT) == kept
