"""``generate --pp 2 --tp 2 --loss-parallel``: the last stage takes the loss on its
vocabulary slice of the logits (the head's output stays ``S(-1)`` on tp), with the
pipeline's loss contract; ``launch --nproc 4 --check-parity --steps 2`` is exact against
the unsharded model (loss, the logits gathered over tp, every owned gradient, p2p as
frozen); verify accepts the artifact and inspect-plan lists the loss's all-reduces on the
last stage. A dense family under 1F1B, and Gemma-2 (embedding tied to the head across
stages, soft-capped logits) under Interleaved1F1B with 4 microbatches.

Then pp x cp x sp on 8 ranks (``generate --pp 2 --cp 2 --tp 2 --sp``, with and without
``--loss-parallel``): the boundary sharded over cp and tp, exact, p2p bytes as predicted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pp_launching import (
    CONFIGS,
    assert_rank_exact,
    generate,
    gloo_launch,
    hpc,
    ok_doc,
    rank_env,
)

BATCH, SEQ = 8, 16


def _generate(out: Path, config: str, schedule: str, *extra: str) -> Path:
    return generate(out, config, "--tp", "2", "--pp", "2", "--pp-schedule", schedule,
                    "--microbatches", "4", "--loss-parallel", *extra)


def _exact(ranks: list[dict], nproc: int) -> list[dict]:
    """Every rank's report of ``launch --check-parity --steps 2`` on ``nproc`` ranks, each
    exact (:func:`assert_rank_exact`)."""
    assert len(ranks) == nproc
    for rank in ranks:
        assert_rank_exact(rank, 2)
    return ranks


@pytest.fixture(scope="module")
def lp(gloo, tmp_path_factory) -> dict[str, Any]:
    """The pp 2 x tp 2 loss-parallel artifacts and their verify verdicts, and their launch's
    rank job on 4 of the session's gloo ranks (one call for both), by config."""
    d = tmp_path_factory.mktemp("pp_lp")
    out: dict[str, Any] = {}
    cases: dict[str, dict[str, str]] = {}
    for config, schedule in (("llama4", "1F1B"), ("gemma2_tied4", "Interleaved1F1B")):
        art = _generate(d / config, config, schedule)
        out[f"art:{config}"] = art
        out[f"verify:{config}"] = hpc("verify", art, "--hf-config", CONFIGS / config)
        cases[config] = rank_env(art, config, 4, check_parity=True, steps=2)
    return out | gloo_launch(gloo, 4, cases)


@pytest.mark.timeout(1800)
@pytest.mark.parametrize(("config", "schedule"), [("llama4", "1F1B"),
                                                  ("gemma2_tied4", "Interleaved1F1B")])
def test_pp2_tp2_loss_parallel_is_exact(lp, config, schedule):
    art = lp[f"art:{config}"]
    meta = json.loads((art / "codegen_meta.json").read_text())
    assert meta["parallel_dims"]["loss_parallel"] is True
    assert meta["param_plan"]["lm_head"]["out_dst"] == {"output": {"tp": "S(-1)"}}
    if config == "gemma2_tied4":
        assert meta["pipeline"]["tied_across_stages"], meta["pipeline"]
    code, text = lp[f"verify:{config}"]
    assert code == 0, text[-3000:]

    ranks = _exact(ok_doc(lp, config)["ranks"], 4)
    for rank in ranks:
        assert rank["parity"]["loss_parallel"] is True, rank["parity"]
    logits = [r["parity"]["logits_max_diff"] for r in ranks
              if r["parity"].get("logits_max_diff") is not None]
    assert len(logits) == 2 and max(logits) <= 1e-5, logits  # the last stage's 2 tp ranks


def test_inspect_lists_the_loss_all_reduces_on_the_last_stage(lp):
    code, text = hpc("inspect-plan", lp["art:llama4"], "--json", "--hf-config",
                     CONFIGS / "llama4", "--batch", str(BATCH), "--seq", str(SEQ),
                     "--dtype", "fp32")
    assert code == 0, text[-2000:]
    doc = json.loads(text)
    stages = doc["pipeline"]["stages"]
    assert [s["collectives"] for s in stages[:-1]] == [[]]
    (lp,) = stages[-1]["collectives"]
    assert (lp["kind"], lp["axis"], lp["heads"]) == ("all_reduce", "tp", ["lm_head"])
    # 3 fp32 all-reduces per token of one microbatch (batch/4 x seq), ring factor 2(n-1)/n
    assert lp["bytes_per_microbatch"] == 3 * 1.0 * (BATCH // 4) * SEQ * 4
    # the whole-model figure is the same rule on the whole batch
    assert doc["volume"]["loss_parallel"]["loss_allreduce_bytes"] == \
        4 * lp["bytes_per_microbatch"]


@pytest.mark.timeout(1800)
@pytest.mark.parametrize(("config", "schedule", "layout", "loss_parallel"), [
    # the suite runs the case composing the most; the other is opt-in (-m world8)
    pytest.param("llama4", "1F1B", "headtail", False, marks=pytest.mark.world8),
    ("qwen3_4", "Interleaved1F1B", "contiguous", True)])
def test_pp2_cp2_tp2_sp_is_exact_on_eight_ranks(gloo, tmp_path, config, schedule, layout,
                                                loss_parallel):
    """pp x cp x sp: a stage receives hidden states sharded over cp and over tp (its cp
    shard's sequence, cut again by sequence parallelism), rebuilds its cp batch view for the
    whole cp shard, and the run equals the unsharded model; each send carries
    1/(cp x tp) of a microbatch's hidden states, as inspect-plan predicts. (The rank job
    on the session's gloo ranks, as every case of this module.)"""
    from hpcodegen.launch.rank.model import SEQ_LEN

    art = generate(tmp_path / "art", config, "--tp", "2", "--sp", "--cp", "2", "--cp-layout",
                   layout, "--pp", "2", "--pp-schedule", schedule, "--microbatches", "4",
                   *(["--loss-parallel"] if loss_parallel else []))
    meta = json.loads((art / "codegen_meta.json").read_text())
    assert meta["pipeline"]["boundary"]["placements"] == {"tp": "S(1)", "cp": "S(1)"}
    code, text = hpc("verify", art)
    assert code == 0, text[-2000:]
    code, text = hpc("inspect-plan", art, "--json", "--hf-config", CONFIGS / config,
                     "--batch", "4", "--seq", str(SEQ_LEN), "--dtype", "fp32")
    assert code == 0, text[-2000:]
    predicted = json.loads(text)["pipeline"]["stages"][0][
        "p2p_forward_bytes_per_microbatch"]
    assert predicted == 1 * SEQ_LEN * 64 * 4 // 4  # one row, hidden 64, fp32, / (cp x tp)

    docs = gloo_launch(gloo, 8, {config: rank_env(art, config, 8, check_parity=True,
                                                  steps=2)})
    ranks = _exact(ok_doc(docs, config)["ranks"], 8)
    for rank in ranks:
        p2p = rank["parity"]["p2p"]
        assert p2p["bytes_sent"] == predicted * p2p["measured"]["isend"], p2p
        assert rank["parity"]["loss_parallel"] is loss_parallel
    logits = [r["parity"]["logits_max_diff"] for r in ranks
              if r["parity"].get("logits_max_diff") is not None]
    assert len(logits) == 4 and max(logits) <= 1e-5, logits  # last stage: cp 2 x tp 2
