"""``hpcodegen launch`` of a cp artifact: parity and training steps at cp 2 x tp 2 with
sequence parallelism, a checkpoint saved there resumed exactly at tp 4 and at cp 1 (the
sequence is not in a checkpoint: parameters are replicated over cp); Ulysses trained,
saved and resumed under all-gather; Ulysses on a sliding window and on softcapping.

One real launch (torchrun, one process per rank, the launcher's report) is what is about
launching a cp artifact: the Ulysses artifact at cp 2 on 2 ranks, ``--max-grad-norm
--check-parity --steps 2 --save`` (the smaller world of the module's save -> resume pairs:
its checkpoint is resumed under all-gather at cp 2 x tp 2 on 4 ranks). Every other case,
the example's own cp 2 x tp 2 save included, runs launch's own rank job with the
environment the launcher gives a rank (``tests/pp/pp_launching.py``: :func:`rank_env`,
:func:`gloo_launch`) on the session's real gloo ranks, against the unsharded model
(``--check-parity``), each case reported and failed under its own name: the same job and
numbers as a launch, without two more fresh rank interpreters. The module fixture
:func:`runs` runs them all once; each test reads its cases."""

from __future__ import annotations

import json
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "launch"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pp"))
from launch_helpers import LLAMA_CONFIG, REPO, check_in_process, run_cli
from pp_launching import gloo_launch, ok_doc, rank_env

pytestmark = [pytest.mark.gloo, pytest.mark.slow, pytest.mark.timeout(900)]
EXAMPLE = REPO / "examples" / "llama_cp2_tp2_sp"
MAX_NORM = 0.5
WINDOWED = ("mistral_swa", "gemma2_softcap")


def _uninterrupted_losses(steps: int, max_norm: float) -> list[float]:
    """The unsharded model trained in this process as the smoke job trains it."""
    return list(_trained(steps, max_norm))


@cache
def _trained(steps: int, max_norm: float) -> tuple[float, ...]:
    """:func:`_uninterrupted_losses`, once per worker: two tests compare with the same
    3 steps."""
    import torch
    import torch.nn.functional as F

    from hpcodegen.launch.rank.model import build_model, synthetic_batch
    from hpcodegen.launch.rank.smoke import LEARNING_RATE

    built = build_model(LLAMA_CONFIG, EXAMPLE, 0, torch.device("cpu"))
    ids, labels = synthetic_batch(built.hf_config.vocab_size, 4, 0, torch.device("cpu"))
    opt = torch.optim.AdamW(built.model.parameters(), lr=LEARNING_RATE)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        logits = built.model(input_ids=ids).logits
        loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(built.model.parameters(), max_norm)
        opt.step()
        losses.append(float(loss.detach()))
    return tuple(losses)


def _generate(model_dir: Path, out: Path, **flags) -> Path:
    """generate's own entry in this process (the CLI process boundary is not under test
    here)."""
    from hpcodegen.generate.api import GenerateArgs, run_generate

    assert run_generate(GenerateArgs(model_dir, flags.pop("tp", 1), out, verbosity=-1,
                                     **flags)) == 0, out
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, gloo) -> dict[str, Any]:
    """Every launch of the module, once: ``held`` (the real launch of the Ulysses artifact,
    its ``CliRun``) and each gloo case's document by name (the shape of ``launch --json``).
    The 4-rank calls come first (the example's save, then the two resumes that read a
    checkpoint: one of that save, one of the real launch's), then the 2-rank ones."""
    root = tmp_path_factory.mktemp("cp_launch")
    saved, held = root / "ckpt_cp2_tp2", root / "ckpt_ulysses"
    ulysses = _generate(LLAMA_CONFIG, root / "llama_ulysses", cp=2, cp_method="ulysses")
    check_in_process(ulysses, LLAMA_CONFIG)  # the launch reads the verdict: no child
    out: dict[str, Any] = {"held": run_cli(
        ulysses, "--nproc", "2", "--device", "cpu", "--model-dir", LLAMA_CONFIG,
        "--max-grad-norm", str(MAX_NORM), "--check-parity", "--steps", "2", "--save", held,
        "--json", timeout=300), "saved_dir": saved, "ulysses_dir": ulysses}
    clipped = {"check_parity": True, "max_grad_norm": MAX_NORM}
    out |= gloo_launch(gloo, 4, {
        "saved": rank_env(EXAMPLE, LLAMA_CONFIG, 4, steps=2, save=saved, **clipped)})
    out |= gloo_launch(gloo, 4, {
        "tp4:resume": rank_env(REPO / "examples" / "llama_tp4", LLAMA_CONFIG, 4, steps=1,
                               resume=saved, **clipped),
        "allgather:resume": rank_env(EXAMPLE, LLAMA_CONFIG, 4, steps=1, resume=held,
                                     **clipped)})
    windowed = {f"window:{config}": rank_env(
        _generate(REPO / "tests" / "fixtures" / "cp" / config, root / config, cp=2,
                  cp_method="ulysses"),
        REPO / "tests" / "fixtures" / "cp" / config, 2, check_parity=True, steps=2)
        for config in WINDOWED}
    out |= gloo_launch(gloo, 2, {
        "cp1:resume": rank_env(REPO / "examples" / "llama_tp2_sp", LLAMA_CONFIG, 2, steps=1,
                               resume=saved, **clipped),
        **windowed})
    return out


