"""Fixtures of the MoE tests: the example llama config dir (``fake_world`` is suite-wide,
tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def llama_model_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "examples" / "configs" / "llama"
