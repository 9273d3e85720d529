"""What the pipeline launch tests share: the tiny configs, the CLI, a pipelined artifact at
pp 2, a JSON launch, and the verdict of an exact ``--check-parity`` rank."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

CONFIGS = Path(__file__).parent / "configs"
HPC = [sys.executable, "-m", "hpcodegen"]


#: artifacts generated in this process, by their generate flags (see :func:`generated`)
_GENERATED: dict[tuple[str, ...], Path] = {}


def generated(tmp_path: Path, name: str, *flags: str) -> Path:
    """``generate FLAGS`` into ``tmp_path/name``: a copy of the one run per distinct flags
    in this process. Generating is deterministic (the copy is byte for byte what a fresh
    run writes), so several tests launching the same artifact pay its generate once, and
    launch's model check passes it once (its verdict cache is keyed by these bytes). Each
    test gets its own copy to write into."""
    if flags not in _GENERATED:  # kept beside the tests' own dirs, in pytest's basetemp
        store = tmp_path.parent / "generated_pp" / str(len(_GENERATED))
        subprocess.run([*HPC, "generate", *flags, "-o", str(store / name)], check=True,
                       capture_output=True, timeout=300)
        _GENERATED[flags] = store / name
    out = tmp_path / name
    shutil.copytree(_GENERATED[flags], out, ignore=shutil.ignore_patterns("__pycache__"))
    return out


def generate_pp(tmp_path: Path, config: str, tp: int, schedule: str) -> Path:
    """``generate --pp 2`` of ``configs/<config>`` at ``tp`` with 4 microbatches."""
    return generated(tmp_path, f"{config}_{schedule}_tp{tp}", "--model", str(CONFIGS / config),
                     "--tp", str(tp), "--pp", "2", "--pp-schedule", schedule,
                     "--microbatches", "4")


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
