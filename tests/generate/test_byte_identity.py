"""Every file generate writes for the examples and a sample of families is byte-identical to
its golden digest (tests/fixtures/golden/bundle_digests.json).

The guard of the generate redesign (issue 33): code moves, bytes do not. An intended change
of generate's output refreshes the digests with ``python tools/bundle_digests.py --write``
(docs/testing.md) and says so in its commit.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

TOOL = Path(__file__).resolve().parents[2] / "tools" / "bundle_digests.py"


def _tool():
    spec = importlib.util.spec_from_file_location("bundle_digests", TOOL)
    module = importlib.util.module_from_spec(spec)
    sys.modules["bundle_digests"] = module
    spec.loader.exec_module(module)
    return module


def test_examples_and_sampled_families_regenerate_byte_identical() -> None:
    tool = _tool()
    golden = json.loads(tool.GOLDEN.read_text())
    assert tool.drift(golden, tool.bundle_digests()) == []


def test_drift_names_each_changed_missing_and_new_file() -> None:
    drift = _tool().drift
    golden = {"a": {"x": "1", "y": "2"}, "gone": {"z": "3"}}
    now = {"a": {"x": "1", "y": "9", "w": "4"}, "new": {}}
    assert drift(golden, now) == [
        "a/w: golden absent, now 4",
        "a/y: golden 2, now 9",
        "gone: in the golden digests, not generated any more",
        "new: generated, not in the golden digests",
    ]
