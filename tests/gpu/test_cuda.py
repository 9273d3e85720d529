"""The GPU lane's tests: they run where CUDA devices are visible and are skipped elsewhere
(``cuda(n)`` marker, tests/conftest.py). ``make gpu`` runs them and ``bench/gpu.py``.

Not yet run on a GPU (bench/README.md says so); written to the same contracts the CPU
tests check on gloo: parity of logits and every gradient with the unsharded model, the
collectives inspect-plan predicts, the memory check's refusal.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "llama_tp2"
LLAMA = ROOT / "examples" / "configs" / "llama"
HUGE = {"hidden_size": 16384, "intermediate_size": 65536, "num_hidden_layers": 4,
        "num_attention_heads": 128, "num_key_value_heads": 8, "head_dim": 128,
        "vocab_size": 256000}


def launch(*args: str | Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hpcodegen", "launch", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)


@pytest.mark.cuda(1)
@pytest.mark.timeout(900)
def test_examples_on_one_gpu_tp1_exact_and_fake_group_step() -> None:
    """bench/gpu.py parts 1 and 2 as assertions: every example at tp 1 equals transformers'
    model on the GPU (bf16), and a fake-group step has the plan's shapes and collectives."""
    code = ("import sys; sys.path.insert(0, 'bench'); import gpu, torch\n"
            "tp1 = gpu.examples_at_tp1('cuda', torch.bfloat16, None)\n"
            "step = gpu.fake_step('cuda', torch.bfloat16, None)\n"
            "print(__import__('json').dumps({'tp1': tp1, 'step': step}))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=850, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout.splitlines()[-1])
    assert [r for r in doc["tp1"] if r[1] not in ("equal", "refused")] == [], doc["tp1"]
    assert [r for r in doc["step"] if r[2] != "ok"] == [], doc["step"]


@pytest.mark.cuda(2)
@pytest.mark.timeout(900)
@pytest.mark.parametrize(("dtype", "tolerance"), [("fp32", 1e-5), ("bf16", 3e-2)])
def test_launch_two_gpus_nccl_parity(dtype: str, tolerance: float) -> None:
    run = launch(EXAMPLE, "--nproc", "2", "--device", "cuda", "--model-dir", LLAMA,
                 "--dtype", dtype, "--check-parity", "--steps", "2", "--json")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    doc = json.loads(run.stdout)
    assert sorted(r["device"] for r in doc["ranks"]) == ["cuda:0", "cuda:1"]
    for rank in doc["ranks"]:
        assert rank["status"] == "ok" and rank["parity"]["mismatched_params"] == []
        assert rank["parity"]["logits_max_diff"] <= tolerance
        assert rank["parity"]["grad_max_diff"] <= tolerance
        assert len(rank["losses"]) == 2


@pytest.mark.cuda(1)
@pytest.mark.timeout(600)
def test_memory_check_refuses_what_the_device_cannot_hold(tmp_path: Path) -> None:
    """A ~23-billion-parameter Llama at tp 1 with parity and a step: several hundred GiB
    of device memory; refused before anything is built, naming the device's free memory."""
    from hpcodegen.generate.api import GenerateArgs, run_generate

    config = json.loads((LLAMA / "config.json").read_text()) | HUGE
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "config.json").write_text(json.dumps(config))
    assert run_generate(GenerateArgs(tmp_path / "cfg", 1, tmp_path / "art", verbosity=-1)) == 0
    run = launch(tmp_path / "art", "--nproc", "1", "--device", "cuda", "--model-dir",
                 tmp_path / "cfg", "--dtype", "bf16", "--check-parity", "--steps", "1",
                 "--json")
    assert run.returncode == 2, run.stdout[-3000:] + run.stderr[-3000:]
    message = json.loads(run.stdout)["message"]
    assert "of device memory at its peak" in message and "free on its device" in message
