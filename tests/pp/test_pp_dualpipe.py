"""DualPipeV end to end: ``generate --pp 2 --pp-schedule DualPipeV`` freezes torch 2.13's
order (its overlapped ``F B`` pairs as their two halves, whole and split backwards mixed),
verify passes it, and ``launch --nproc 2 --check-parity --steps 2`` is exact against the
unsharded model (loss, logits, every gradient, two AdamW steps' losses, the p2p ops as
frozen) for a dense family and for the family with embeddings tied to the head, whose two
copies land on the V's first and last stage, both on rank 0."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from pp_launching import CONFIGS, HPC, assert_rank_exact, launch_json


def _generate(tmp_path: Path, config: str, microbatches: int) -> Path:
    out = tmp_path / f"{config}_dualpipev_m{microbatches}"
    proc = subprocess.run([*HPC, "generate", "--model", str(CONFIGS / config), "-o", str(out),
                           "--tp", "1", "--pp", "2", "--pp-schedule", "DualPipeV",
                           "--microbatches", str(microbatches)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


@pytest.mark.timeout(900)
@pytest.mark.parametrize(("config", "microbatches"), [("llama4", 4), ("gemma2_tied4", 5)])
def test_dualpipev_launch_check_parity_and_steps(tmp_path, config, microbatches):
    art = _generate(tmp_path, config, microbatches)
    pipe = json.loads((art / "codegen_meta.json").read_text())["pipeline"]
    assert pipe["schedule"] == "DualPipeV" and pipe["style"] == "v"
    assert [s["rank"] for s in pipe["stages"]] == [0, 1, 1, 0]
    kinds = {a.rstrip("0123456789")[1:] for acts in pipe["actions"].values() for a in acts}
    assert {"F", "B", "I", "W"} <= kinds  # whole and split backwards both run
    check = subprocess.run([*HPC, "verify", str(art)], capture_output=True, text=True,
                           timeout=300)
    assert check.returncode == 0, check.stdout + check.stderr

    proc = launch_json(art, config, 2, "--check-parity", "--steps", "2")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = json.loads(proc.stdout)["ranks"]
    assert len(ranks) == 2
    for rank in ranks:
        assert_rank_exact(rank, 2)
    last = [r for r in ranks if r["parity"].get("logits_max_diff") is not None]
    assert len(last) == 1 and last[0]["parity"]["logits_max_diff"] <= 1e-5
