"""``generate --pp 2 --cp 2`` and ``launch --nproc 4 --check-parity --steps 2``: a pipeline
over a ``pp x cp`` mesh (pp outermost) is exact against the unsharded model (loss, the
logits gathered over cp in the batch's order, every owned gradient summed over cp, two
AdamW steps' losses) and the frozen boundary says the hidden states cross sequence-sharded
over cp; for both cp layouts (all-gather contiguous, head-tail), and on pp 2 x cp 2 x tp 2
(8 ranks).

Each case runs launch's rank job on the session's gloo ranks (``pp_launching.gloo_launch``:
the real launch of a pipeline is ``test_pp_launch.py``'s), the cases of one world size in
one call, once for the module (``runs``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pp_launching import assert_rank_exact, generate, gloo_launch, hpc, ok_doc, rank_env

CASES = [("llama4", "1F1B", "contiguous", 1), ("qwen3_4", "GPipe", "headtail", 1),
         ("llama4", "1F1B", "headtail", 2)]


def _generate(out: Path, config: str, schedule: str, layout: str, tp: int) -> Path:
    return generate(out, config, "--tp", str(tp), "--cp", "2", "--cp-layout", layout, "--pp",
                    "2", "--pp-schedule", schedule, "--microbatches", "2")


@pytest.fixture(scope="module")
def runs(gloo, tmp_path_factory) -> dict[str, Any]:
    """Each case's artifact, verify verdict and run, by case name. The 8-rank world runs
    first, then the 4-rank one, which stays alive beside the next modules' 2-rank world
    (``test_pp_dualpipe.py``, ``test_pp_flags.py``: 2 then 4 ranks): 4 then 8 would close
    the 4-rank world only for ``test_pp_flags.py`` to start it again."""
    d = tmp_path_factory.mktemp("pp_cp_launch")
    out: dict[str, Any] = {}
    by_world: dict[int, dict[str, dict[str, str]]] = {}
    for case in CASES:
        name = "-".join(map(str, case))
        art = _generate(d / name, *case)
        out[f"art:{name}"], out[f"verify:{name}"] = art, hpc("verify", art)
        nproc = 4 * case[3]
        by_world.setdefault(nproc, {})[name] = rank_env(art, case[0], nproc,
                                                        check_parity=True, steps=2)
    for nproc, cases in sorted(by_world.items(), reverse=True):  # 8 first: see above
        out |= gloo_launch(gloo, nproc, cases)
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
    ranks = ok_doc(runs, name)["ranks"]
    assert len(ranks) == 4 * tp
    for rank in ranks:
        assert_rank_exact(rank, 2)
    logits = [r["parity"]["logits_max_diff"] for r in ranks
              if r["parity"].get("logits_max_diff") is not None]
    assert len(logits) == 2 * tp and max(logits) <= 1e-5, logits
