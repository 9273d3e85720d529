"""``hpcodegen launch`` runs a pipelined artifact: torchrun ranks on a ``pp x dp x tp``
mesh, ``--check-parity --steps 2`` exact against the unsharded model (loss, logits, every
owned gradient, the losses of two AdamW steps) and the p2p ops as frozen; Qwen3-MoE at
pp 2 x tp 2 x ep 2 on 8 ranks too; a checkpoint saved at pp 2 resumes exactly at tp 2 and
back; a world the frozen sizes do not divide is a usage error before any process
starts."""

from __future__ import annotations

import json
import subprocess

import pytest
from pp_launching import CONFIGS, HPC, assert_rank_exact
from pp_launching import generate_pp as _generate
from pp_launching import launch_json as _launch


@pytest.mark.timeout(900)
@pytest.mark.parametrize(("config", "tp", "schedule"), [
    ("llama4", 1, "1F1B"), ("gemma2_tied4", 2, "Interleaved1F1B")])
def test_launch_check_parity_and_steps(tmp_path, config, tp, schedule):
    art = _generate(tmp_path, config, tp, schedule)
    proc = _launch(art, config, 2 * tp, "--check-parity", "--steps", "2")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    ranks = doc["ranks"]
    assert len(ranks) == 2 * tp
    for rank in ranks:
        assert_rank_exact(rank, 2)
    assert any(r["parity"].get("logits_max_diff") is not None for r in ranks)


@pytest.mark.timeout(400)
def test_a_pipeline_on_a_world_it_does_not_divide_is_a_usage_error(tmp_path):
    art = _generate(tmp_path, "llama4", 1, "1F1B")
    proc = _launch(art, "llama4", 3)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "is not a multiple of the artifact's frozen mesh" in proc.stdout


@pytest.mark.timeout(900)
def test_qwen3_moe_pp2_tp2_ep2_on_eight_ranks_is_exact(tmp_path):
    """Qwen3-MoE ``--pp 2 --tp 2 --ep 2`` on a ``pp 2 x dp 2 (ep 2) x tp 2`` mesh: each
    stage's experts are split over the ep ranks carved from its dp ranks, the pipeline's
    p2p runs over pp; loss, logits and every gradient equal the unsharded model's."""
    out = tmp_path / "moe"
    gen = subprocess.run([*HPC, "generate", "--model", str(CONFIGS / "qwen3_moe4"), "-o",
                          str(out), "--tp", "2", "--pp", "2", "--ep", "2"],
                         capture_output=True, text=True, timeout=300)
    assert gen.returncode == 0, gen.stdout + gen.stderr
    meta = json.loads((out / "codegen_meta.json").read_text())
    assert meta["parallel_dims"]["ep_size"] == 2 and meta["pipeline"]["pp_size"] == 2
    check = subprocess.run([*HPC, "verify", str(out)], capture_output=True, text=True,
                           timeout=300)
    assert check.returncode == 0, check.stdout + check.stderr
    proc = _launch(out, "qwen3_moe4", 8, "--check-parity", "--steps", "2")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
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


def _losses(proc: subprocess.CompletedProcess) -> list[float]:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout)["ranks"][0]["losses"]


@pytest.mark.timeout(900)
def test_a_checkpoint_saved_at_pp2_resumes_exactly_at_tp2_and_back(tmp_path):
    """Four steps at pp 2 against two steps at pp 2, saved, and the third at tp 2 (no
    pipeline) from the checkpoint, saved again; that first checkpoint exported to HF holds
    the trained weights (a tp 2 run from the export starts at the third step's loss); the
    tp 2 checkpoint resumed at pp 2 gives the fourth step's loss. One chain of runs checks
    both directions (pp -> tp and tp -> pp); a separate tp 2 run from scratch to make the
    tp 2 checkpoint would check nothing more."""
    pp = tmp_path / "pp"
    subprocess.run([*HPC, "generate", "--model", str(CONFIGS / "llama4"), "-o", str(pp),
                    "--tp", "1", "--pp", "2", "--microbatches", "2"], check=True,
                   capture_output=True, timeout=300)
    tp = tmp_path / "tp"
    subprocess.run([*HPC, "generate", "--model", str(CONFIGS / "llama4"), "-o", str(tp),
                    "--tp", "2"], check=True, capture_output=True, timeout=300)
    straight = _losses(_launch(pp, "llama4", 2, "--steps", "4"))
    _losses(_launch(pp, "llama4", 2, "--steps", "2", "--save", str(tmp_path / "a")))
    third = _losses(_launch(tp, "llama4", 2, "--steps", "1", "--resume", str(tmp_path / "a"),
                            "--save", str(tmp_path / "b")))
    assert third[0] == pytest.approx(straight[2], abs=1e-5)
    hf = tmp_path / "hf"  # the pipeline's checkpoint exported to HF: the trained weights
    exported = subprocess.run([*HPC, "export", str(tmp_path / "a"), "-o", str(hf)],
                              capture_output=True, text=True, timeout=300)
    assert exported.returncode == 0, exported.stdout + exported.stderr
    proc = subprocess.run([*HPC, "launch", str(tp), "--nproc", "2", "--model-dir", str(hf),
                           "--json", "--steps", "1"], capture_output=True, text=True,
                          timeout=500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert json.loads(proc.stdout)["ranks"][0]["losses"][0] == pytest.approx(straight[2],
                                                                             abs=1e-5)
    back = _losses(_launch(pp, "llama4", 2, "--steps", "1", "--resume", str(tmp_path / "b")))
    assert back[0] == pytest.approx(straight[3], abs=1e-5)


@pytest.mark.timeout(900)
@pytest.mark.parametrize(("config", "tp", "schedule"), [
    ("llama4", 1, "1F1B"), ("gemma2_tied4", 2, "Interleaved1F1B")])
def test_fsdp_over_dp_with_pp_is_exact(tmp_path, config, tp, schedule):
    """``pp 2 x dp 2 (x tp)``: each stage FSDP2-sharded over its dp ranks, each dp rank
    its rows of the global batch; the gradients reduced over dp once per step (one
    reduce-scatter per sharded unit, after the last microbatch), summed: the loss, the
    logits of the rank's rows, every gradient (Gemma-2's embedding tied across stages
    too) and two AdamW steps equal the unsharded model's."""
    art = _generate(tmp_path, config, tp, schedule)
    proc = _launch(art, config, 4 * tp, "--check-parity", "--steps", "2")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
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
    proc = _launch(art, "llama4", 4)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "the split backward differentiates the sharded ones" in proc.stdout
