"""Fixtures of the MoE tests: the example llama config dir, and the MoE artifacts generated
once per session (``moe_artifact(model_type, tp, ep=1, sp=False)``): several tests check the
same artifact (its plan, its collectives, its parity on gloo ranks), and a generate costs
about a second of CPU. ``fake_world`` and ``gloo`` are suite-wide (tests/conftest.py)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from moe_configs import write_model_dir  # noqa: E402  (tests/moe on the path first)


@pytest.fixture(scope="session")
def llama_model_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "examples" / "configs" / "llama"


@pytest.fixture(scope="session")
def moe_artifact(tmp_path_factory: pytest.TempPathFactory
                 ) -> Callable[..., tuple[Path, Path]]:
    """``moe_artifact(model_type, tp, ep=1, sp=False)``: ``(artifact dir, model dir)`` of
    ``generate`` run on :func:`moe_configs.config_of`'s tiny config, cached per session
    (the checks only read the artifact)."""
    from hpcodegen.generate.api import GenerateArgs, generate_artifact

    root = tmp_path_factory.mktemp("moe_artifacts")
    made: dict[tuple, tuple[Path, Path]] = {}

    def make(model_type: str, tp: int, ep: int = 1, sp: bool = False) -> tuple[Path, Path]:
        key = (model_type, tp, ep, sp)
        if key not in made:
            model = root / "models" / model_type
            if not model.exists():
                write_model_dir(model, model_type)
            out = root / f"{model_type}_tp{tp}_ep{ep}{'_sp' if sp else ''}"
            assert generate_artifact(GenerateArgs(model, tp, out, sp=sp, ep=ep)) == 0, key
            made[key] = (out, model)
        return made[key]
    return make
