"""``hpcodegen launch`` of a cp artifact on real gloo ranks: parity and training steps at
cp 2 x tp 2 with sequence parallelism, a checkpoint saved there resumed exactly at tp 4
and at cp 1 (the sequence is not in a checkpoint: parameters are replicated over cp)."""

from __future__ import annotations

import json
import sys
from functools import cache
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "launch"))
from launch_helpers import LLAMA_CONFIG, REPO, check_in_process, run_cli

pytestmark = [pytest.mark.gloo, pytest.mark.slow]
EXAMPLE = REPO / "examples" / "llama_cp2_tp2_sp"
MAX_NORM = "0.5"


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


def _run(artifact: Path, nproc: int, *extra: str | Path):
    check_in_process(artifact, LLAMA_CONFIG)
    run = run_cli(artifact, "--nproc", str(nproc), "--device", "cpu", "--model-dir",
                  LLAMA_CONFIG, "--max-grad-norm", MAX_NORM, "--check-parity", *extra,
                  "--json", timeout=300)
    assert run.code == 0, run.stdout + run.stderr
    doc = run.json()
    for rank in doc["ranks"]:
        assert rank["status"] == "ok"
        assert rank["parity"]["logits_max_diff"] <= 1e-5
        assert rank["parity"]["grad_max_diff"] <= 1e-5
        assert rank["parity"]["loss_max_diff"] <= 1e-5
        assert rank["parity"]["grad_norm_max_diff"] <= 1e-5
    return doc


@pytest.mark.timeout(600)
def test_cp2_tp2_trains_exactly_and_resumes_at_tp4_and_cp1(tmp_path) -> None:
    ckpt = tmp_path / "ckpt"
    first = _run(EXAMPLE, 4, "--steps", "2", "--save", ckpt)
    assert first["mesh"] == {"dp": 1, "cp": 2, "tp": 2}
    record = json.loads((ckpt / "hpcodegen_checkpoint.json").read_text())
    assert record["mesh"] == {"dp": 1, "cp": 2, "tp": 2} and record["shard_mesh"] == {"tp": 2}
    baseline = _uninterrupted_losses(3, float(MAX_NORM))
    assert first["ranks"][0]["losses"] == pytest.approx(baseline[:2], abs=1e-5)
    for artifact, nproc in ((REPO / "examples" / "llama_tp4", 4),
                            (REPO / "examples" / "llama_tp2_sp", 2)):
        again = _run(artifact, nproc, "--steps", "1", "--resume", ckpt)
        assert abs(again["ranks"][0]["losses"][0] - baseline[2]) <= 1e-5, artifact


def _generate(model_dir: Path, out: Path, **flags) -> Path:
    """generate's own entry in this process (the CLI process boundary is not under test
    here), then launch's model check in this process too (:func:`check_in_process`)."""
    from hpcodegen.generate.api import GenerateArgs, run_generate

    assert run_generate(GenerateArgs(model_dir, flags.pop("tp", 1), out, verbosity=-1,
                                     **flags)) == 0, out
    check_in_process(out, model_dir)
    return out


@pytest.mark.timeout(600)
def test_ulysses_cp2_trains_exactly_and_its_checkpoint_resumes_under_allgather(tmp_path) -> None:
    """``generate --tp 1 --cp 2 --cp-method ulysses`` then ``launch --nproc 2
    --check-parity --steps 2 --save``: exact; the checkpoint holds no trace of the method:
    the all-gather example (cp 2 x tp 2, sp) resumes it, and the next loss is the
    uninterrupted run's."""
    artifact = _generate(LLAMA_CONFIG, tmp_path / "llama_ulysses", cp=2, cp_method="ulysses")
    meta = json.loads((artifact / "codegen_meta.json").read_text())
    assert {r["inner_wrapper"]["_target_"] for r in meta["injections"]
            if "inner_wrapper" in r} == {"sdpa_hf_ulysses"}
    ckpt = tmp_path / "ckpt"
    first = _run(artifact, 2, "--steps", "2", "--save", ckpt)
    assert first["mesh"] == {"dp": 1, "cp": 2, "tp": 1}
    baseline = _uninterrupted_losses(3, float(MAX_NORM))
    assert first["ranks"][0]["losses"] == pytest.approx(baseline[:2], abs=1e-5)
    again = _run(EXAMPLE, 4, "--steps", "1", "--resume", ckpt)
    assert abs(again["ranks"][0]["losses"][0] - baseline[2]) <= 1e-5


@pytest.mark.timeout(600)
@pytest.mark.parametrize("config", ["mistral_swa", "gemma2_softcap"])
def test_ulysses_launch_parity_with_a_window_and_softcapping(config: str, tmp_path) -> None:
    """``generate --tp 1 --cp 2 --cp-method ulysses`` then ``launch --nproc 2
    --check-parity --steps 2`` on a sliding window of 3 (shorter than a rank's chunk of
    the smoke batch) and on Gemma 2's attention softcapping (eager kernel): exact."""
    model_dir = REPO / "tests" / "fixtures" / "cp" / config
    out = _generate(model_dir, tmp_path / config, cp=2, cp_method="ulysses")
    launched = run_cli(out, "--nproc", "2", "--device", "cpu", "--model-dir", model_dir,
                       "--check-parity", "--steps", "2", "--json", timeout=300)
    assert launched.code == 0, launched.stdout + launched.stderr
    doc = launched.json()
    assert doc["mesh"] == {"dp": 1, "cp": 2, "tp": 1}
    for rank in doc["ranks"]:
        assert rank["status"] == "ok"
        assert rank["parity"]["logits_max_diff"] <= 1e-5
        assert rank["parity"]["grad_max_diff"] <= 1e-5
        assert rank["parity"]["loss_max_diff"] <= 1e-5


@pytest.mark.world8
@pytest.mark.timeout(600)
def test_hybrid_on_two_cp_groups(tmp_path) -> None:
    """``--cp 4 --cp-method hybrid --ulysses 2`` launched on 8 ranks: dp 2 x cp 4, so two
    cp groups each make their own Ulysses and all-gather sub-groups: exact."""
    model_dir = REPO / "tests" / "fixtures" / "cp" / "llama_gqa"
    out = _generate(model_dir, tmp_path / "hybrid", cp=4, cp_method="hybrid", ulysses=2)
    launched = run_cli(out, "--nproc", "8", "--device", "cpu", "--model-dir", model_dir,
                       "--check-parity", "--steps", "2", "--json", timeout=500)
    assert launched.code == 0, launched.stdout + launched.stderr
    doc = launched.json()
    assert doc["mesh"] == {"dp": 2, "cp": 4, "tp": 1}
    for rank in doc["ranks"]:
        assert rank["status"] == "ok"
        assert rank["parity"]["logits_max_diff"] <= 1e-5
        assert rank["parity"]["grad_max_diff"] <= 1e-5
