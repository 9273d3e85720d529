"""Fixtures of the context-parallel tests: the cp configs, artifacts built once per run
(``cp_artifact(config, tp=, cp=, sp=, layout=)``: :mod:`artifact_memo`); ``fake_world`` and
``gloo`` are suite-wide (tests/conftest.py)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "runtime"))

from artifact_memo import write_artifact  # noqa: E402
from cp_paths import CONFIGS  # noqa: E402  (tests/cp on the path first)


@pytest.fixture(scope="session")
def cp_artifact(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """``cp_artifact(config, tp=2, cp=2, sp=False, layout=None, loss_parallel=False,
    method="allgather", ulysses=None)``: the artifact generated from
    ``tests/fixtures/cp/<config>`` (or a path), built once per run (:mod:`artifact_memo`),
    written to a fresh directory each call."""
    from hpcodegen.hf import read_hf_config

    def make(config: str | Path, *, tp: int = 2, cp: int = 2, sp: bool = False,
             layout: str | None = None, loss_parallel: bool = False, ep: int = 1,
             method: str = "allgather", ulysses: int | None = None) -> Path:
        source = Path(config) if Path(config).is_dir() else CONFIGS / str(config)
        data, _ = read_hf_config(source)
        name = f"{source.name}_tp{tp}_cp{cp}{'_sp' if sp else ''}_{layout or 'default'}" \
               f"{'_lp' if loss_parallel else ''}_ep{ep}" \
               f"{'' if method == 'allgather' else f'_{method}{ulysses or cp}'}"
        return write_artifact(tmp_path_factory.mktemp("cp_artifacts") / name, data, tp, sp,
                              source.name, ep=ep, loss_parallel=loss_parallel, cp=cp,
                              cp_layout=layout, cp_method=method, ulysses=ulysses)
    return make
