"""``generate --pp 2 --cp 2`` and ``launch --nproc 4 --check-parity --steps 2``: a pipeline
over a ``pp x cp`` mesh (pp outermost) is exact against the unsharded model (loss, the
logits gathered over cp in the batch's order, every owned gradient summed over cp, two
AdamW steps' losses) and the frozen boundary says the hidden states cross sequence-sharded
over cp; for both cp layouts (all-gather contiguous, head-tail), and on pp 2 x cp 2 x tp 2
(8 ranks).

The first case is a real launch; the others run launch's rank job on the session's gloo
ranks (``pp_launching.gloo_launch``), once for the module (``runs``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pp_launching import assert_rank_exact, generate, gloo_launch, hpc, ok_doc, rank_env
from pp_launching import launch_json as _launch

CASES = [("llama4", "1F1B", "contiguous", 1), ("qwen3_4", "GPipe", "headtail", 1),
         ("llama4", "1F1B", "headtail", 2)]
REAL = CASES[0]


def _generate(out: Path, config: str, schedule: str, layout: str, tp: int) -> Path:
    return generate(out, config, "--tp", str(tp), "--cp", "2", "--cp-layout", layout, "--pp",
                    "2", "--pp-schedule", schedule, "--microbatches", "2")


@pytest.fixture(scope="module")
def runs(gloo, tmp_path_factory) -> dict[str, Any]:
    """Each case's artifact and verify verdict, and the gloo cases' runs, by case name."""
    d = tmp_path_factory.mktemp("pp_cp_launch")
    out: dict[str, Any] = {}
    for case in CASES:
        name = "-".join(map(str, case))
        art = _generate(d / name, *case)
        out[f"art:{name}"], out[f"verify:{name}"] = art, hpc("verify", art)
        if case != REAL:
            nproc = 4 * case[3]
            out |= gloo_launch(gloo, nproc, {name: rank_env(art, case[0], nproc,
                                                            check_parity=True, steps=2)})
    return out


@pytest.mark.timeout(1800)
@pytest.mark.parametrize(("config", "schedule", "layout", "tp"), CASES)
def test_pp2_cp2_launch_is_exact(runs, config, schedule, layout, tp):
    name = "-".join(map(str, (config, schedule, layout, tp)))
    art = runs[f"art:{name}"]
    meta = json.loads((art / "codegen_meta.json").read_text())
    assert meta["pipeline"]["boundary"]["placements"] == {"cp": "S(1)"}
    code, text = runs[f"verify:{name}"]
    assert code == 0, text[-2000:]
    if (config, schedule, layout, tp) == REAL:
        proc = _launch(art, config, 4 * tp, "--check-parity", "--steps", "2", timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        ranks = json.loads(proc.stdout)["ranks"]
    else:
        ranks = ok_doc(runs, name)["ranks"]
    assert len(ranks) == 4 * tp
    for rank in ranks:
        assert_rank_exact(rank, 2)
    logits = [r["parity"]["logits_max_diff"] for r in ranks
              if r["parity"].get("logits_max_diff") is not None]
    assert len(logits) == 2 * tp and max(logits) <= 1e-5, logits
