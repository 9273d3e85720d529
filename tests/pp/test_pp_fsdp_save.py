"""``--save``/``--resume`` of a pipeline whose stages run FSDP2 over dp, exact.

A checkpoint saved at ``pp 2 x dp 2`` (each stage's parameters and AdamW state sharded
over its dp ranks, each written by its owners as the DTensor it is) resumes at ``tp 2``
(no pipeline, no FSDP: ``dp 2 x tp 2`` on the same four ranks, each dp rank a replica of
the two-row smoke batch) and gives the third step's loss of an uninterrupted run; that
``tp 2`` checkpoint, saved again, resumes into ``pp 2 x dp 2`` and gives the fourth step's
loss, with parity (loss, logits and every gradient of the resumed pipeline against the
unsharded model resumed from the same checkpoint). The losses of a run are the unsharded
model's at any mesh: the pipeline's four rows (2 microbatches x dp 2) are the two-row smoke
batch repeated, whose mean loss and gradients are the two rows', so one uninterrupted
``tp 2`` run is the reference.

Every run is launch's rank job on the session's gloo ranks (``pp_launching.gloo_launch``),
all once for the module (``runs``): ``--save`` and ``--resume`` through the launcher and
torchrun are ``tests/launch/test_checkpoints.py``'s real launches, and the launcher's
pre-start checks of this module's pipeline checkpoint (its record, the model, DCP's
metadata) run as ``launch --dry-run`` in the test process; the subject here is the
checkpoint of a pipeline with FSDP, whose numbers are the rank job's either way.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from pp_launching import (
    CONFIGS,
    assert_rank_exact,
    generate,
    gloo_launch,
    hpc,
    ok_doc,
    rank_env,
)


def _losses(doc: dict) -> list[float]:
    return doc["ranks"][0]["losses"]


@pytest.fixture(scope="module")
def runs(gloo, tmp_path_factory) -> dict[str, Any]:
    """Every run of the module, by name. The gloo calls go 4, 4, 4, 2, 8 ranks: the worlds
    the modules before leave alive (``test_pp_flags.py``: 2 and 4) are reused, and the one
    left (8) is the next module's first (``test_pp_launch.py``), so no world is started
    twice for nothing (an 8-rank world runs alone); the ``tp 2`` resume runs on the four
    ranks of the pipeline's world (``dp 2 x tp 2``) for that reason."""
    d = tmp_path_factory.mktemp("pp_fsdp_save")
    pp = generate(d / "pp", "llama4", "--tp", "1", "--pp", "2", "--microbatches", "2")
    tp = generate(d / "tp", "llama4", "--tp", "2")
    cp = generate(d / "cp", "llama4", "--tp", "1", "--cp", "2", "--pp", "2",
                  "--microbatches", "2")
    gemma = generate(d / "gemma", "gemma2_tied4", "--tp", "1", "--pp", "2",
                     "--microbatches", "2")
    a, b = d / "a", d / "b"
    out: dict[str, Any] = {"a": a, "b": b}
    out |= gloo_launch(gloo, 4, {"saved": rank_env(pp, "llama4", 4, steps=2, save=a)})
    # the launcher's pre-start checks of the pipeline's FSDP checkpoint (record, model,
    # DCP metadata), in this process: --dry-run starts nothing
    out["prestart"] = hpc("launch", tp, "--nproc", "4", "--device", "cpu", "--model-dir",
                          CONFIGS / "llama4", "--steps", "1", "--resume", a, "--save", b,
                          "--dry-run", "--json")
    out |= gloo_launch(gloo, 4, {"third": rank_env(tp, "llama4", 4, steps=1, resume=a,
                                                   save=b)})
    out |= gloo_launch(gloo, 4, {"back": rank_env(pp, "llama4", 4, steps=1, resume=b,
                                                  check_parity=True)})
    out |= gloo_launch(gloo, 2, {
        "straight": rank_env(tp, "llama4", 2, steps=4),
        "held:llama4": rank_env(pp, "llama4", 2, check_parity=True, steps=1),
        "held:gemma2_tied4": rank_env(gemma, "gemma2_tied4", 2, check_parity=True, steps=1)})
    out |= gloo_launch(gloo, 8, {"cp": rank_env(cp, "llama4", 8, check_parity=True, steps=1)})
    return out


