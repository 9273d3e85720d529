"""``hpcodegen launch`` flags with a pipelined artifact, exact against the unsharded model:
``--max-grad-norm`` clips by the whole model's norm (each stage's owned parameters' norm
over tp and, under FSDP, dp, combined over pp, a tied embedding counted once), so the
clipped gradients, the norm of every step and the losses of the clipped steps equal
torch's on the reference; ``--compile`` runs each stage's layers compiled, exactly.

``--compile`` reads the real launch of ``test_pp_launch.py``'s ``--check-parity --steps``
test (``pp_launching.shared_launch``: one torchrun for both); the clip cases, FSDP over
dp 2 included, run launch's rank job on the session's gloo ranks
(``pp_launching.gloo_launch``), once for the module (``clipped``)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pp_launching import REAL_PARITY, generate_pp, gloo_launch, ok_doc, rank_env, shared_launch

CLIP = 0.05  # a max norm far below the gradients' norm: every step is clipped
#: the clip cases, each on ``2 x tp x dp`` gloo ranks (dp 2: FSDP over each stage's dp ranks)
CLIP_CASES = [("gemma2_tied4", 1, 1, "1F1B"), ("llama_bias4", 2, 1, "Interleaved1F1B"),
              ("llama4", 1, 2, "1F1B")]


@pytest.fixture(scope="module")
def clipped(gloo, tmp_path_factory) -> dict[str, Any]:
    """``--check-parity --steps 2 --max-grad-norm CLIP`` of each :data:`CLIP_CASES` case,
    the cases of one world size in one call. The artifacts are ``generate_pp``'s (one
    generate per distinct flags in this process: llama4's is the ``--compile`` launch's too)."""
    d = tmp_path_factory.mktemp("pp_flags")
    by_world: dict[int, dict[str, dict[str, str]]] = {}
    for config, tp, dp, schedule in CLIP_CASES:
        art = generate_pp(d, config, tp, schedule)
        nproc = 2 * tp * dp
        by_world.setdefault(nproc, {})[f"{config}-{tp}-{dp}-{schedule}"] = rank_env(
            art, config, nproc, check_parity=True, steps=2, max_grad_norm=CLIP)
    out: dict[str, Any] = {}
    for nproc, cases in sorted(by_world.items()):
        out |= gloo_launch(gloo, nproc, cases)
    return out


@pytest.mark.timeout(1800)
@pytest.mark.parametrize(("config", "tp", "dp", "schedule"), CLIP_CASES)
def test_max_grad_norm_with_a_pipeline_is_torchs_clip_on_the_unsharded_model(
        clipped, config, tp, dp, schedule):
    ranks = ok_doc(clipped, f"{config}-{tp}-{dp}-{schedule}")["ranks"]
    assert len(ranks) == 2 * tp * dp
    assert all(r["parity"]["fsdp_dp"] == dp for r in ranks)
    for rank in ranks:
        parity = rank["parity"]
        assert parity["grad_max_diff"] <= 1e-5 and parity["loss_max_diff"] <= 1e-5, parity
        assert parity["grad_norm_max_diff"] <= 1e-5, parity
        norms, ref_norms = parity["grad_norms"], parity["ref_grad_norms"]
        assert len(norms) == 3  # the parity step and two training steps
        assert all(n > CLIP for n in ref_norms), ref_norms  # clipping was active
        for norm, ref in zip(norms, ref_norms, strict=True):
            assert abs(norm - ref) <= 1e-5 * max(1.0, ref), (norms, ref_norms)
        assert len(rank["losses"]) == 2


@pytest.mark.timeout(900)
def test_compile_layers_with_a_pipeline_is_exact_on_two_ranks(tmp_path):
    """``--compile`` (``--compile-backend aot_eager``: dynamo and AOTAutograd, no
    inductor codegen; ``pp_launching.REAL_PARITY``): each stage's decoder layers compiled;
    loss, logits, every gradient and two AdamW steps equal the unsharded (eager) model's.
    (The real launch that ``test_pp_launch.py``'s ``--check-parity --steps`` test reads
    too.)"""
    proc = shared_launch(tmp_path, "llama4", 1, "1F1B", 2, *REAL_PARITY)
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
