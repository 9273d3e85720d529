"""Checkpoints on real gloo ranks: sharded load -> save -> export reproduces the input bit
for bit; 2 steps at tp2 + 1 resumed at tp4 == 3 uninterrupted steps; clipping by the
global norm matches the unsharded model; bf16 runs; another model's checkpoint is refused
before start.

``--save`` and ``--resume`` at another mesh are real launches (one each, 2 ranks each; the
``--save`` is the session's two-node launch, ``two_nodes``, which ``test_multi_node.py``
reads too); the save that the resume reads, its resume at tp 4, bf16 and the twenty steps
with sequence parallelism run launch's rank job on the session's kept gloo ranks
(``launch_gloo``: the same job and numbers, no torchrun and fresh interpreters per case).
"""

from __future__ import annotations

import json
import re

import pytest
from launch_gloo import gloo_launch, ok_doc, rank_env
from launch_helpers import EXAMPLE, LLAMA_CONFIG, REPO, check_in_process, run_cli, run_here

QWEN3_SP = REPO / "examples" / "qwen3_tp2_sp"
QWEN3_CONFIG = REPO / "examples" / "configs" / "qwen3"


@pytest.fixture(scope="module")
def gloo_runs(gloo) -> dict:
    """This module's rank-job cases on 2 kept gloo ranks, in one call: ``launch --json``'s
    document per case (``ok_doc`` names a failing case)."""
    return gloo_launch(gloo, 2, {
        "bf16": rank_env(EXAMPLE, LLAMA_CONFIG, 2, dtype="bf16", check_parity=True,
                         steps=2),
        "twenty_steps": rank_env(QWEN3_SP, QWEN3_CONFIG, 2, steps=20, check_parity=True),
    })

MAX_NORM = "0.5"  # below the example's gradient norms (~1.4-1.7): clipping is active


def _tensors(directory):
    from safetensors.torch import load_file

    out = {}
    for file in sorted(directory.glob("*.safetensors")):
        out.update(load_file(str(file)))
    return out


@pytest.mark.gloo
@pytest.mark.timeout(400)
def test_sharded_load_save_export_is_bit_exact(two_nodes, tmp_path):
    """The example's 2 ranks load transformers' sharded safetensors, save DCP, and export
    gives back the input bit for bit. The ranks are the session's two-node launch
    (``two_nodes``, :func:`launch_helpers.launch_two_nodes`: a real launch with ``--save``,
    one rank per node, read by ``test_multi_node.py`` too)."""
    import torch
    from transformers import AutoModelForCausalLM

    from hpcodegen.checkpoint.export import export_hf

    source, ckpt, out = two_nodes.source, two_nodes.ckpt, tmp_path / "hf_out"
    for node, run in enumerate(two_nodes.runs):
        assert run.code == 0, (node, run.stdout + run.stderr)
    ranks = [r for run in two_nodes.runs for r in run.json()["ranks"]]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert all(r["weights"].endswith("safetensors file(s)") for r in ranks)
    assert all(r["parity"]["logits_max_diff"] <= 1e-5 for r in ranks)  # shards == full load
    record = json.loads((ckpt / "hpcodegen_checkpoint.json").read_text())
    assert record["step"] == 0 and record["mesh"] == {"dp": 1, "tp": 2}
    assert record["shard_mesh"] == {"tp": 2} and record["dtype"] == "float32"
    assert record["artifact"]["signature"] == json.loads(
        (EXAMPLE / "codegen_meta.json").read_text())["signature"]
    assert record["params"]["model.layers.0.mlp.down_proj.weight"] == {
        "shape": [64, 128], "placements": {"tp": "S(1)"}}
    # export's own entry, in this process: what is checked is its bytes, not its CLI
    assert export_hf(ckpt, out) == out
    want, got = _tensors(source), _tensors(out)
    assert sorted(got) == sorted(want)
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name
    ids = torch.randint(0, 256, (1, 8))
    a = AutoModelForCausalLM.from_pretrained(source)(input_ids=ids).logits
    b = AutoModelForCausalLM.from_pretrained(out)(input_ids=ids).logits
    assert torch.equal(a, b)


def _uninterrupted_losses(steps: int, max_norm: float) -> list[float]:
    """The unsharded model trained in this process as the smoke job trains: same seed,
    same batch, AdamW, torch's own clip_grad_norm_."""
    import torch
    import torch.nn.functional as F

    from hpcodegen.launch.rank.model import build_model, synthetic_batch
    from hpcodegen.launch.rank.smoke import LEARNING_RATE

    built = build_model(LLAMA_CONFIG, EXAMPLE, 0, torch.device("cpu"))
    ids, labels = synthetic_batch(built.hf_config.vocab_size, 2, 0, torch.device("cpu"))
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
    return losses