@pytest.mark.timeout(1800)
def test_a_pp2_dp2_fsdp_checkpoint_resumes_exactly_at_tp2_and_back(runs):
    straight = _losses(ok_doc(runs, "straight"))
    saved = ok_doc(runs, "saved")
    assert (saved["mesh"]["pp"], saved["mesh"]["dp"]) == (2, 2)
    assert saved["ranks"][0]["losses"] == pytest.approx(straight[:2], abs=1e-5)
    record = json.loads((runs["a"] / "hpcodegen_checkpoint.json").read_text())
    assert record["step"] == 2
    code, text = runs["prestart"]
    assert code == 0, text[-3000:]
    third = ok_doc(runs, "third")
    assert third["mesh"] == {"dp": 2, "tp": 2}, third["mesh"]
    assert third["ranks"][0]["weights"] == f"checkpoint {runs['a']} (step 2)"
    assert third["ranks"][0]["losses"][0] == pytest.approx(straight[2], abs=1e-5)
    record = json.loads((runs["b"] / "hpcodegen_checkpoint.json").read_text())
    assert (record["step"], record["mesh"]) == (3, {"dp": 2, "tp": 2}), record
    back = ok_doc(runs, "back")
    assert (back["mesh"]["pp"], back["mesh"]["dp"]) == (2, 2)
    for rank in back["ranks"]:
        assert rank["parity"]["fsdp_dp"] == 2
        assert_rank_exact(rank, 1)
        assert rank["losses"][0] == pytest.approx(straight[3], abs=1e-5)


def _param_bytes(config: str) -> tuple[int, int]:
    """The unsharded model's float32 parameter bytes (tied weights once), and the bytes
    of its input embedding when the head is tied to it (else 0)."""
    import transformers

    cfg = transformers.AutoConfig.from_pretrained(CONFIGS / config)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    tied = model.get_input_embeddings().weight.numel() * 4 \
        if model.get_output_embeddings().weight is model.get_input_embeddings().weight else 0
    return sum(p.numel() * 4 for p in model.parameters()), tied


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("config", ["llama4", "gemma2_tied4"])
def test_each_pp_rank_builds_only_its_stages_parameters_and_stays_exact(runs, config):
    """Each pp rank materialises only its stages' parameters (the rest stay on meta): the
    bytes held over the two ranks add up to the whole model (Gemma-2's embedding, tied to
    the head on the other stage, held by both), each rank holds less, and parity is exact
    (the seeded init sliced to the stages is the reference's)."""
    doc = ok_doc(runs, f"held:{config}")
    full, tied = _param_bytes(config)
    held = [rank["local_param_bytes"] for rank in doc["ranks"]]
    for rank in doc["ranks"]:
        assert_rank_exact(rank, 1)
    assert all(0 < h < full for h in held), (held, full)
    assert sum(held) == full + tied, (held, full, tied)


@pytest.mark.timeout(1800)
def test_pp2_cp2_with_fsdp_over_dp2_on_eight_ranks_is_exact(runs):
    """``generate --pp 2 --cp 2`` launched on 8 ranks: a ``pp 2 x dp 2 x cp 2`` mesh, each
    stage FSDP2-sharded over its dp ranks, each dp rank its rows, each cp rank its
    positions of them; the loss, the logits, every gradient (reduce-scattered over dp,
    summed over cp) and an AdamW step equal the unsharded model's."""
    doc = ok_doc(runs, "cp")
    assert (doc["mesh"]["pp"], doc["mesh"]["dp"], doc["mesh"]["cp"]) == (2, 2, 2)
    ranks = doc["ranks"]
    assert len(ranks) == 8
    for rank in ranks:
        parity = rank["parity"]
        assert parity["fsdp_dp"] == 2, parity
        assert parity["dp_reduce_scatters"] == parity["stage_units"], parity
        assert_rank_exact(rank, 1)
    logits = [r["parity"]["logits_max_diff"] for r in ranks
              if r["parity"].get("logits_max_diff") is not None]
    assert len(logits) == 4 and max(logits) <= 1e-5, logits
