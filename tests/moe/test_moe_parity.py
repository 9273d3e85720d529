"""MoE families against the unsharded model on real gloo ranks: tp 2, tp 2 x ep 2, ep 2.

Logits and every gradient (router, experts, shared experts) within 1e-5, the global gradient
norm (``hpcodegen.checkpoint.clip``) within fp32 rounding and the clipped gradients, and the
losses of a few AdamW steps; several artifacts per spawn to pay the process start-up once.
The 2-rank tests run first, then the 4-rank one: a fresh world's ranks import the model code
again, and the session keeps a 2-rank and a 4-rank world alive side by side
(``tests/conftest.py``, ``KEPT_RANKS``), so each starts once.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))

from moe_workers import parity_cases

pytestmark = pytest.mark.slow
TOL = 1e-5
TP2 = ["qwen3_moe", "qwen2_moe", "mixtral", "deepseek_v3", "gpt_oss", "llama4_text",
       "inkling_text"]
TP2_EP2 = ["qwen3_moe", "mixtral", "deepseek_v3", "gpt_oss"]


def _artifact(moe_artifact, model_type: str, tp: int, ep: int) -> tuple[str, str, str]:
    """The session's artifact (tests/moe/conftest.py; test_moe_sp.py reads qwen3_moe's
    tp 2 x ep 2 one too)."""
    out, model = moe_artifact(model_type, tp, ep=ep)
    return f"{model_type} tp{tp} ep{ep}", str(out), str(model)


def _check(results: dict) -> None:
    for name, r in results.items():
        assert not r["odd"], (name, r["odd"])
        assert r["logits"] <= TOL, (name, r)
        assert r["grad"] <= TOL, (name, r)
        assert r["loss_diff"] <= TOL, (name, r)
        assert r["with_grad"] == r["params"], (name, r)  # router and every expert reached
        ep = int(name.rsplit("ep", 1)[1])  # each rank holds E/ep experts (none split at ep 1)
        assert r["expert_split"] == ([ep] if ep > 1 else []), (name, r)
        # global-norm clipping == torch's on the unsharded model: fp32 rounding only (p=3:
        # torch's own fp32 norm is ~4e-6 from the fp64 one); then the same clipped grads
        assert r["norm_rel_2"] <= 1e-6 and r["norm_rel_inf"] <= 1e-6, (name, r)
        assert r["norm_rel_3"] <= 1e-5 and r["clip_norm_rel"] <= 1e-6, (name, r)
        assert r["clip_grad"] <= TOL * r["clip_coef"], (name, r)


@pytest.mark.timeout(400)
def test_tp2_and_ep2_alone_match_unsharded(moe_artifact, gloo) -> None:
    cases = [(*_artifact(moe_artifact, m, 2, 1), 0) for m in TP2]
    cases.append((*_artifact(moe_artifact, "qwen3_moe", 1, 2), 2))
    results = gloo(2, parity_cases, cases)
    for rank in results:
        _check(rank)
    assert set(results[0]) == {c[0] for c in cases}


@pytest.mark.timeout(400)
def test_biased_experts_ep2_match_unsharded(moe_artifact, gloo) -> None:
    """GPT-OSS: per-expert biases (``gate_up_proj_bias``, ``down_proj_bias``, made non-zero
    by the worker) and the clamped, interleaved gate/up activation, split over ep 2 (each
    bias travels with its expert, so it is added once). Its tp 2 (down_proj_bias applied by
    tp rank 0 only) and tp 2 x ep 2 runs are in this module's other two tests."""
    cases = [(*_artifact(moe_artifact, "gpt_oss", 1, 2), 2)]
    results = gloo(2, parity_cases, cases)
    for rank in results:
        _check(rank)
    assert set(results[0]) == {c[0] for c in cases}


@pytest.mark.timeout(400)
def test_tp2_x_ep2_matches_unsharded_on_4_ranks(moe_artifact, gloo) -> None:
    cases = [(*_artifact(moe_artifact, m, 2, 2), 2) for m in TP2_EP2]
    results = gloo(4, parity_cases, cases)
    for rank in results:
        _check(rank)
