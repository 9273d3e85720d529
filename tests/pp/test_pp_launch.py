"""``hpcodegen launch`` runs a pipelined artifact: torchrun ranks on a ``pp x dp x tp``
mesh, ``--check-parity --steps 2`` exact against the unsharded model (loss, logits, every
owned gradient, the losses of two AdamW steps) and the p2p ops as frozen; Qwen3-MoE at
pp 2 x tp 2 x ep 2 on 8 ranks too; a checkpoint saved at pp 2 resumes exactly at tp 2 and
back; a world the frozen sizes do not divide is a usage error before any process
starts.

One real launch here: ``--check-parity --steps 2`` of llama4 at pp 2 (with ``--compile``,
the launch ``test_pp_flags.py``'s compile test reads too: ``pp_launching.shared_launch``);
the real ``--save``/``--resume`` through the launcher is ``tests/launch/test_checkpoints.py``'s.
Every other case, the round trip's ``--save`` at pp 2 included, runs launch's rank job on
the session's gloo ranks (``pp_launching.gloo_launch``), all of them once for the module
(``runs``), each test reading its own case."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pp_launching import (
    CONFIGS,
    REAL_PARITY,
    assert_rank_exact,
    generate,
    gloo_launch,
    hpc,
    ok_doc,
    rank_env,
    shared_launch,
)
from pp_launching import generate_pp as _generate


def _pp(out: Path, config: str, tp: int, schedule: str) -> Path:
    return generate(out, config, "--tp", str(tp), "--pp", "2", "--pp-schedule", schedule,
                    "--microbatches", "4")


@pytest.fixture(scope="module")
def runs(gloo, tmp_path_factory) -> dict[str, Any]:
    """Every gloo case of the module, by name (the round trip's legs in order: each reads
    the checkpoint the one before saved). The calls go 8, 2, 4 ranks: the world the module
    before leaves (``test_pp_fsdp_save.py``: 8) is reused, and the one left (4) is the
    next module's (``test_pp_loss_parallel.py``). The artifacts are ``pp_launching``'s
    per-process copies: the llama4 pipeline and tp 2 ones are ``test_pp_fsdp_save.py``'s
    and ``test_pp_flags.py``'s too, generated once."""
    d = tmp_path_factory.mktemp("pp_launch")
    gemma = _pp(d / "gemma", "gemma2_tied4", 2, "Interleaved1F1B")
    llama = _pp(d / "llama", "llama4", 1, "1F1B")
    moe = generate(d / "moe", "qwen3_moe4", "--tp", "2", "--pp", "2", "--ep", "2")
    out: dict[str, Any] = {"moe_art": moe, "moe_verify": hpc("verify", moe)}
    pp = generate(d / "pp", "llama4", "--tp", "1", "--pp", "2", "--microbatches", "2")
    tp = generate(d / "tp", "llama4", "--tp", "2")
    a, b, hf = d / "a", d / "b", d / "hf"
    parity = {"check_parity": True, "steps": 2}
    out |= gloo_launch(gloo, 8, {
        "moe": rank_env(moe, "qwen3_moe4", 8, **parity),
        "fsdp:gemma2_tied4-2-Interleaved1F1B": rank_env(gemma, "gemma2_tied4", 8, **parity)})
    out |= gloo_launch(gloo, 2, {"straight": rank_env(pp, "llama4", 2, steps=4),
                                 "saved": rank_env(pp, "llama4", 2, steps=2, save=a)})
    out |= gloo_launch(gloo, 2, {"third": rank_env(tp, "llama4", 2, steps=1, resume=a,
                                                   save=b)})
    out["exported"] = hpc("export", a, "-o", hf)
    out |= gloo_launch(gloo, 2, {"from_export": rank_env(tp, hf, 2, steps=1),
                                 "back": rank_env(pp, "llama4", 2, steps=1, resume=b)})
    out |= gloo_launch(gloo, 4, {
        "gemma2_tied4-2-Interleaved1F1B": rank_env(gemma, "gemma2_tied4", 4, **parity),
        "fsdp:llama4-1-1F1B": rank_env(llama, "llama4", 4, **parity)})
    return out


def _real(proc) -> dict:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout)


@pytest.mark.timeout(1800)
@pytest.mark.parametrize(("config", "tp", "schedule"), [
    ("llama4", 1, "1F1B"), ("gemma2_tied4", 2, "Interleaved1F1B")])
def test_launch_check_parity_and_steps(tmp_path, runs, config, tp, schedule):
    if config == "llama4":  # the real launch of the feature (stages compiled, too)
        doc = _real(shared_launch(tmp_path, config, tp, schedule, 2 * tp, *REAL_PARITY))
    else:
        doc = ok_doc(runs, f"{config}-{tp}-{schedule}")
    ranks = doc["ranks"]
    assert len(ranks) == 2 * tp
    for rank in ranks:
        assert_rank_exact(rank, 2)
    assert any(r["parity"].get("logits_max_diff") is not None for r in ranks)


def _usage_error(art: Path, nproc: int) -> tuple[int, str]:
    """``launch ART --nproc N --json`` in this process: refused before any process starts."""
    return hpc("launch", art, "--nproc", str(nproc), "--model-dir", CONFIGS / "llama4",
               "--json")


