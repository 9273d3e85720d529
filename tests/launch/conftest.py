"""Fixtures for launch tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from launch_helpers import TINY_META


@pytest.fixture
def tiny_artifact(tmp_path: Path) -> Path:
    """A tp=2 artifact meta with no plan: enough for user scripts that do not parallelize."""
    art = tmp_path / "art"
    art.mkdir()
    (art / "codegen_meta.json").write_text(json.dumps(TINY_META))
    return art
