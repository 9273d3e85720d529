"""Requests refused before any process starts: exit 2, one clear message, nothing created.

The refusals run through the console script's entry point in this process (``run_here``:
the same exit codes and messages, no fresh interpreter per refusal); the two whose point is
that the launcher imported neither torch nor transformers read python's import log of a real
process (``run_cli``).
"""

from __future__ import annotations

import os
import re
import shutil

from launch_helpers import EXAMPLE, LLAMA_CONFIG, run_cli, run_here

from hpcodegen.launch.launcher.check_cache import CACHE_ENV


def test_impossible_world_size(tmp_path):
    logs = tmp_path / "logs"
    run = run_cli(EXAMPLE, "--nproc", "3", "--device", "cpu", "--model-dir", LLAMA_CONFIG,
                  "--log-dir", logs, "--check-parity", env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert run.code == 2
    assert "world size 3 is not a multiple" in run.stderr
    assert "tp=2" in run.stderr and "--nproc 2" in run.stderr
    assert "Traceback" not in run.stderr
    assert not logs.exists(), "no process may start (torchrun would create the log dir)"
    # nothing imported torch (python's own import log, not a clock), nothing ran
    assert not re.search(r"\|\s+(torch|transformers)(\.|$)", run.stderr, re.M)
    assert "import time:" in run.stderr  # the log is there to read


def test_missing_artifact_and_config(tmp_path):
    run = run_here(tmp_path / "nope", "--device", "cpu")
    assert run.code == 2 and "no such artifact" in run.stderr
    run = run_here(EXAMPLE, "--nproc", "2", "--device", "cpu")  # no config.json in the artifact
    assert run.code == 2 and "no HF config found" in run.stderr
    # the message names the flag that supplies the config
    assert "--model-dir" in run.stderr and "Traceback" not in run.stderr
    # an explicit --model-dir without a config names that directory, not the flag's absence
    run = run_here(EXAMPLE, "--nproc", "2", "--device", "cpu", "--model-dir", tmp_path)
    assert run.code == 2 and str(tmp_path) in run.stderr
    assert "no --model-dir was given" not in run.stderr


def test_bad_options():
    run = run_here(EXAMPLE, "--nproc", "2", "--device", "cpu", "--nnodes", "x")
    assert run.code == 2 and "--nnodes" in run.stderr
    run = run_here(EXAMPLE, "--nproc", "2", "--device", "cpu", "--timeout", "0")
    assert run.code == 2 and "--timeout" in run.stderr


def test_drifted_artifact_is_refused_before_start(tmp_path):
    """A modeling file edited after generation: the runtime's checks refuse it, once, here."""
    art = tmp_path / "llama_tp2"
    shutil.copytree(EXAMPLE, art)
    modeling = next(art.glob("modeling_*_gen_npu.py"))
    modeling.write_text(modeling.read_text() + "\n# edited by hand\n")
    logs = tmp_path / "logs"
    run = run_here(art, "--nproc", "2", "--device", "cpu", "--model-dir", LLAMA_CONFIG,
                  "--log-dir", logs)
    assert run.code == 1
    assert "outputs" in run.stderr and modeling.name in run.stderr
    assert not logs.exists()


def test_config_of_another_model_is_refused(tmp_path):
    qwen = LLAMA_CONFIG.parent / "qwen3"
    run = run_here(EXAMPLE, "--nproc", "2", "--device", "cpu", "--model-dir", qwen, "--dry-run")
    assert run.code == 1
    assert "artifact made for LlamaForCausalLM, config is Qwen3ForCausalLM" in run.stderr


def test_bad_tolerance_and_log_dir_file(tmp_path):
    """A negative or NaN tolerance, and a --log-dir that is a file: exit 2, no traceback."""
    afile = tmp_path / "afile"
    afile.write_text("x")
    run = run_here(EXAMPLE, "--nproc", "2", "--device", "cpu", "--model-dir", LLAMA_CONFIG,
                  "--tolerance", "nan", "--log-dir", afile)
    assert run.code == 2, run.stderr
    assert "--tolerance nan" in run.stderr
    assert f"--log-dir: {afile} exists and is not a directory" in run.stderr
    assert "Traceback" not in run.stderr


def test_log_dir_that_cannot_be_created(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    logs = "/proc/hpcodegen-nope" if os.geteuid() == 0 else ro / "logs"  # root writes anywhere
    if os.geteuid() != 0:
        ro.chmod(0o500)
    run = run_cli(EXAMPLE, "--nproc", "2", "--device", "cpu", "--model-dir", LLAMA_CONFIG,
                  "--log-dir", logs, "--json",
                  env={"PYTHONPROFILEIMPORTTIME": "1", CACHE_ENV: str(tmp_path / "verdicts")})
    assert run.code == 2 and "--log-dir: cannot create" in run.stderr
    assert run.json()["findings"][0]["code"] == "launch.log_dir"
    assert "Traceback" not in run.stderr
    # refused with the other options, before the model check (its child would have recorded
    # its pass in this fresh verdict cache) and torchrun, without importing torch (python's
    # own import log, not a clock)
    verdicts = tmp_path / "verdicts"
    assert not verdicts.exists() or not any(verdicts.iterdir()), list(verdicts.iterdir())
    assert not re.search(r"\|\s+(torch|transformers)(\.|$)", run.stderr, re.M)
    assert "import time:" in run.stderr  # the log is there to read


def test_json_refusal_is_one_json_document(tmp_path):
    """--json: a refused request still prints the documented JSON (and only it) on stdout."""
    run = run_here(EXAMPLE, "--nproc", "3", "--device", "cpu", "--model-dir", LLAMA_CONFIG,
                  "--dry-run", "--json")
    assert run.code == 2
    doc = run.json()
    assert doc["status"] == "error" and doc["exit_code"] == 2
    assert doc["findings"][0]["code"] == "launch.world_size"
    assert "world size 3" in doc["message"]


def test_node_rank_and_master_port_out_of_range() -> None:
    """torchrun would fail late (or hang waiting for node 5 of 2): refuse them up front."""
    import pytest

    from hpcodegen.errors import UsageError
    from hpcodegen.launch.launcher.options import LaunchOptions

    for kw, needle in (({"node_rank": -1}, "--node-rank -1 (expected 0 .. 0"),
                       ({"node_rank": 2, "nnodes": "2"}, "--node-rank 2 (expected 0 .. 1"),
                       ({"node_rank": 3, "nnodes": "1:3"}, "--node-rank 3 (expected 0 .. 2"),
                       ({"master_port": 99999}, "--master-port 99999 (expected 1 .. 65535)")):
        with pytest.raises(UsageError) as info:
            LaunchOptions(artifact=EXAMPLE, nproc=2, **kw).check()
        assert needle in str(info.value)
    LaunchOptions(artifact=EXAMPLE, nproc=2, nnodes="2", node_rank=1, master_port=29500).check()
