"""``--save``/``--resume`` of a pipeline whose stages run FSDP2 over dp, exact.

A checkpoint saved at ``pp 2 x dp 2`` (each stage's parameters and AdamW state sharded
over its dp ranks, each written by its owners as the DTensor it is) resumes at ``tp 2``
(no pipeline, no FSDP) and gives the third step's loss of an uninterrupted run; that
``tp 2`` checkpoint, saved again, resumes into ``pp 2 x dp 2`` and gives the fourth step's
loss, with parity (loss, logits and every gradient of the resumed pipeline against the
unsharded model resumed from the same checkpoint). The losses of a run are the unsharded
model's at any mesh: the pipeline's four rows (2 microbatches x dp 2) are the two-row smoke
batch repeated, whose mean loss and gradients are the two rows', so one uninterrupted
``tp 2`` run is the reference.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from pp_launching import CONFIGS, HPC, assert_rank_exact
from pp_launching import launch_json as _launch


def _generate(out: Path, *flags: str, config: str = "llama4") -> Path:
    gen = subprocess.run([*HPC, "generate", "--model", str(CONFIGS / config), "-o",
                          str(out), *flags], capture_output=True, text=True, timeout=300)
    assert gen.returncode == 0, gen.stdout[-2000:] + gen.stderr[-2000:]
    return out


def _doc(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout)


def _losses(proc: subprocess.CompletedProcess) -> list[float]:
    return _doc(proc)["ranks"][0]["losses"]


@pytest.mark.timeout(1200)
def test_a_pp2_dp2_fsdp_checkpoint_resumes_exactly_at_tp2_and_back(tmp_path):
    pp = _generate(tmp_path / "pp", "--tp", "1", "--pp", "2", "--microbatches", "2")
    tp = _generate(tmp_path / "tp", "--tp", "2")
    straight = _losses(_launch(tp, "llama4", 2, "--steps", "4", timeout=600))
    saved = _doc(_launch(pp, "llama4", 4, "--steps", "2", "--save", str(tmp_path / "a"),
                         timeout=600))
    assert (saved["mesh"]["pp"], saved["mesh"]["dp"]) == (2, 2)
    assert saved["ranks"][0]["losses"] == pytest.approx(straight[:2], abs=1e-5)
    record = json.loads((tmp_path / "a" / "hpcodegen_checkpoint.json").read_text())
    assert record["step"] == 2
    third = _losses(_launch(tp, "llama4", 2, "--steps", "1", "--resume", str(tmp_path / "a"),
                            "--save", str(tmp_path / "b"), timeout=600))
    assert third[0] == pytest.approx(straight[2], abs=1e-5)
    back = _doc(_launch(pp, "llama4", 4, "--steps", "1", "--resume", str(tmp_path / "b"),
                        "--check-parity", timeout=600))
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


@pytest.mark.timeout(900)
@pytest.mark.parametrize("config", ["llama4", "gemma2_tied4"])
def test_each_pp_rank_builds_only_its_stages_parameters_and_stays_exact(tmp_path, config):
    """Each pp rank materialises only its stages' parameters (the rest stay on meta): the
    bytes held over the two ranks add up to the whole model (Gemma-2's embedding, tied to
    the head on the other stage, held by both), each rank holds less, and parity is exact
    (the seeded init sliced to the stages is the reference's)."""
    art = _generate(tmp_path / "pp", "--tp", "1", "--pp", "2", "--microbatches", "2",
                    config=config)
    doc = _doc(_launch(art, config, 2, "--check-parity", "--steps", "1", timeout=600))
    full, tied = _param_bytes(config)
    held = [rank["local_param_bytes"] for rank in doc["ranks"]]
    for rank in doc["ranks"]:
        assert_rank_exact(rank, 1)
    assert all(0 < h < full for h in held), (held, full)
    assert sum(held) == full + tied, (held, full, tied)


@pytest.mark.timeout(1200)
def test_pp2_cp2_with_fsdp_over_dp2_on_eight_ranks_is_exact(tmp_path):
    """``generate --pp 2 --cp 2`` launched on 8 ranks: a ``pp 2 x dp 2 x cp 2`` mesh, each
    stage FSDP2-sharded over its dp ranks, each dp rank its rows, each cp rank its
    positions of them; the loss, the logits, every gradient (reduce-scattered over dp,
    summed over cp) and an AdamW step equal the unsharded model's."""
    art = _generate(tmp_path / "pp", "--tp", "1", "--cp", "2", "--pp", "2",
                    "--microbatches", "2")
    doc = _doc(_launch(art, "llama4", 8, "--check-parity", "--steps", "1", timeout=900))
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
