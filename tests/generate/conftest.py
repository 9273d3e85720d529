"""Shared fixtures for generate tests: the repo paths and tiny config dirs built once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "examples" / "configs"


def write_config(dir_: Path, base: str, **changes: object) -> Path:
    """A model dir holding the ``base`` example config with ``changes`` applied."""
    config = json.loads((CONFIGS / base / "config.json").read_text())
    config.update(changes)
    dir_.mkdir(parents=True, exist_ok=True)
    (dir_ / "config.json").write_text(json.dumps(config))
    return dir_


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def llama_dir() -> Path:
    return CONFIGS / "llama"


@pytest.fixture(scope="session")
def make_config():
    """:func:`write_config` as a fixture (test dirs are not packages)."""
    return write_config