@pytest.mark.gloo
@pytest.mark.timeout(400)
def test_save_at_tp2_resume_at_tp4_matches_uninterrupted(tmp_path, gloo):
    """Saved on dp=2 x tp=2 (DCP writes each dp replica's chunks once), resumed on tp=4 and
    on dp=1 x tp=2: each resume's step equals the third uninterrupted step.

    The save and the tp 4 resume are launch's rank job on 4 kept gloo ranks, in one call
    (``--save`` through a real launch is ``test_sharded_load_save_export_is_bit_exact``'s).
    ``--resume`` through a real launch reads the same checkpoint at another mesh and world
    size (4 ranks -> 2): 2 ranks, not 4, since what the launch adds to the rank job (the
    launcher's pre-start read of the checkpoint, torchrun, fresh ranks) does not depend on
    the world size, and a 4-rank launch cost about twice the CPU of a 2-rank one."""
    ckpt = tmp_path / "ckpt"
    options = {"max_grad_norm": float(MAX_NORM), "check_parity": True}
    docs = gloo_launch(gloo, 4, {
        "save_dp2_tp2": rank_env(EXAMPLE, LLAMA_CONFIG, 4, steps=2, save=ckpt, **options),
        "resume_tp4": rank_env(REPO / "examples" / "llama_tp4", LLAMA_CONFIG, 4, steps=1,
                               resume=ckpt, **options)})
    first = ok_doc(docs, "save_dp2_tp2")
    assert first["mesh"] == {"dp": 2, "tp": 2}, first["mesh"]
    assert json.loads((ckpt / "hpcodegen_checkpoint.json").read_text())["mesh"] == {
        "dp": 2, "tp": 2}
    at_tp4 = ok_doc(docs, "resume_tp4")
    assert at_tp4["mesh"] == {"dp": 1, "tp": 4}, at_tp4["mesh"]
    check_in_process(EXAMPLE, LLAMA_CONFIG)  # the launch reads the verdict: no check child
    second = run_cli(EXAMPLE, "--nproc", "2", "--device", "cpu", "--model-dir", LLAMA_CONFIG,
                     "--steps", "1", "--max-grad-norm", MAX_NORM, "--check-parity",
                     "--resume", ckpt, "--json", timeout=300)
    assert second.code == 0, second.stdout + second.stderr
    assert second.json()["mesh"] == {"dp": 1, "tp": 2}, second.json()["mesh"]
    baseline = _uninterrupted_losses(3, float(MAX_NORM))
    a = first["ranks"][0]
    assert a["losses"] == pytest.approx(baseline[:2], abs=1e-5)
    for name, b in (("resume_tp4", at_tp4["ranks"][0]),
                    ("launch --resume at dp1 x tp2", second.json()["ranks"][0])):
        assert abs(b["losses"][0] - baseline[2]) <= 1e-5, (name, b["losses"], baseline)
        assert b["weights"] == f"checkpoint {ckpt} (step 2)", name
    for rank in (a, at_tp4["ranks"][0], second.json()["ranks"][0]):
        # clipped by the global norm: the unsharded model's norm, each step
        assert rank["parity"]["grad_norm_max_diff"] <= 1e-5
        assert all(n > float(MAX_NORM) for n in rank["parity"]["grad_norms"])


def test_resume_of_another_model_is_refused_before_start(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    config = json.loads((LLAMA_CONFIG / "config.json").read_text())
    (ckpt / "hpcodegen_checkpoint.json").write_text(json.dumps(
        {"format": "hpcodegen-checkpoint/1", "config": {**config, "hidden_size": 128}}))
    logs = tmp_path / "logs"
    run = run_cli(EXAMPLE, "--nproc", "2", "--device", "cpu", "--model-dir", LLAMA_CONFIG,
                  "--resume", ckpt, "--log-dir", logs, env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert run.code == 2 and "hidden_size 128 vs 64" in run.stderr, run.stderr
    assert not logs.exists()
    # refused from the record alone: DCP's metadata (torch) is never read (python's own
    # import log, not a clock)
    assert not re.search(r"\|\s+(torch|transformers)(\.|$)", run.stderr, re.M)
    assert "import time:" in run.stderr  # the log is there to read
    run = run_here(EXAMPLE, "--nproc", "2", "--device", "cpu", "--model-dir", LLAMA_CONFIG,
                   "--resume", tmp_path)
    assert run.code == 2 and "not an hpcodegen checkpoint" in run.stderr


def test_checkpoint_options_refused(tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    for args, text in ((["--dtype", "fp8"], "--dtype"), (["--max-grad-norm", "0"], "> 0"),
                       (["--save", tmp_path / "full"], "not an empty directory")):
        run = run_here(EXAMPLE, "--nproc", "2", "--device", "cpu", "--model-dir",
                      LLAMA_CONFIG, *args)
        assert run.code == 2 and text in run.stderr, run.stderr


@pytest.mark.gloo
@pytest.mark.timeout(400)
def test_bf16_runs_within_its_tolerance(gloo_runs):
    ranks = ok_doc(gloo_runs, "bf16")["ranks"]
    config = json.loads((LLAMA_CONFIG / "config.json").read_text())
    h, i, v, n = (config[k] for k in ("hidden_size", "intermediate_size", "vocab_size",
                                      "num_hidden_layers"))
    sharded = 2 * v * h + n * (4 * h * h + 3 * h * i)  # embed, head, attention, mlp
    replicated = (2 * n + 1) * h  # norms
    assert all(r["local_param_bytes"] == 2 * (sharded // 2 + replicated) for r in ranks)
    assert ranks[0]["parity"]["tolerance"] == 3e-2


@pytest.mark.gloo
@pytest.mark.timeout(400)
def test_twenty_steps_match_at_every_step(gloo_runs):
    """Qwen3 with sequence parallelism (partial-gradient norms, q/k norms): 20 AdamW steps,
    the sharded and the unsharded losses equal at every step."""
    rank = ok_doc(gloo_runs, "twenty_steps")["ranks"][0]
    assert len(rank["losses"]) == 20
    assert rank["losses"] == pytest.approx(rank["ref_losses"], abs=1e-5)
    assert rank["losses"][-1] < rank["losses"][0] - 1.0  # it trains
    assert rank["parity"]["param_max_diff"] <= 1e-4
