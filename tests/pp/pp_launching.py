"""What the pipeline launch tests share: the tiny configs, the CLI, a pipelined artifact at
pp 2, a JSON launch, and the verdict of an exact ``--check-parity`` rank."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

CONFIGS = Path(__file__).parent / "configs"
HPC = [sys.executable, "-m", "hpcodegen"]


def generate_pp(tmp_path: Path, config: str, tp: int, schedule: str) -> Path:
    """``generate --pp 2`` of ``configs/<config>`` at ``tp`` with 4 microbatches."""
    out = tmp_path / f"{config}_{schedule}_tp{tp}"
    subprocess.run([*HPC, "generate", "--model", str(CONFIGS / config), "-o", str(out),
                    "--tp", str(tp), "--pp", "2", "--pp-schedule", schedule,
                    "--microbatches", "4"], check=True, capture_output=True, timeout=300)
    return out


def launch_json(art: Path, config: str, nproc: int, *extra: str,
                timeout: int = 500) -> subprocess.CompletedProcess:
    """``launch ART --nproc N --model-dir configs/<config> --json EXTRA...``."""
    return subprocess.run([*HPC, "launch", str(art), "--nproc", str(nproc), "--model-dir",
                           str(CONFIGS / config), "--json", *extra],
                          capture_output=True, text=True, timeout=timeout)


def assert_rank_exact(rank: dict[str, Any], steps: int) -> None:
    """A rank's ``--check-parity --steps`` record: loss and every owned gradient within
    1e-5 of the unsharded model, the p2p ops as frozen, ``steps`` losses."""
    parity = rank["parity"]
    assert parity["grad_max_diff"] <= 1e-5 and parity["loss_max_diff"] <= 1e-5, parity
    assert parity["p2p"]["measured"] == parity["p2p"]["predicted"], parity
    assert parity["params_compared"] > 0
    assert len(rank["losses"]) == steps
