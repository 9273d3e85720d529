"""Fixtures of the MoE tests: the example llama config dir, and the MoE artifacts built once
per run (``moe_artifact(model_type, tp, ep=1, sp=False)``, :mod:`artifact_memo`): several
tests check the same artifact (its plan, its collectives, its parity on gloo ranks), and a
generate costs about a second of CPU. ``fake_world`` and ``gloo`` are suite-wide
(tests/conftest.py)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from artifact_memo import generate  # noqa: E402
from moe_configs import write_model_dir  # noqa: E402  (tests/moe on the path first)


@pytest.fixture(scope="session")
def llama_model_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "examples" / "configs" / "llama"


@pytest.fixture(scope="session")
def moe_artifact(tmp_path_factory: pytest.TempPathFactory
                 ) -> Callable[..., tuple[Path, Path]]:
    """``moe_artifact(model_type, tp, ep=1, sp=False)``: ``(artifact dir, model dir)`` of
    ``generate`` run on :func:`moe_configs.config_of`'s tiny config, both fresh directories
    each call; the build is paid once per run (:func:`artifact_memo.generate`)."""
    def make(model_type: str, tp: int, ep: int = 1, sp: bool = False) -> tuple[Path, Path]:
        root = tmp_path_factory.mktemp("moe_artifacts")
        model = write_model_dir(root / "models" / model_type, model_type)
        out = generate(model, root / f"{model_type}_tp{tp}_ep{ep}{'_sp' if sp else ''}", tp,
                       sp, ep=ep)
        return out, model
    return make
