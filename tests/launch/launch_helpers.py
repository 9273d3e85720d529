"""Helpers for launch tests: run the real CLI (in a fresh process, or in this one for
refusals), the two-node launch, check an artifact before its launch in this process, find
leftover processes.

Imported by module name (tests/ directories are not packages).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from hpcodegen.launch.launcher.procs import alive

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "llama_tp2"
LLAMA_CONFIG = REPO / "examples" / "configs" / "llama"

@dataclass
class CliRun:
    code: int
    stdout: str
    stderr: str

    def json(self) -> dict:
        return json.loads(self.stdout)


def run_cli(*args: str | Path, timeout: float = 300, env: dict | None = None) -> CliRun:
    """``python -m hpcodegen launch ARGS`` as the user would run it."""
    import os

    proc = subprocess.run([sys.executable, "-m", "hpcodegen", "launch", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, cwd=REPO,
                          env={**os.environ, **(env or {})})
    return CliRun(proc.returncode, proc.stdout, proc.stderr)


def run_here(*args: str | Path, env: dict | None = None) -> CliRun:
    """``hpcodegen launch ARGS`` in this process, through the console script's entry point
    (``tests/cli/inproc.py``: its exit code, stdout and stderr as a pipe would give them).

    For requests that start no process (refused before start, or ``--dry-run``), where the
    launcher's own process is not what is checked: a fresh interpreter costs about 0.2 s of
    CPU per run. A test that reads python's import log (torch left unimported) keeps
    :func:`run_cli`: only a fresh process has one."""
    cli = str(Path(__file__).resolve().parents[1] / "cli")
    if cli not in sys.path:
        sys.path.insert(0, cli)
    from inproc import run

    done = run("launch", *args, cwd=REPO, env=env)
    return CliRun(done.returncode, done.stdout, done.stderr)


def hf_sharded_model_dir(out: Path) -> Path:
    """The example llama (seed 11) saved by transformers itself into ``out``: several
    safetensors shards plus their index, as a model downloaded from the Hub is laid out."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(11)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(LLAMA_CONFIG))
    model.save_pretrained(out, max_shard_size="200KB")
    assert (out / "model.safetensors.index.json").is_file()
    assert len(list(out.glob("*.safetensors"))) >= 3
    return out


@dataclass
class TwoNodes:
    """:func:`launch_two_nodes`' inputs and each node's launcher run, node 0 first."""

    source: Path  # the transformers-saved model dir both nodes loaded
    ckpt: Path  # the DCP checkpoint the two nodes' ranks saved together
    runs: list[CliRun]


def launch_two_nodes(base: Path) -> TwoNodes:
    """Two launchers on this host acting as two nodes of one rank each (static rendezvous
    through torchrun), the example at tp 2 loading a transformers-saved sharded model dir
    (:func:`hf_sharded_model_dir`), ``--check-parity --save``: one real launch read by
    ``test_multi_node.py`` (two nodes, one job) and by ``test_checkpoints.py``'s sharded
    load -> save -> export (the weights each rank read, the checkpoint both wrote).

    Why one launch for both: each is a real 2-rank launch of the same artifact with
    compatible flags (about 13 CPU-s each: torchrun agents and ranks importing torch and
    transformers), and saving from two nodes into one directory is what a multi-node job
    does on a shared filesystem. The model check runs here first (:func:`check_in_process`:
    the saved ``config.json`` is transformers' own bytes), so neither launcher starts the
    child (two at once, each importing torch)."""
    source = hf_sharded_model_dir(base / "hf_in")
    check_in_process(EXAMPLE, source)
    ckpt = base / "ckpt"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    nodes = [subprocess.Popen(
        [sys.executable, "-m", "hpcodegen", "launch", str(EXAMPLE), "--nproc", "1",
         "--nnodes", "2", "--node-rank", str(node), "--master-addr", "127.0.0.1",
         "--master-port", port, "--device", "cpu", "--model-dir", str(source),
         "--check-parity", "--save", str(ckpt), "--timeout", "300", "--json",
         "--log-dir", str(base / f"node{node}")],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for node in (0, 1)]
    runs = []
    for proc in nodes:
        out, err = proc.communicate(timeout=300)
        runs.append(CliRun(proc.returncode, out, err))
    return TwoNodes(source, ckpt, runs)


def check_in_process(artifact: Path, model_dir: Path) -> list[dict]:
    """Run launch's pre-start model check (verify ``--only model``, what its child runs) in
    this test process and record the pass in the suite's verdict cache, so the launch of
    ``artifact`` that follows reads the verdict instead of starting the child.

    Why: the child is a fresh process importing torch and transformers (about 7 s of CPU);
    a test that has just generated the artifact in-process has them loaded already. The
    check itself still runs on the exact bytes the launch will read (the verdict is keyed
    by them), so a failing artifact still fails, here. Tests of the child itself
    (``test_model_check_prestart.py``, ``test_check_cache.py``) do not use this. Returns
    the recorded warnings; an AssertionError names the artifact when the check fails.
    """
    import io

    from hpcodegen.artifact.load import resolve_meta_path
    from hpcodegen.launch.launcher.check_cache import (
        cache_dir,
        load_verdict,
        store_verdict,
        verdict_inputs,
    )
    from hpcodegen.verify import run_verify

    config_path = Path(model_dir) / "config.json"
    cache = cache_dir()
    assert cache is not None, "the suite's verdict cache is off: nothing to record"
    inputs = verdict_inputs(resolve_meta_path(artifact), config_path)
    recorded = load_verdict(cache, inputs)
    if recorded is not None:  # these bytes were checked earlier in this run
        return recorded
    out = io.StringIO()
    code = run_verify([artifact], hf_config=config_path, only=("model",), output="json",
                      stdout=out, stderr=out)
    assert code == 0, f"model check of {artifact} failed (exit {code}): {out.getvalue()[-3000:]}"
    warnings = [f for f in json.loads(out.getvalue())["findings"] if f["severity"] != "info"]
    assert store_verdict(cache, inputs, warnings) is not None, cache
    return warnings


def leftover(pid_dir: Path | None, extra: list[int] = (), within: float = 30.0) -> list[int]:
    """Pids still running among ``extra`` and those a test script wrote into ``pid_dir``,
    once they have had ``within`` seconds to go (SIGKILLed processes take a moment to be
    reaped; on a loaded machine, longer). Returns as soon as none is left: the bound only
    keeps a test from hanging, it times nothing."""
    files = list(pid_dir.iterdir()) if pid_dir is not None else []
    pids = [int(p.read_text()) for p in files if p.read_text().strip()]
    deadline = time.monotonic() + within
    while True:
        left = [p for p in [*pids, *extra] if alive(p)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.1)
