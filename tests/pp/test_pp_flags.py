"""``hpcodegen launch`` flags with a pipelined artifact, exact against the unsharded model:
``--max-grad-norm`` clips by the whole model's norm (each stage's owned parameters' norm
over tp and, under FSDP, dp, combined over pp, a tied embedding counted once), so the
clipped gradients, the norm of every step and the losses of the clipped steps equal
torch's on the reference; ``--compile`` runs each stage's layers compiled, exactly."""

from __future__ import annotations

import json

import pytest
from pp_launching import generate_pp as _generate
from pp_launching import launch_json as _launch


@pytest.mark.timeout(900)
@pytest.mark.parametrize(("config", "tp", "dp", "schedule"), [
    ("gemma2_tied4", 1, 1, "1F1B"), ("llama_bias4", 2, 1, "Interleaved1F1B"),
    ("llama4", 1, 2, "1F1B")])  # dp 2: FSDP over each stage's dp ranks
def test_max_grad_norm_with_a_pipeline_is_torchs_clip_on_the_unsharded_model(
        tmp_path, config, tp, dp, schedule):
    art = _generate(tmp_path, config, tp, schedule)
    # a max norm far below the gradients' norm: every step is clipped
    proc = _launch(art, config, 2 * tp * dp, "--check-parity", "--steps", "2",
                   "--max-grad-norm", "0.05")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = json.loads(proc.stdout)["ranks"]
    assert len(ranks) == 2 * tp * dp
    assert all(r["parity"]["fsdp_dp"] == dp for r in ranks)
    for rank in ranks:
        parity = rank["parity"]
        assert parity["grad_max_diff"] <= 1e-5 and parity["loss_max_diff"] <= 1e-5, parity
        assert parity["grad_norm_max_diff"] <= 1e-5, parity
        norms, ref_norms = parity["grad_norms"], parity["ref_grad_norms"]
        assert len(norms) == 3  # the parity step and two training steps
        assert all(n > 0.05 for n in ref_norms), ref_norms  # clipping was active
        for norm, ref in zip(norms, ref_norms, strict=True):
            assert abs(norm - ref) <= 1e-5 * max(1.0, ref), (norms, ref_norms)
        assert len(rank["losses"]) == 2


@pytest.mark.timeout(900)
def test_compile_layers_with_a_pipeline_is_exact_on_two_ranks(tmp_path):
    """``--compile``: each stage's decoder layers compiled; loss, logits, every
    gradient and two AdamW steps equal the unsharded (eager) model's."""
    art = _generate(tmp_path, "llama4", 1, "1F1B")
    proc = _launch(art, "llama4", 2, "--check-parity", "--steps", "2", "--compile")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = json.loads(proc.stdout)["ranks"]
    assert len(ranks) == 2
    for rank in ranks:
        parity = rank["parity"]
        assert parity["grad_max_diff"] <= 1e-5 and parity["loss_max_diff"] <= 1e-5, parity
        assert parity["p2p"]["measured"] == parity["p2p"]["predicted"], parity
        assert parity["compiled_graphs"] > 0, parity  # the stage's layers ran compiled
        assert len(rank["losses"]) == 2
    assert any(r["parity"].get("logits_max_diff") is not None for r in ranks)