def _exact(doc: dict[str, Any], name: str, *, clipped: bool = True) -> dict[str, Any]:
    """Every rank ok and within 1e-5 of the unsharded model (logits, gradients, losses;
    with ``--max-grad-norm`` the global norm too); fails naming the case."""
    for rank in doc["ranks"]:
        assert rank["status"] == "ok", (name, rank)
        parity = rank["parity"]
        assert parity["logits_max_diff"] <= 1e-5, (name, parity)
        assert parity["grad_max_diff"] <= 1e-5, (name, parity)
        assert parity["loss_max_diff"] <= 1e-5, (name, parity)
        if clipped:
            assert parity["grad_norm_max_diff"] <= 1e-5, (name, parity)
    return doc


def test_cp2_tp2_trains_exactly_and_resumes_at_tp4_and_cp1(runs) -> None:
    """The example (cp 2 x tp 2, sp) on 4 ranks, ``--max-grad-norm --check-parity --steps 2
    --save``: exact, its checkpoint recorded at that mesh with parameters sharded over tp
    only; resumed at tp 4 and at cp 1, the next loss is the uninterrupted run's."""
    first = _exact(ok_doc(runs, "saved"), "saved")
    assert first["mesh"] == {"dp": 1, "cp": 2, "tp": 2}
    record = json.loads((runs["saved_dir"] / "hpcodegen_checkpoint.json").read_text())
    assert record["mesh"] == {"dp": 1, "cp": 2, "tp": 2} and record["shard_mesh"] == {"tp": 2}
    baseline = _uninterrupted_losses(3, MAX_NORM)
    assert first["ranks"][0]["losses"] == pytest.approx(baseline[:2], abs=1e-5)
    for name, mesh in (("tp4:resume", {"dp": 1, "tp": 4}),
                       ("cp1:resume", {"dp": 1, "tp": 2})):
        again = _exact(ok_doc(runs, name), name)
        assert again["mesh"] == mesh, name
        assert abs(again["ranks"][0]["losses"][0] - baseline[2]) <= 1e-5, name


def test_ulysses_cp2_trains_exactly_and_its_checkpoint_resumes_under_allgather(runs) -> None:
    """``generate --tp 1 --cp 2 --cp-method ulysses`` then the module's real launch of it on
    2 ranks, ``--max-grad-norm --check-parity --steps 2 --save``: exit 0 and exact; the
    checkpoint holds no trace of the method: the all-gather example (cp 2 x tp 2, sp)
    resumes it, and the next loss is the uninterrupted run's."""
    meta = json.loads((runs["ulysses_dir"] / "codegen_meta.json").read_text())
    assert {r["inner_wrapper"]["_target_"] for r in meta["injections"]
            if "inner_wrapper" in r} == {"sdpa_hf_ulysses"}
    real = runs["held"]
    assert real.code == 0, real.stdout + real.stderr
    first = _exact(real.json(), "held (real launch)")
    assert first["mesh"] == {"dp": 1, "cp": 2, "tp": 1}
    baseline = _uninterrupted_losses(3, MAX_NORM)
    assert first["ranks"][0]["losses"] == pytest.approx(baseline[:2], abs=1e-5)
    again = _exact(ok_doc(runs, "allgather:resume"), "allgather:resume")
    assert again["mesh"] == {"dp": 1, "cp": 2, "tp": 2}
    assert abs(again["ranks"][0]["losses"][0] - baseline[2]) <= 1e-5


@pytest.mark.parametrize("config", WINDOWED)
def test_ulysses_launch_parity_with_a_window_and_softcapping(config: str, runs) -> None:
    """``generate --tp 1 --cp 2 --cp-method ulysses`` then its rank job on 2 ranks,
    ``--check-parity --steps 2``, on a sliding window of 3 (shorter than a rank's chunk of
    the smoke batch) and on Gemma 2's attention softcapping (eager kernel): exact."""
    name = f"window:{config}"
    doc = _exact(ok_doc(runs, name), name, clipped=False)
    assert doc["mesh"] == {"dp": 1, "cp": 2, "tp": 1}
    assert all(len(rank["losses"]) == 2 for rank in doc["ranks"]), name


@pytest.mark.world8
@pytest.mark.timeout(600)
def test_hybrid_on_two_cp_groups(tmp_path) -> None:
    """``--cp 4 --cp-method hybrid --ulysses 2`` launched on 8 ranks: dp 2 x cp 4, so two
    cp groups each make their own Ulysses and all-gather sub-groups: exact."""
    model_dir = REPO / "tests" / "fixtures" / "cp" / "llama_gqa"
    out = _generate(model_dir, tmp_path / "hybrid", cp=4, cp_method="hybrid", ulysses=2)
    check_in_process(out, model_dir)
    launched = run_cli(out, "--nproc", "8", "--device", "cpu", "--model-dir", model_dir,
                       "--check-parity", "--steps", "2", "--json", timeout=500)
    assert launched.code == 0, launched.stdout + launched.stderr
    doc = launched.json()
    assert doc["mesh"] == {"dp": 2, "cp": 4, "tp": 1}
    for rank in doc["ranks"]:
        assert rank["status"] == "ok"
        assert rank["parity"]["logits_max_diff"] <= 1e-5
        assert rank["parity"]["grad_max_diff"] <= 1e-5