@pytest.mark.timeout(400)
def test_a_pipeline_on_a_world_it_does_not_divide_is_a_usage_error(tmp_path):
    art = _generate(tmp_path, "llama4", 1, "1F1B")
    code, out = _usage_error(art, 3)
    assert code == 2, out
    assert "is not a multiple of the artifact's frozen mesh" in out


@pytest.mark.timeout(1800)
def test_qwen3_moe_pp2_tp2_ep2_on_eight_ranks_is_exact(runs):
    """Qwen3-MoE ``--pp 2 --tp 2 --ep 2`` on a ``pp 2 x dp 2 (ep 2) x tp 2`` mesh: each
    stage's experts are split over the ep ranks carved from its dp ranks, the pipeline's
    p2p runs over pp; loss, logits and every gradient equal the unsharded model's."""
    meta = json.loads((runs["moe_art"] / "codegen_meta.json").read_text())
    assert meta["parallel_dims"]["ep_size"] == 2 and meta["pipeline"]["pp_size"] == 2
    assert runs["moe_verify"][0] == 0, runs["moe_verify"][1]
    doc = ok_doc(runs, "moe")
    assert doc["mesh"] == {"pp": 2, "dp": 2, "tp": 2}
    ranks = doc["ranks"]
    assert len(ranks) == 8
    for rank in ranks:
        parity = rank["parity"]
        assert parity["ep"] == 2, parity
        assert parity["grad_max_diff"] <= 1e-5 and parity["loss_max_diff"] <= 1e-5, parity
        assert not parity["mismatched_params"] and parity["params_compared"] > 0, parity
        assert parity["p2p"]["measured"] == parity["p2p"]["predicted"], parity
        assert len(rank["losses"]) == 2
    last = [r for r in ranks if r["parity"].get("logits_max_diff") is not None]
    assert len(last) == 4 and all(r["parity"]["logits_max_diff"] <= 1e-5 for r in last)


@pytest.mark.timeout(1800)
def test_a_checkpoint_saved_at_pp2_resumes_exactly_at_tp2_and_back(runs):
    """Four steps at pp 2 against two steps at pp 2, saved, and the third
    at tp 2 (no pipeline) from the checkpoint, saved again; that first checkpoint exported
    to HF holds the trained weights (a tp 2 run from the export starts at the third step's
    loss); the tp 2 checkpoint resumed at pp 2 gives the fourth step's loss. One chain of
    runs checks both directions (pp -> tp and tp -> pp); a separate tp 2 run from scratch
    to make the tp 2 checkpoint would check nothing more."""
    straight = ok_doc(runs, "straight")["ranks"][0]["losses"]
    saved = ok_doc(runs, "saved")["ranks"][0]["losses"]
    assert saved == pytest.approx(straight[:2], abs=1e-5)
    third = ok_doc(runs, "third")["ranks"][0]["losses"]
    assert third[0] == pytest.approx(straight[2], abs=1e-5)
    code, text = runs["exported"]  # the pipeline's checkpoint exported to HF
    assert code == 0, text
    exported = ok_doc(runs, "from_export")["ranks"][0]["losses"]
    assert exported[0] == pytest.approx(straight[2], abs=1e-5)
    back = ok_doc(runs, "back")["ranks"][0]["losses"]
    assert back[0] == pytest.approx(straight[3], abs=1e-5)


@pytest.mark.timeout(1800)
@pytest.mark.parametrize(("config", "tp", "schedule"), [
    ("llama4", 1, "1F1B"), ("gemma2_tied4", 2, "Interleaved1F1B")])
def test_fsdp_over_dp_with_pp_is_exact(runs, config, tp, schedule):
    """``pp 2 x dp 2 (x tp)``: each stage FSDP2-sharded over its dp ranks, each dp rank
    its rows of the global batch; the gradients reduced over dp once per step (one
    reduce-scatter per sharded unit, after the last microbatch), summed: the loss, the
    logits of the rank's rows, every gradient (Gemma-2's embedding tied across stages
    too) and two AdamW steps equal the unsharded model's."""
    doc = ok_doc(runs, f"fsdp:{config}-{tp}-{schedule}")
    assert doc["mesh"] == {"pp": 2, "dp": 2, "tp": tp} if tp > 1 else {"pp": 2, "dp": 2}
    for rank in doc["ranks"]:
        parity = rank["parity"]
        assert parity["fsdp_dp"] == 2, parity
        assert parity["grad_max_diff"] <= 1e-5 and parity["loss_max_diff"] <= 1e-5, parity
        assert not parity["mismatched_params"] and parity["params_compared"] > 0, parity
        assert parity["dp_reduce_scatters"] == parity["stage_units"], parity
        assert parity["p2p"]["measured"] == parity["p2p"]["predicted"], parity
        assert len(rank["losses"]) == 2
    assert any(r["parity"].get("logits_max_diff") is not None for r in doc["ranks"])


@pytest.mark.timeout(400)
def test_a_zero_bubble_pipeline_on_a_dp_world_is_a_usage_error(tmp_path):
    art = _generate(tmp_path, "llama4", 1, "ZBVZeroBubble")
    code, out = _usage_error(art, 4)
    assert code == 2, out
    assert "the split backward differentiates the sharded ones" in out
