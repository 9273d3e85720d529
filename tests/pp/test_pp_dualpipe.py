"""DualPipeV end to end: ``generate --pp 2 --pp-schedule DualPipeV`` freezes torch 2.13's
order (its overlapped ``F B`` pairs as their two halves, whole and split backwards mixed),
verify passes it, and ``launch --nproc 2 --check-parity --steps 2`` is exact against the
unsharded model (loss, logits, every gradient, two AdamW steps' losses, the p2p ops as
frozen) for a dense family and for the family with embeddings tied to the head, whose two
copies land on the V's first and last stage, both on rank 0.

Both run launch's rank job on the session's gloo ranks (``pp_launching.gloo_launch``, one
call; the real launch of a pipeline is ``test_pp_launch.py``'s)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pp_launching import (
    assert_rank_exact,
    generate,
    gloo_launch,
    hpc,
    ok_doc,
    rank_env,
)

CASES = [("llama4", 4), ("gemma2_tied4", 5)]


@pytest.fixture(scope="module")
def runs(gloo, tmp_path_factory) -> dict[str, Any]:
    """Each case's artifact, verify verdict and run, by config."""
    d = tmp_path_factory.mktemp("pp_dualpipe")
    out: dict[str, Any] = {}
    cases: dict[str, dict[str, str]] = {}
    for config, microbatches in CASES:
        art = generate(d / f"{config}_dualpipev_m{microbatches}", config, "--tp", "1", "--pp",
                       "2", "--pp-schedule", "DualPipeV", "--microbatches", str(microbatches))
        out[f"art:{config}"], out[f"verify:{config}"] = art, hpc("verify", art)
        cases[config] = rank_env(art, config, 2, check_parity=True, steps=2)
    return out | gloo_launch(gloo, 2, cases)


@pytest.mark.timeout(1800)
@pytest.mark.parametrize(("config", "microbatches"), CASES)
def test_dualpipev_launch_check_parity_and_steps(runs, config, microbatches):
    art = runs[f"art:{config}"]
    pipe = json.loads((art / "codegen_meta.json").read_text())["pipeline"]
    assert pipe["schedule"] == "DualPipeV" and pipe["style"] == "v"
    assert [s["rank"] for s in pipe["stages"]] == [0, 1, 1, 0]
    kinds = {a.rstrip("0123456789")[1:] for acts in pipe["actions"].values() for a in acts}
    assert {"F", "B", "I", "W"} <= kinds  # whole and split backwards both run
    code, text = runs[f"verify:{config}"]
    assert code == 0, text

    ranks = ok_doc(runs, config)["ranks"]
    assert len(ranks) == 2
    for rank in ranks:
        assert_rank_exact(rank, 2)
    last = [r for r in ranks if r["parity"].get("logits_max_diff") is not None]
    assert len(last) == 1 and last[0]["parity"]["logits_max_diff"] <= 1e-5
