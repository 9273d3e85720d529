"""The existing system's own topology, Qwen3-MoE on ``dp 2 x cp 2 x tp 2`` with ``ep 2``
(carved from dp), sequence parallelism and loss parallelism: 8 ranks, opt-in
(``pytest -m world8``, real launches). The suite's cheaper variant keeps what cp adds to MoE
(experts fed each cp rank's tokens, expert gradients summed over cp and scaled over ep) on
4 ranks, ``dp 2 (ep 2) x cp 2``, under all-gather and under Ulysses: launch's own rank job
(``--check-parity --steps 3``, the environment the launcher gives a rank) on the session's
real gloo ranks (``tests/pp/pp_launching.py``), both artifacts in one call (module fixture
:func:`docs`), each failing under its own name. Launching a cp artifact is
``test_cp_launch.py``'s real launch."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "launch"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pp"))
from launch_helpers import REPO, check_in_process, run_cli
from pp_launching import gloo_launch, ok_doc, rank_env

pytestmark = [pytest.mark.gloo, pytest.mark.slow]
CONFIG = REPO / "tests" / "fixtures" / "configs" / "qwen3_moe"


def _artifact(out: Path, **kwargs) -> Path:
    from artifact_memo import write_artifact

    from hpcodegen.hf import read_hf_config

    config, _ = read_hf_config(CONFIG)
    return write_artifact(out, config, kwargs.pop("tp"), kwargs.pop("sp"), "qwen3_moe",
                          **kwargs)


def _exact(doc: dict, nproc: int, name: str) -> dict:
    """Every rank ok, logits, gradients and losses within 1e-5, 3 losses; names ``name``."""
    assert [r["rank"] for r in doc["ranks"]] == list(range(nproc)), name
    for rank in doc["ranks"]:
        assert rank["status"] == "ok", (name, rank)
        assert rank["parity"]["logits_max_diff"] <= 1e-5, (name, rank["parity"])
        assert rank["parity"]["grad_max_diff"] <= 1e-5, (name, rank["parity"])
        assert rank["parity"]["loss_max_diff"] <= 1e-5, (name, rank["parity"])
        assert len(rank["losses"]) == 3, (name, rank["losses"])
    return doc


def _launch(artifact: Path, nproc: int) -> dict:
    """A real ``launch --check-parity --steps 3`` (the 8-rank opt-in tests)."""
    check_in_process(artifact, CONFIG)  # the launch reads the verdict: no model-check child
    run = run_cli(artifact, "--nproc", str(nproc), "--device", "cpu", "--model-dir", CONFIG,
                  "--check-parity", "--steps", "3", "--json", timeout=500)
    assert run.code == 0, run.stdout + run.stderr
    return _exact(run.json(), nproc, str(artifact))


@pytest.fixture(scope="module")
def docs(tmp_path_factory: pytest.TempPathFactory, gloo) -> dict[str, Any]:
    """Both 4-rank cases, one gloo call: ``{"allgather": doc, "ulysses": doc}`` (and
    ``ulysses_dir``)."""
    root = tmp_path_factory.mktemp("cp_moe")
    arts = {"allgather": _artifact(root / "allgather", tp=1, sp=False, ep=2, cp=2),
            "ulysses": _artifact(root / "ulysses", tp=1, sp=False, ep=2, cp=2,
                                 cp_method="ulysses")}
    out = gloo_launch(gloo, 4, {name: rank_env(art, CONFIG, 4, check_parity=True, steps=3)
                                for name, art in arts.items()})
    return {**out, "ulysses_dir": arts["ulysses"]}


@pytest.mark.timeout(600)
def test_moe_dp2_ep2_cp2(docs) -> None:
    doc = _exact(ok_doc(docs, "allgather"), 4, "allgather")
    assert doc["mesh"] == {"dp": 2, "cp": 2, "tp": 1}


@pytest.mark.timeout(600)
def test_moe_dp2_ep2_cp2_ulysses(docs) -> None:
    """Qwen3-MoE ``--cp 2 --ep 2 --cp-method ulysses`` on 4 ranks: exact."""
    meta = (docs["ulysses_dir"] / "codegen_meta.json").read_text()
    assert "sdpa_hf_ulysses" in meta
    doc = _exact(ok_doc(docs, "ulysses"), 4, "ulysses")
    assert doc["mesh"] == {"dp": 2, "cp": 2, "tp": 1}


@pytest.mark.world8
@pytest.mark.timeout(600)
def test_the_existing_systems_topology_on_eight_ranks(tmp_path) -> None:
    """generate --tp 2 --cp 2 --ep 2 --sp --loss-parallel, launch --nproc 8 --check-parity
    --steps 3: every rank ok, logits and every gradient within 1e-5, losses equal."""
    doc = _launch(_artifact(tmp_path / "qwen3_moe_cp", tp=2, sp=True, ep=2, cp=2,
                            loss_parallel=True), 8)
    assert doc["mesh"] == {"dp": 2, "cp": 2, "tp": 2}


@pytest.mark.world8
@pytest.mark.timeout(600)
def test_the_existing_systems_topology_under_ulysses(tmp_path) -> None:
    """The same topology with ``--cp-method ulysses``: 2 kv heads, 1 per tp rank, each cp
    rank its copy of it: exact."""
    doc = _launch(_artifact(tmp_path / "qwen3_moe_cp", tp=2, sp=True, ep=2, cp=2,
                            loss_parallel=True, cp_method="ulysses"), 8)
    assert doc["mesh"] == {"dp": 2, "cp": 2, "tp": 2}
