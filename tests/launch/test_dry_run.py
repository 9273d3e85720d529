"""``--dry-run`` prints the exact torchrun command and each rank's environment.

The dry runs go through the console script's entry point in this process (``run_here``: a
dry run starts no process); that the launcher imports no torch is checked in a fresh
interpreter (``test_launcher_imports_no_torch_for_cpu``)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from launch_helpers import EXAMPLE, LLAMA_CONFIG, run_here

from hpcodegen.launch.launcher.command import torchrun_argv
from hpcodegen.launch.launcher.options import LaunchOptions


def test_dry_run_prints_command_and_rank_env(tmp_path):
    logs = tmp_path / "logs"
    run = run_here(EXAMPLE, "--nproc", "2", "--device", "cpu", "--model-dir", LLAMA_CONFIG,
                  "--check-parity", "--steps", "3", "--log-dir", logs, "--dry-run")
    assert run.code == 0, run.stderr
    lines = run.stdout.splitlines()
    wrapped = shlex.split(next(line for line in lines
                               if "hpcodegen.launch.launcher.torchrun" in line))
    assert wrapped[1:4] == ["-m", "hpcodegen.launch.launcher.deathsig", "<launcher-pid>"]  # as run
    argv = wrapped[4:]
    assert argv[1:3] == ["-m", "hpcodegen.launch.launcher.torchrun"]
    assert "--standalone" in argv
    assert argv[argv.index("--nproc-per-node") + 1] == "2"
    assert argv[argv.index("--log-dir") + 1] == str(logs)
    assert argv[-2:] == ["-m", "hpcodegen.launch.rank.worker"]
    envs = [dict(kv.split("=", 1) for kv in shlex.split(line))
            for line in lines if line.startswith("RANK=")]
    assert [e["RANK"] for e in envs] == ["0", "1"]
    assert all(e["WORLD_SIZE"] == "2" and e["HPCODEGEN_DEVICE"] == "cpu" for e in envs)
    assert envs[0]["HPCODEGEN_ARTIFACT"] == str(EXAMPLE)
    assert envs[0]["HPCODEGEN_MODEL_DIR"] == str(LLAMA_CONFIG)
    assert (envs[0]["HPCODEGEN_STEPS"], envs[0]["HPCODEGEN_CHECK_PARITY"]) == ("3", "1")
    assert "mesh dp=1 x tp=2" in run.stdout
    assert not logs.exists(), "a dry run must not create anything"


def test_dry_run_json_with_user_script(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('never run')\n")
    run = run_here(EXAMPLE, "--nproc", "4", "--device", "cpu", "--dry-run", "--json",
                  "--", script, "--lr", "0.1")
    assert run.code == 0, run.stderr
    doc = run.json()
    assert (doc["verb"], doc["status"], doc["exit_code"], doc["dry_run"]) == (
        "launch", "ok", 0, True)
    assert doc["exec_argv"][-len(doc["argv"]):] == doc["argv"]
    assert doc["exec_argv"][1:3] == ["-m", "hpcodegen.launch.launcher.deathsig"]
    assert doc["mesh"] == {"dp": 2, "tp": 2}
    assert doc["argv"][-5:] == ["-m", "hpcodegen.launch.rank.worker", str(script), "--lr", "0.1"]
    assert [e["LOCAL_RANK"] for e in doc["rank_env"]] == ["0", "1", "2", "3"]


def test_multi_node_options_pass_through():
    opts = LaunchOptions(artifact=Path("a"), nproc=8, nnodes="2", node_rank=1,
                         rdzv_endpoint="head:29400", rdzv_id="job7")
    argv = torchrun_argv(opts, log_dir=None, tee=False)
    assert "--standalone" not in argv
    joined = " ".join(argv)
    for part in ("--nnodes 2", "--node-rank 1", "--rdzv-backend c10d",
                 "--rdzv-endpoint head:29400", "--rdzv-id job7", "--nproc-per-node 8"):
        assert part in joined
    static = LaunchOptions(artifact=Path("a"), nproc=2, nnodes="2", node_rank=0,
                           master_addr="10.0.0.1", master_port=29500)
    joined = " ".join(torchrun_argv(static, log_dir=None, tee=False))
    assert "--master-addr 10.0.0.1 --master-port 29500" in joined


def test_launcher_imports_no_torch_for_cpu():
    """Every pre-start check is pure: refusals come back in well under a second. With
    ``--device auto`` too, where the installed torch is a build without CUDA or ROCm (this
    machine's): its ``version.py`` says so, and no CUDA device can be there to find."""
    import subprocess
    import sys

    import torch

    if torch.version.cuda or torch.version.hip:
        pytest.skip("a CUDA or ROCm build of torch: --device auto asks torch itself")
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from hpcodegen.launch.launcher.options import LaunchOptions\n"
        "from hpcodegen.launch.launcher.run import run_launch\n"
        "for device in ('cpu', 'auto'):\n"
        f"    opts = LaunchOptions(artifact=Path({str(EXAMPLE)!r}), nproc=2, device=device,\n"
        f"                         model_dir=Path({str(LLAMA_CONFIG)!r}), dry_run=True,\n"
        "                         json=True)\n"
        "    assert run_launch(opts) == 0\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_compile_backend_reaches_every_rank_and_is_checked_before_start():
    """``--compile-backend NAME`` is torch.compile's ``backend`` on every rank (the job's
    ``HPCODEGEN_COMPILE_BACKEND``); a name torch does not resolve here, or the option
    without ``--compile``, is refused before anything starts."""
    base = (EXAMPLE, "--nproc", "2", "--device", "cpu", "--model-dir", LLAMA_CONFIG)
    run = run_here(*base, "--compile", "--compile-backend", "aot_eager", "--dry-run", "--json")
    assert run.code == 0, run.stderr
    envs = run.json()["rank_env"]
    assert [(e["HPCODEGEN_COMPILE"], e["HPCODEGEN_COMPILE_BACKEND"]) for e in envs] == [
        ("layers", "aot_eager")] * 2
    run = run_here(*base, "--compile", "--dry-run", "--json")  # torch's default: not set
    assert run.code == 0 and "HPCODEGEN_COMPILE_BACKEND" not in run.json()["rank_env"][0]
    run = run_here(*base, "--compile", "--compile-backend", "no_such_backend", "--dry-run")
    assert run.code == 2, run.stderr
    assert "torch.compile has no backend 'no_such_backend'" in run.stderr
    assert "aot_eager" in run.stderr and "inductor" in run.stderr  # what it could be
    run = run_here(*base, "--compile-backend", "aot_eager", "--dry-run")
    assert run.code == 2 and "add --compile" in run.stderr, run.stderr
    run = run_here(*base, "--compile", "--compile-backend", "a b;c", "--dry-run")
    assert run.code == 2 and "a torch.compile backend name" in run.stderr, run.stderr


def test_a_rank_reads_the_compile_backend_from_its_environment(monkeypatch):
    """What every rank's compile passes to ``torch.compile`` (the smoke job, a pipeline's
    stages and a user script's ``hpcodegen.launch.setup()`` alike)."""
    from hpcodegen.launch import env

    monkeypatch.delenv(env.COMPILE_BACKEND, raising=False)
    assert env.compile_options() == {}
    monkeypatch.setenv(env.COMPILE_BACKEND, "aot_eager")
    assert env.compile_options() == {"backend": "aot_eager"}
