"""``generate --pp 2 --cp 2`` and ``launch --nproc 4 --check-parity --steps 2``: a pipeline
over a ``pp x cp`` mesh (pp outermost) is exact against the unsharded model (loss, the
logits gathered over cp in the batch's order, every owned gradient summed over cp, two
AdamW steps' losses) and the frozen boundary says the hidden states cross sequence-sharded
over cp; for both cp layouts (all-gather contiguous, head-tail), and on pp 2 x cp 2 x tp 2
(8 ranks)."""

from __future__ import annotations

import json
import subprocess

import pytest
from pp_launching import CONFIGS, HPC, assert_rank_exact


@pytest.mark.timeout(900)
@pytest.mark.parametrize(("config", "schedule", "layout", "tp"), [
    ("llama4", "1F1B", "contiguous", 1), ("qwen3_4", "GPipe", "headtail", 1),
    ("llama4", "1F1B", "headtail", 2)])
def test_pp2_cp2_launch_is_exact(tmp_path, config, schedule, layout, tp):
    art = tmp_path / "art"
    gen = subprocess.run([*HPC, "generate", "--model", str(CONFIGS / config), "-o", str(art),
                          "--tp", str(tp), "--cp", "2", "--cp-layout", layout, "--pp", "2",
                          "--pp-schedule", schedule, "--microbatches", "2"],
                         capture_output=True, text=True, timeout=300)
    assert gen.returncode == 0, gen.stdout[-2000:] + gen.stderr[-2000:]
    meta = json.loads((art / "codegen_meta.json").read_text())
    assert meta["pipeline"]["boundary"]["placements"] == {"cp": "S(1)"}
    ver = subprocess.run([*HPC, "verify", str(art)], capture_output=True, text=True,
                         timeout=300)
    assert ver.returncode == 0, ver.stdout[-2000:]
    proc = subprocess.run([*HPC, "launch", str(art), "--nproc", str(4 * tp), "--model-dir",
                           str(CONFIGS / config), "--json", "--check-parity", "--steps", "2"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = json.loads(proc.stdout)["ranks"]
    assert len(ranks) == 4 * tp
    for rank in ranks:
        assert_rank_exact(rank, 2)
    logits = [r["parity"]["logits_max_diff"] for r in ranks
              if r["parity"].get("logits_max_diff") is not None]
    assert len(logits) == 2 * tp and max(logits) <= 1e-5, logits
